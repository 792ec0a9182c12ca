package outbox_test

// The hardening tests that run on every database of internal/testenv; the
// one on an SQLite file of its own is in the root's hardening_test.go.

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// messageIDs returns the message ids in table, in id order.
func messageIDs(t *testing.T, db *gorm.DB, table string) []string {
	t.Helper()
	var ids []string
	if err := db.Table(table).Order("id").Pluck("message_id", &ids).Error; err != nil {
		t.Fatalf("read message ids of %s: %v", table, err)
	}
	return ids
}

func distinctCount(s []string) int {
	c := slices.Clone(s)
	slices.Sort(c)
	return len(slices.Compact(c))
}

func TestReusedMessageStructGetsANewMessageIDForEachRecord(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := setup(t, o, outbox.Config{}, nil)
			var m outbox.Message
			m.Topic = "orders"
			// Three records from one struct: autocommit, one transaction,
			// and a copy of the struct.
			for i := range 3 {
				m.Key, m.Value = fmt.Appendf(nil, "k%d", i), []byte("v")
				if err := db.Create(&m).Error; err != nil {
					t.Fatal(err)
				}
			}
			err := db.Transaction(func(tx *gorm.DB) error {
				for i := range 3 {
					m.Key = fmt.Appendf(nil, "t%d", i)
					if err := tx.Create(&m).Error; err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			cp := m
			if err := db.Create(&cp).Error; err != nil {
				t.Fatal(err)
			}
			ids := messageIDs(t, db, outbox.DefaultMessagesTable)
			if len(ids) != 7 || distinctCount(ids) != 7 {
				t.Fatalf("7 creates of one reused struct wrote %d rows with %d distinct message ids; want 7 and 7", len(ids), distinctCount(ids))
			}
		})
	}
}

func TestRetriedTransactionKeepsItsMessageID(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := setup(t, o, outbox.Config{}, nil)
			m := outbox.NewStringMessage("orders", "k", "v")
			attempt := func(fail bool) error {
				return db.Transaction(func(tx *gorm.DB) error {
					if err := tx.Create(m).Error; err != nil {
						return err
					}
					if fail {
						return errors.New("business rule failed")
					}
					return nil
				})
			}
			if err := attempt(true); err == nil {
				t.Fatal("first attempt = nil; want its error")
			}
			first := m.MessageID
			if err := attempt(false); err != nil {
				t.Fatal(err)
			}
			ids := messageIDs(t, db, outbox.DefaultMessagesTable)
			if len(ids) != 1 || ids[0] != first.String() {
				t.Fatalf("after a rolled-back attempt and a retry: rows %v; want one row with the first attempt's id %s", ids, first)
			}
		})
	}
}

// TestRetriedTransactionKeepsTheIDOfEachPositionOfAReusedStruct: one
// Message struct reused for two records in a transaction that rolls back
// (the whole of it, or a nested one to its savepoint): the retry's records
// get the ids of the same positions, so a commit whose answer was lost and
// its retry still deduplicate; after the commit, the struct's next record
// gets a new id.
func TestRetriedTransactionKeepsTheIDOfEachPositionOfAReusedStruct(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := setup(t, o, outbox.Config{}, nil)
			var m outbox.Message
			m.Topic = "orders"
			create := func(tx *gorm.DB, key string) (outbox.UUID, error) {
				m.Key, m.Value = []byte(key), []byte("v")
				err := tx.Create(&m).Error
				return m.MessageID, err
			}
			errRollback := errors.New("rolled back")
			attempt := func(fail bool) (ids [2]outbox.UUID, err error) {
				err = db.Transaction(func(tx *gorm.DB) error {
					for i, key := range []string{"a", "b"} {
						if ids[i], err = create(tx, key); err != nil {
							return err
						}
					}
					if fail {
						return errRollback
					}
					return nil
				})
				return ids, err
			}
			first, err := attempt(true)
			if !errors.Is(err, errRollback) || first[0] == first[1] {
				t.Fatalf("first attempt = %v with ids %v; want the rollback, two ids", err, first)
			}
			retry, err := attempt(false)
			if err != nil || retry != first {
				t.Fatalf("retry = %v with ids %v; want the first attempt's ids %v, position by position", err, retry, first)
			}

			// A nested transaction rolled back to its savepoint, retried.
			var outer, nested [2]outbox.UUID
			err = db.Transaction(func(tx *gorm.DB) error {
				var err error
				if outer[0], err = create(tx, "c"); err != nil {
					return err
				}
				for i := range nested {
					err := tx.Transaction(func(tx *gorm.DB) error {
						var err error
						if nested[i], err = create(tx, "d"); err != nil || i == 0 {
							return cmp.Or(err, errRollback)
						}
						return nil
					})
					if i == 0 && !errors.Is(err, errRollback) || i == 1 && err != nil {
						return fmt.Errorf("nested attempt %d: %w", i, err)
					}
				}
				return nil
			})
			if err != nil || nested[0] != nested[1] || nested[0] == outer[0] || slices.Contains(first[:], outer[0]) {
				t.Fatalf("outer %v, nested attempts %v, err %v; want the nested retry to take the rolled-back nested id, all new to the struct", outer, nested, err)
			}
			want := []string{first[0].String(), first[1].String(), outer[0].String(), nested[1].String()}
			if got := messageIDs(t, db, outbox.DefaultMessagesTable); !slices.Equal(got, want) {
				t.Fatalf("rows %v; want %v", got, want)
			}
		})
	}
}

func TestOneStatementNeverWritesOneMessageIDTwice(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := setup(t, o, outbox.Config{}, nil)
			m := outbox.NewStringMessage("orders", "k", "v")
			err := db.Create(&[]*outbox.Message{m, outbox.NewStringMessage("orders", "x", "y"), m}).Error
			if !errors.Is(err, outbox.ErrInvalidMessage) || !strings.Contains(err.Error(), "message 2") {
				t.Fatalf("Create with one *Message twice = %v; want ErrInvalidMessage naming message 2", err)
			}
			id := outbox.NewUUID()
			a, b := outbox.NewStringMessage("orders", "a", "1"), outbox.NewStringMessage("orders", "b", "2")
			a.MessageID, b.MessageID = id, id
			if err := outbox.Enqueue(db, a, b); !errors.Is(err, outbox.ErrInvalidMessage) {
				t.Fatalf("Enqueue of two messages with one caller-set id = %v; want ErrInvalidMessage", err)
			}
			if n := countRows(t, db, outbox.DefaultMessagesTable); n != 0 {
				t.Fatalf("%d rows written by rejected creates; want 0", n)
			}
		})
	}
}

func TestWithConfigWithoutThePluginWritesToTheScopedTable(t *testing.T) {
	billing := outbox.Config{BucketCount: 64, MessagesTable: "billing_outbox", LeasesTable: "billing_leases", RelaysTable: "billing_relays"}
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil) // no plugin
			for _, cfg := range []outbox.Config{{}, billing} {
				if err := outbox.AutoMigrate(db, cfg); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 20 {
				if err := db.Scopes(outbox.WithConfig(billing)).Create(outbox.NewStringMessage("bills", fmt.Sprint(i), "v")).Error; err != nil {
					t.Fatal(err)
				}
			}
			if n := countRows(t, db, outbox.DefaultMessagesTable); n != 0 {
				t.Fatalf("%d WithConfig rows landed in %s; want 0", n, outbox.DefaultMessagesTable)
			}
			var high int64
			db.Table("billing_outbox").Where("bucket >= 8").Count(&high)
			if n := countRows(t, db, "billing_outbox"); n != 20 || high == 0 {
				t.Fatalf("billing_outbox has %d rows (%d in buckets >= 8); want 20 spread over 64 buckets", n, high)
			}
		})
	}
}

func TestGormReadsUpdatesAndDeletesFollowTheConfiguredTables(t *testing.T) {
	cfg := outbox.Config{MessagesTable: "app_outbox", LeasesTable: "app_leases", RelaysTable: "app_relays"}
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := setup(t, o, cfg, nil) // the default tables do not exist
			m := outbox.NewStringMessage("orders", "k", "v")
			if err := db.Create(m).Error; err != nil {
				t.Fatal(err)
			}
			var n int64
			if err := db.Model(&outbox.Message{}).Count(&n).Error; err != nil || n != 1 {
				t.Fatalf("Model(&Message{}).Count = %d, %v; want 1, nil", n, err)
			}
			var found []outbox.Message
			if err := db.Find(&found).Error; err != nil || len(found) != 1 || found[0].MessageID != m.MessageID {
				t.Fatalf("Find = %d rows, %v; want the created message", len(found), err)
			}
			if res := db.Model(m).Update("topic", "orders.v2"); res.Error != nil || res.RowsAffected != 1 {
				t.Fatalf("Model(&msg).Update = %d rows, %v; want 1, nil", res.RowsAffected, res.Error)
			}
			m.Value = []byte("v2")
			if err := db.Save(m).Error; err != nil {
				t.Fatalf("Save = %v", err)
			}
			// Save again with nothing changed: on MySQL the UPDATE counts no
			// changed row and GORM falls back to an upsert of the same row.
			if err := db.Save(m).Error; err != nil {
				t.Fatalf("second Save = %v", err)
			}
			var got outbox.Message
			if err := db.FirstOrCreate(&got, outbox.Message{ID: m.ID}).Error; err != nil || got.MessageID != m.MessageID {
				t.Fatalf("FirstOrCreate(existing id) = %v, %v; want the existing row", got.MessageID, err)
			}
			ids := messageIDs(t, db, "app_outbox")
			if len(ids) != 1 || ids[0] != m.MessageID.String() {
				t.Fatalf("after Update, two Saves and FirstOrCreate: rows %v; want only %s", ids, m.MessageID)
			}
			var topic string
			db.Table("app_outbox").Select("topic").Scan(&topic)
			if topic != "orders.v2" {
				t.Fatalf("topic after Update = %q; want orders.v2", topic)
			}
			if err := db.Model(&outbox.BucketLease{}).Count(&n).Error; err != nil {
				t.Fatalf("Model(&Lease{}).Count = %v; want the configured leases table", err)
			}
			if err := db.Model(&outbox.RelayHeartbeat{}).Count(&n).Error; err != nil {
				t.Fatalf("Model(&Relay{}).Count = %v; want the configured relays table", err)
			}
			if res := db.Delete(m); res.Error != nil || res.RowsAffected != 1 {
				t.Fatalf("Delete(&msg) = %d rows, %v; want 1, nil", res.RowsAffected, res.Error)
			}
			if n := countRows(t, db, "app_outbox"); n != 0 {
				t.Fatalf("%d rows after Delete; want 0", n)
			}
			// A table named by the caller wins.
			if err := db.Table("no_such_table").Model(&outbox.Message{}).Count(&n).Error; err == nil {
				t.Fatal("Table(no_such_table).Count = nil; want the caller's table used (and missing)")
			}
		})
	}
}

func TestWithConfigRoutesReads(t *testing.T) {
	billing := outbox.Config{BucketCount: 4, MessagesTable: "billing_outbox", LeasesTable: "billing_leases", RelaysTable: "billing_relays"}
	o := testenv.Databases(t)[0]
	db := setup(t, o, outbox.Config{}, nil)
	if err := outbox.AutoMigrate(db, billing); err != nil {
		t.Fatal(err)
	}
	if err := db.Scopes(outbox.WithConfig(billing)).Create(outbox.NewStringMessage("bills", "k", "v")).Error; err != nil {
		t.Fatal(err)
	}
	var n, d int64
	db.Scopes(outbox.WithConfig(billing)).Model(&outbox.Message{}).Count(&n)
	db.Model(&outbox.Message{}).Count(&d)
	if n != 1 || d != 0 {
		t.Fatalf("Count through WithConfig(billing) = %d, through the plugin's default = %d; want 1 and 0", n, d)
	}
}

func TestEnqueueValidatesTheWholeCallBeforeWriting(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := setup(t, o, outbox.Config{}, &gorm.Config{SkipDefaultTransaction: true, CreateBatchSize: 2})
			msgs := []*outbox.Message{
				outbox.NewStringMessage("orders", "a", "1"),
				outbox.NewStringMessage("orders", "b", "2"),
				outbox.NewStringMessage("", "c", "3"),
			}
			err := outbox.Enqueue(db, msgs...)
			if !errors.Is(err, outbox.ErrInvalidMessage) || !strings.Contains(err.Error(), "message 2") {
				t.Fatalf("Enqueue with message 2 invalid = %v; want ErrInvalidMessage naming message 2", err)
			}
			if n := countRows(t, db, outbox.DefaultMessagesTable); n != 0 {
				t.Fatalf("%d rows written before the invalid message; want 0", n)
			}
			if err := outbox.Enqueue(db); err != nil {
				t.Fatalf("Enqueue() = %v; want nil (nothing to write)", err)
			}
			if err := outbox.Enqueue(db, msgs[0], nil); !errors.Is(err, outbox.ErrInvalidMessage) {
				t.Fatalf("Enqueue with a nil message = %v; want ErrInvalidMessage", err)
			}
		})
	}
}

// TestCreateOfOtherShapesIsAnErrorNotAPanic gives the plugin's create
// callbacks every shape GORM accepts with an outbox.Message model.
func TestCreateOfOtherShapesIsAnErrorNotAPanic(t *testing.T) {
	type wrapper struct{ outbox.Message }
	var nilMsg *outbox.Message
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := setup(t, o, outbox.Config{}, nil)
			shapes := map[string]any{
				"map":             map[string]any{"Topic": "orders"},
				"map_pointer":     &map[string]any{"Topic": "orders"},
				"slice_of_maps":   []map[string]any{{"Topic": "orders"}},
				"pointer_to_maps": &[]map[string]any{{"Topic": "orders"}},
				"other_struct":    &order{Amount: 1},
				"wrapper":         &wrapper{Message: outbox.Message{Topic: "orders"}},
				"slice_of_any":    &[]any{&outbox.Message{Topic: "orders"}, &order{}},
				"nil_element":     &[]*outbox.Message{{Topic: "orders"}, nil},
				"nil_pointer":     nilMsg,
			}
			for name, v := range shapes {
				t.Run(name, func(t *testing.T) {
					var err error
					func() {
						defer func() {
							if r := recover(); r != nil {
								t.Fatalf("Model(&Message{}).Create(%T) panicked: %v", v, r)
							}
						}()
						err = db.Model(&outbox.Message{}).Create(v).Error
					}()
					if err == nil {
						t.Fatalf("Model(&Message{}).Create(%T) = nil; want an error", v)
					}
					if n := countRows(t, db, outbox.DefaultMessagesTable); n != 0 {
						t.Fatalf("%d rows written; want 0", n)
					}
				})
			}
		})
	}
}

func TestRawSavepointStatementsAreFollowed(t *testing.T) {
	// In a script, "W<b>" writes a row in bucket b; anything else is executed.
	for _, o := range testenv.Databases(t) {
		quote, work := `"`, "WORK"
		switch o.Name {
		case testenv.MySQL:
			quote = "`"
		case testenv.SQLite:
			work = "TRANSACTION"
		}
		scripts := map[string][]string{
			"lower_case":       {"savepoint s1", "W6", "rollback to savepoint s1"},
			"without_keyword":  {"SAVEPOINT s1", "W6", "ROLLBACK TO s1"},
			"mixed_case":       {"SavePoint S1", "W6", "Rollback To SavePoint s1;"},
			"rollback_work":    {"SAVEPOINT s1", "W6", "ROLLBACK " + work + " TO SAVEPOINT s1"},
			"quoted":           {"SAVEPOINT " + quote + "s1" + quote, "W6", "ROLLBACK TO SAVEPOINT " + quote + "s1" + quote},
			"reused_name":      {"SAVEPOINT a", "W5", "SAVEPOINT A", "W6", "ROLLBACK TO a"},
			"nested":           {"SAVEPOINT a", "W5", "SAVEPOINT b", "W6", "ROLLBACK TO SAVEPOINT a", "W4"},
			"released_kept":    {"SAVEPOINT a", "W5", "RELEASE SAVEPOINT a"},
			"release_then_old": {"SAVEPOINT a", "W5", "SAVEPOINT b", "W4", "RELEASE SAVEPOINT b", "W6", "ROLLBACK TO a"},
		}
		t.Run(o.Name, func(t *testing.T) {
			db, rec := notifyingDB(t, o, nil)
			for name, script := range scripts {
				t.Run(name, func(t *testing.T) {
					db.Where("1 = 1").Delete(&outbox.Message{})
					rec.take()
					err := db.Transaction(func(tx *gorm.DB) error {
						if err := tx.Create(inBucket(1)).Error; err != nil {
							return err
						}
						for _, s := range script {
							if s[0] == 'W' {
								if err := tx.Create(inBucket(int32(s[1] - '0'))).Error; err != nil {
									return err
								}
								continue
							}
							if err := tx.Exec(s).Error; err != nil {
								return fmt.Errorf("%s: %w", s, err)
							}
						}
						return nil
					})
					if err != nil {
						t.Fatal(err)
					}
					var committed []int
					db.Model(&outbox.Message{}).Distinct("bucket").Order("bucket").Pluck("bucket", &committed)
					if got := rec.take(); len(got) != 1 || !slices.Equal(got[0], committed) {
						t.Fatalf("notifications = %v; want exactly one with the committed rows' buckets %v", got, committed)
					}
				})
			}
		})
	}
}

func TestSessionsDerivedBeforeUseStillNotify(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			root := o.Open(t, nil)
			early := map[string]*gorm.DB{
				"with_context": root.WithContext(t.Context()),
				"session":      root.Session(&gorm.Session{}),
				"autocommit":   root.Session(&gorm.Session{SkipDefaultTransaction: true}),
			}
			rec := &recorder{}
			if err := root.Use(outbox.Plugin{Notifier: rec}); err != nil {
				t.Fatal(err)
			}
			if err := outbox.AutoMigrate(root, outbox.Config{}); err != nil {
				t.Fatal(err)
			}
			for name, d := range early {
				if err := d.Create(inBucket(6)).Error; err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if got := rec.take(); len(got) != 1 || !slices.Equal(got[0], []int{6}) {
					t.Fatalf("%s (derived before db.Use): notifications = %v; want [[6]]", name, got)
				}
			}
			// The plugin registered on a session: the root it came from.
			root2 := o.Open(t, nil)
			rec2 := &recorder{}
			if err := root2.WithContext(t.Context()).Use(outbox.Plugin{Notifier: rec2}); err != nil {
				t.Fatal(err)
			}
			if err := outbox.AutoMigrate(root2, outbox.Config{}); err != nil {
				t.Fatal(err)
			}
			if err := root2.Create(inBucket(3)).Error; err != nil {
				t.Fatal(err)
			}
			if got := rec2.take(); len(got) != 1 || !slices.Equal(got[0], []int{3}) {
				t.Fatalf("root of root.WithContext(ctx).Use(plugin): notifications = %v; want [[3]]", got)
			}
		})
	}
}

func TestCommitThePluginCannotFollowIsLoggedOnce(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			root := o.Open(t, nil)
			early := root.WithContext(t.Context())
			rec := &recorder{}
			logs := &testenv.Logs{}
			if err := root.Use(outbox.Plugin{Notifier: rec, Logger: logs.Logger()}); err != nil {
				t.Fatal(err)
			}
			if err := outbox.AutoMigrate(root, outbox.Config{}); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				// An explicit transaction on a session derived before db.Use
				// begins on the raw pool: its commit cannot be followed.
				err := early.Transaction(func(tx *gorm.DB) error { return tx.Create(inBucket(2)).Error })
				if err != nil {
					t.Fatal(err)
				}
			}
			if n := countRows(t, root, outbox.DefaultMessagesTable); n != 2 {
				t.Fatalf("%d rows; want 2 committed", n)
			}
			warns := logs.Matching("cannot follow")
			if len(warns) != 1 || !strings.Contains(warns[0], "WARN") {
				t.Fatalf("log lines about unfollowed commits = %q; want exactly one WARN", warns)
			}
			if got := rec.take(); len(got) != 0 {
				t.Fatalf("notified %v for commits the plugin could not follow; want nothing", got)
			}
		})
	}
}

// TestUpsertKeepsTheRowsIdentity: OnConflict on an existing row writes that
// row again; it is not a new record.
func TestUpsertKeepsTheRowsIdentity(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := setup(t, o, outbox.Config{}, nil)
			m := outbox.NewStringMessage("orders", "k", "v")
			if err := db.Create(m).Error; err != nil {
				t.Fatal(err)
			}
			id, mid := m.ID, m.MessageID
			m.Value = []byte("v2")
			if err := db.Clauses(clause.OnConflict{UpdateAll: true}).Create(m).Error; err != nil {
				t.Fatal(err)
			}
			ids := messageIDs(t, db, outbox.DefaultMessagesTable)
			if len(ids) != 1 || ids[0] != mid.String() || m.ID != id {
				t.Fatalf("after an upsert of row %d: rows %v, struct id %d; want the one row %s", id, ids, m.ID, mid)
			}
		})
	}
}
