package outbox_test

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"gorm.io/gorm"
)

// fixedMessages are messages of every column shape, with their generated
// fields set so that two creates of copies bind the same values.
func fixedMessages() []outbox.Message {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	p := int32(5)
	return []outbox.Message{
		{MessageID: outbox.NewUUID(), Topic: "orders", Key: []byte("order-1"), Value: []byte("v"), CreatedAt: at},
		{MessageID: outbox.NewUUID(), Topic: "orders.keyless", Value: []byte{}, Partition: &p, CreatedAt: at,
			Headers: outbox.Headers{{Key: "a", Value: []byte("1")}, {Key: "nil"}}},
		{MessageID: outbox.NewUUID(), Topic: "orders_tombstone", Key: []byte{}, CreatedAt: at},
	}
}

// stripReturning removes a RETURNING id clause, in any quoting.
func stripReturning(q string) string {
	for _, r := range []string{` RETURNING "id"`, " RETURNING `id`", ` RETURNING id`} {
		q = strings.TrimSuffix(q, r)
	}
	return q
}

// captureCreate records the SQL and vars of the creates of db as they stand
// after gorm:create (the plugin's INSERT or GORM's).
func captureCreate(t *testing.T, db *gorm.DB) *[]string {
	t.Helper()
	var got []string
	if err := db.Callback().Create().After("gorm:create").Register("test:capture", func(db *gorm.DB) {
		got = append(got, db.Statement.SQL.String()+" | "+fmt.Sprint(db.Statement.Vars...))
	}); err != nil {
		t.Fatal(err)
	}
	return &got
}

// TestPluginInsertIsGormsInsert checks that the INSERT the plugin writes
// itself is the one GORM would write (GORM's dry run of a copy), up to
// RETURNING, for one row (built once, then cached) and several, and that
// it reaches GORM's logger.
func TestPluginInsertIsGormsInsert(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			rec := &testenv.SQLRecorder{}
			db := setup(t, o, outbox.Config{}, &gorm.Config{Logger: rec})
			got := captureCreate(t, db)
			gormSQL := func(v any) string {
				stmt := db.Session(&gorm.Session{DryRun: true}).Create(v).Statement
				return stmt.SQL.String() + " | " + fmt.Sprint(stmt.Vars...)
			}
			for round := range 2 { // the second round uses the cached SQL
				for i, m := range fixedMessages() {
					want := gormSQL(new(m))
					*got = nil
					if err := db.Create(&m).Error; err != nil {
						t.Fatalf("round %d, message %d: %v", round, i, err)
					}
					if len(*got) != 1 || stripReturning(strings.SplitN((*got)[0], " | ", 2)[0]) != stripReturning(strings.SplitN(want, " | ", 2)[0]) ||
						strings.SplitN((*got)[0], " | ", 2)[1] != strings.SplitN(want, " | ", 2)[1] {
						t.Fatalf("round %d, message %d: the plugin wrote\n  %v\nGORM writes\n  %s", round, i, *got, want)
					}
					if m.ID == 0 {
						t.Fatalf("round %d, message %d: ID not filled", round, i)
					}
					// GORM's own create reads the id back with RETURNING on
					// all three; the plugin's uses LastInsertId for one row
					// where that is exact.
					if o.Name != testenv.Postgres && strings.Contains((*got)[0], "RETURNING") {
						t.Fatalf("round %d, message %d: %s; want no RETURNING (the plugin's INSERT) on %s", round, i, (*got)[0], o.Name)
					}
				}
			}
			msgs := fixedMessages()
			want := gormSQL(new(slices.Clone(msgs)))
			*got = nil
			if err := db.Create(&msgs).Error; err != nil {
				t.Fatal(err)
			}
			if len(*got) != 1 || (*got)[0] != want {
				t.Fatalf("3 rows: the plugin wrote\n  %v\nGORM writes\n  %s", *got, want)
			}
			logged := 0
			for _, s := range rec.Statements() {
				if strings.HasPrefix(s, "INSERT INTO") && strings.Contains(s, "outbox_messages") {
					logged++
				}
			}
			// 6 one-row creates, 1 three-row create (dry runs log too: 7 more).
			if logged != 14 {
				t.Fatalf("the logger saw %d INSERTs into outbox_messages; want 14:\n%s", logged, strings.Join(rec.Statements(), "\n"))
			}
		})
	}
}

// rowOf reads back the row of message id.
func rowOf(t *testing.T, db *gorm.DB, id outbox.UUID) outbox.Message {
	t.Helper()
	var got outbox.Message
	if err := db.Where("message_id = ?", id).Take(&got).Error; err != nil {
		t.Fatalf("read back %s: %v", id, err)
	}
	return got
}

// sameRow reports how a row read back differs from the message written.
func sameRow(got, want outbox.Message) error {
	switch {
	case got.MessageID != want.MessageID, got.Bucket != want.Bucket, got.Topic != want.Topic:
		return fmt.Errorf("id/bucket/topic %s/%d/%s; want %s/%d/%s", got.MessageID, got.Bucket, got.Topic, want.MessageID, want.Bucket, want.Topic)
	case !bytes.Equal(got.Key, want.Key) || (got.Key == nil) != (want.Key == nil):
		return fmt.Errorf("key %q; want %q", got.Key, want.Key)
	case !bytes.Equal(got.Value, want.Value) || (got.Value == nil) != (want.Value == nil):
		return fmt.Errorf("value %q; want %q", got.Value, want.Value)
	case !reflect.DeepEqual(got.Headers, want.Headers):
		return fmt.Errorf("headers %v; want %v", got.Headers, want.Headers)
	case (got.Partition == nil) != (want.Partition == nil) || (got.Partition != nil && *got.Partition != *want.Partition):
		return fmt.Errorf("partition %v; want %v", got.Partition, want.Partition)
	case got.CreatedAt.Sub(want.CreatedAt).Abs() >= time.Millisecond: // the column's precision
		return fmt.Errorf("created at %v; want %v", got.CreatedAt, want.CreatedAt)
	}
	return nil
}

// TestCreateFillsTheIDsOfEveryShape checks that each message gets the id
// of its own row: one struct, slices of values and of pointers, Enqueue,
// in a transaction and without one (SkipDefaultTransaction).
func TestCreateFillsTheIDsOfEveryShape(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		for _, skipTx := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/skip_default_tx=%v", o.Name, skipTx), func(t *testing.T) {
				db := setup(t, o, outbox.Config{}, &gorm.Config{SkipDefaultTransaction: skipTx})
				check := func(what string, ms ...*outbox.Message) {
					t.Helper()
					seen := map[int64]bool{}
					for i, m := range ms {
						got := rowOf(t, db, m.MessageID)
						if m.ID == 0 || got.ID != m.ID || seen[m.ID] {
							t.Fatalf("%s: message %d has ID %d, its row %d (seen before: %v)", what, i, m.ID, got.ID, seen[m.ID])
						}
						seen[m.ID] = true
						if err := sameRow(got, *m); err != nil {
							t.Fatalf("%s: message %d: %v", what, i, err)
						}
					}
				}
				one := fixedMessages()[1]
				one.MessageID = outbox.UUID{}
				if err := db.Create(&one).Error; err != nil {
					t.Fatal(err)
				}
				check("one", &one)
				vals := fixedMessages()
				if err := db.Create(&vals).Error; err != nil {
					t.Fatal(err)
				}
				check("[]Message", &vals[0], &vals[1], &vals[2])
				var ptrs []*outbox.Message
				for _, m := range fixedMessages() {
					ptrs = append(ptrs, new(m))
				}
				if err := db.Create(ptrs).Error; err != nil {
					t.Fatal(err)
				}
				check("[]*Message", ptrs...)
				enq := []*outbox.Message{outbox.NewMessage("a", nil, []byte("1")), outbox.NewMessage("b", []byte("k"), nil)}
				if err := outbox.Enqueue(db, enq...); err != nil {
					t.Fatal(err)
				}
				check("Enqueue", enq...)
			})
		}
	}
}

// TestSkipIDReadBack checks the option: the rows carry everything, the ids
// stay 0, notifications follow commits as without it, a rollback notifies
// nothing and keeps the generated message ids for a retry.
func TestSkipIDReadBack(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			rec := &recorder{}
			db := o.Open(t, nil)
			if err := db.Use(outbox.Plugin{Notifier: rec, SkipIDReadBack: true}); err != nil {
				t.Fatal(err)
			}
			if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
				t.Fatal(err)
			}
			all := fixedMessages()
			err := db.Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(&all[0]).Error; err != nil {
					return err
				}
				return outbox.Enqueue(tx, &all[1], &all[2])
			})
			if err != nil {
				t.Fatal(err)
			}
			var want []int
			for i, m := range all {
				if m.ID != 0 {
					t.Fatalf("message %d: ID %d; want 0 with SkipIDReadBack", i, m.ID)
				}
				got := rowOf(t, db, m.MessageID)
				if got.ID == 0 {
					t.Fatalf("message %d: its row has no id", i)
				}
				if err := sameRow(got, m); err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
				want = append(want, int(m.Bucket))
			}
			slices.Sort(want)
			want = slices.Compact(want)
			if e := rec.take(); len(e) != 1 || !slices.Equal(e[0], want) {
				t.Fatalf("notified %v; want once %v", e, want)
			}

			// A rolled-back transaction notifies nobody; its retry keeps
			// the generated message id, and reusing the struct after the
			// commit generates a new one.
			m := outbox.NewMessage("orders", []byte("k"), []byte("v"))
			errBoom := errors.New("boom")
			if err := db.Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(m).Error; err != nil {
					return err
				}
				return errBoom
			}); !errors.Is(err, errBoom) {
				t.Fatalf("rolled-back transaction = %v; want boom", err)
			}
			if e := rec.take(); len(e) != 0 {
				t.Fatalf("a rollback notified %v", e)
			}
			first := m.MessageID
			if err := db.Create(m).Error; err != nil {
				t.Fatal(err)
			}
			if m.MessageID != first || m.ID != 0 {
				t.Fatalf("retry: message id %s (was %s), ID %d; want the same id and ID 0", m.MessageID, first, m.ID)
			}
			if e := rec.take(); len(e) != 1 || !slices.Equal(e[0], []int{int(m.Bucket)}) {
				t.Fatalf("notified %v; want once [%d]", e, m.Bucket)
			}
			if err := db.Create(m).Error; err != nil {
				t.Fatal(err)
			}
			if m.MessageID == first {
				t.Fatal("a reused struct kept its committed message id")
			}
			if n := countRows(t, db, outbox.DefaultMessagesTable); n != 5 {
				t.Fatalf("%d rows; want 5", n)
			}
		})
	}
}
