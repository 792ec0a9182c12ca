package outbox_test

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/migrations"
	"gorm.io/gorm"
)

// order is a business row written in the same transaction as the messages.
type order struct {
	ID     int64 `gorm:"primaryKey"`
	Amount int
}

// setup opens a database with the plugin and migrated tables for cfg.
func setup(t *testing.T, o testenv.Opener, cfg outbox.Config, gcfg *gorm.Config) *gorm.DB {
	t.Helper()
	db := o.Open(t, gcfg)
	if err := db.Use(outbox.Plugin{Config: cfg}); err != nil {
		t.Fatalf("db.Use(Plugin): %v", err)
	}
	if cfg.Schema != "" {
		createSchema(t, o, db, cfg.Schema)
	}
	if cfg.Schema != "" && o.Name == testenv.SQLite {
		if err := outbox.AutoMigrate(db, cfg); err == nil || !strings.Contains(err.Error(), "not supported on SQLite") {
			t.Fatalf("AutoMigrate(SQLite, Schema) = %v; want a clear not-supported error", err)
		}
		migrateSQLiteSchema(t, db, cfg)
	} else if err := outbox.AutoMigrate(db, cfg); err != nil {
		t.Fatalf("AutoMigrate: %v", err)
	}
	if err := db.AutoMigrate(&order{}); err != nil {
		t.Fatal(err)
	}
	return db
}

// createSchema makes schema usable as a table qualifier on db.
func createSchema(t *testing.T, o testenv.Opener, db *gorm.DB, schema string) {
	t.Helper()
	switch o.Name {
	case testenv.Postgres:
		testenv.MustExec(t, db, "CREATE SCHEMA "+schema)
	case testenv.MySQL:
		testenv.MustExec(t, db, "CREATE DATABASE "+schema)
		t.Cleanup(func() { db.Exec("DROP DATABASE IF EXISTS " + schema) })
	case testenv.SQLite:
		// An attached database lives on one connection: keep only one.
		sqlDB, err := db.DB()
		if err != nil {
			t.Fatal(err)
		}
		sqlDB.SetMaxOpenConns(1)
		if err := db.Exec("ATTACH DATABASE ? AS "+schema, filepath.Join(t.TempDir(), schema+".db")).Error; err != nil {
			t.Fatal(err)
		}
	}
}

// migrateSQLiteSchema applies migrations/sqlite.sql inside an attached
// database, as the AutoMigrate error tells users to.
func migrateSQLiteSchema(t *testing.T, db *gorm.DB, cfg outbox.Config) {
	t.Helper()
	stmts, err := migrations.Statements(testenv.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	r := strings.NewReplacer(
		"CREATE TABLE outbox_messages", "CREATE TABLE "+cfg.MessagesTableName(),
		"CREATE TABLE outbox_leases", "CREATE TABLE "+cfg.LeasesTableName(),
		"CREATE TABLE outbox_relays", "CREATE TABLE "+cfg.RelaysTableName(),
		"CREATE INDEX idx_outbox_messages_bucket_parked_id ON outbox_messages", "CREATE INDEX "+cfg.Schema+".idx_bucket_parked_id ON "+cfg.MessagesTable,
	)
	for _, s := range stmts {
		testenv.MustExec(t, db, r.Replace(s))
	}
}

func countRows(t *testing.T, db *gorm.DB, table string) int64 {
	t.Helper()
	var n int64
	if err := db.Table(table).Count(&n).Error; err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}

func TestCreateFillsAndRoutesMessages(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			t.Run("single_message_gets_id_bucket_and_created_at", func(t *testing.T) {
				db := setup(t, o, outbox.Config{}, nil)
				before := time.Now().Add(-time.Second)
				m := &outbox.Message{Topic: "orders", Key: []byte("order-1"), Value: []byte("v")}
				if err := db.Create(m).Error; err != nil {
					t.Fatalf("Create = %v; want nil", err)
				}
				if m.ID == 0 || m.MessageID.IsZero() {
					t.Fatalf("Create left ID %d, MessageID %s; want both set", m.ID, m.MessageID)
				}
				if want := outbox.BucketOf([]byte("order-1"), nil, m.MessageID, outbox.DefaultBucketCount); m.Bucket != want {
					t.Fatalf("Bucket = %d; want %d", m.Bucket, want)
				}
				if m.CreatedAt.Before(before) || m.CreatedAt.Location() != time.UTC {
					t.Fatalf("CreatedAt = %v; want a UTC time after %v", m.CreatedAt, before)
				}
				var got outbox.Message
				if err := db.First(&got, m.ID).Error; err != nil {
					t.Fatal(err)
				}
				if got.MessageID != m.MessageID || got.Bucket != m.Bucket || got.Topic != "orders" {
					t.Fatalf("stored row = %+v; want message id %s bucket %d", got, m.MessageID, m.Bucket)
				}
				if d := got.CreatedAt.Sub(m.CreatedAt).Abs(); d > time.Millisecond {
					t.Fatalf("stored CreatedAt %v differs from %v by %v", got.CreatedAt, m.CreatedAt, d)
				}
			})
			t.Run("slice_is_one_multi_row_insert", func(t *testing.T) {
				rec := &testenv.SQLRecorder{}
				db := setup(t, o, outbox.Config{BucketCount: 4}, &gorm.Config{Logger: rec})
				msgs := make([]outbox.Message, 50)
				for i := range msgs {
					msgs[i] = outbox.Message{Topic: "orders", Key: []byte{byte(i)}, Value: []byte("x")}
				}
				rec.Reset()
				if err := db.Create(&msgs).Error; err != nil {
					t.Fatalf("Create(slice) = %v", err)
				}
				inserts := 0
				for _, s := range rec.Statements() {
					if strings.HasPrefix(strings.ToUpper(s), "INSERT") {
						inserts++
					}
				}
				if inserts != 1 {
					t.Fatalf("Create of 50 messages issued %d INSERTs; want 1", inserts)
				}
				seen := map[int64]bool{}
				for i, m := range msgs {
					if m.ID == 0 || seen[m.ID] || m.MessageID.IsZero() || m.Bucket < 0 || m.Bucket >= 4 {
						t.Fatalf("message %d = id %d, message id %s, bucket %d; want unique id, message id, bucket in [0,4)", i, m.ID, m.MessageID, m.Bucket)
					}
					seen[m.ID] = true
				}
				if n := countRows(t, db, outbox.DefaultMessagesTable); n != 50 {
					t.Fatalf("table holds %d rows; want 50", n)
				}
			})
			t.Run("slice_of_pointers_and_Enqueue", func(t *testing.T) {
				db := setup(t, o, outbox.Config{}, nil)
				a := outbox.NewStringMessage("orders", "k", "a")
				b, err := outbox.NewJSONMessage("orders", "k", map[string]int{"n": 1}, outbox.Header{Key: "h", Value: []byte("1")})
				if err != nil {
					t.Fatal(err)
				}
				if err := db.Transaction(func(tx *gorm.DB) error { return outbox.Enqueue(tx, a, b) }); err != nil {
					t.Fatalf("Enqueue = %v", err)
				}
				if a.ID == 0 || b.ID <= a.ID || a.Bucket != b.Bucket {
					t.Fatalf("ids %d, %d buckets %d, %d; want increasing ids in one bucket", a.ID, b.ID, a.Bucket, b.Bucket)
				}
				var got outbox.Message
				if err := db.First(&got, b.ID).Error; err != nil {
					t.Fatal(err)
				}
				if string(got.Value) != `{"n":1}` || len(got.Headers) != 1 || got.Headers[0].Key != "h" {
					t.Fatalf("stored JSON message = value %q headers %v; want {\"n\":1} and header h", got.Value, got.Headers)
				}
			})
			t.Run("custom_table_names_and_schema", func(t *testing.T) {
				cfg := outbox.Config{Schema: testenv.Unique("msg_"), MessagesTable: "orders_outbox", LeasesTable: "orders_leases", RelaysTable: "orders_relays"}
				db := setup(t, o, cfg, nil)
				if err := db.Create(&outbox.Message{Topic: "orders", Value: []byte("x")}).Error; err != nil {
					t.Fatalf("Create = %v", err)
				}
				if n := countRows(t, db, cfg.MessagesTableName()); n != 1 {
					t.Fatalf("%s holds %d rows; want 1", cfg.MessagesTableName(), n)
				}
				if db.Migrator().HasTable(outbox.DefaultMessagesTable) {
					t.Fatalf("default table %s exists; want only the configured tables", outbox.DefaultMessagesTable)
				}
			})
			t.Run("two_logical_outboxes_receive_their_own_rows", func(t *testing.T) {
				db := setup(t, o, outbox.Config{}, nil)
				billing := outbox.Config{BucketCount: 2, MessagesTable: "billing_outbox", LeasesTable: "billing_leases", RelaysTable: "billing_relays"}
				if err := outbox.AutoMigrate(db, billing); err != nil {
					t.Fatal(err)
				}
				err := db.Transaction(func(tx *gorm.DB) error {
					if err := tx.Create(&outbox.Message{Topic: "orders", Key: []byte("a")}).Error; err != nil {
						return err
					}
					return tx.Scopes(outbox.WithConfig(billing)).Create(&[]outbox.Message{{Topic: "invoices"}, {Topic: "invoices"}}).Error
				})
				if err != nil {
					t.Fatal(err)
				}
				if a, b := countRows(t, db, outbox.DefaultMessagesTable), countRows(t, db, "billing_outbox"); a != 1 || b != 2 {
					t.Fatalf("rows: default %d, billing %d; want 1 and 2", a, b)
				}
				var bs []int32
				db.Table("billing_outbox").Pluck("bucket", &bs)
				for _, b := range bs {
					if b < 0 || b >= 2 {
						t.Fatalf("billing row in bucket %d; want [0,2)", b)
					}
				}
			})
			t.Run("without_the_plugin_defaults_apply", func(t *testing.T) {
				db := o.Open(t, nil)
				if err := db.AutoMigrate(&outbox.Message{}); err != nil {
					t.Fatal(err)
				}
				m := &outbox.Message{Topic: "orders", Key: []byte("k")}
				if err := db.Create(m).Error; err != nil {
					t.Fatal(err)
				}
				if m.MessageID.IsZero() || m.CreatedAt.IsZero() || m.Bucket != outbox.BucketOf([]byte("k"), nil, m.MessageID, 8) {
					t.Fatalf("without plugin: message id %s, created %v, bucket %d; want filled with 8 buckets", m.MessageID, m.CreatedAt, m.Bucket)
				}
				if err := db.Create(&outbox.Message{Topic: ""}).Error; !errors.Is(err, outbox.ErrInvalidMessage) {
					t.Fatalf("without plugin, empty topic: Create = %v; want ErrInvalidMessage", err)
				}
			})
			t.Run("a_rolled_back_attempt_gets_a_fresh_id_on_retry", func(t *testing.T) {
				db := setup(t, o, outbox.Config{}, nil)
				m := &outbox.Message{Topic: "orders", Value: []byte("x")}
				_ = db.Transaction(func(tx *gorm.DB) error {
					if err := tx.Create(m).Error; err != nil {
						return err
					}
					return errors.New("business failure")
				})
				first := m.MessageID
				other := &outbox.Message{Topic: "orders"}
				if err := db.Create(other).Error; err != nil {
					t.Fatal(err)
				}
				if err := db.Create(m).Error; err != nil {
					t.Fatalf("retry Create = %v", err)
				}
				if m.ID <= other.ID || m.MessageID != first {
					t.Fatalf("retried row id %d (after %d), message id %s (was %s); want a newer id and the same message id", m.ID, other.ID, m.MessageID, first)
				}
			})
		})
	}
}

func TestCreateRejectsInvalidMessages(t *testing.T) {
	neg := int32(-1)
	cases := []struct {
		name string
		msg  outbox.Message
		want string
	}{
		{"empty_topic", outbox.Message{Topic: ""}, "topic is empty"},
		{"over_long_topic", outbox.Message{Topic: strings.Repeat("t", 250)}, "250 characters"},
		{"illegal_topic_characters", outbox.Message{Topic: "orders/eu"}, "characters outside"},
		{"negative_partition", outbox.Message{Topic: "orders", Partition: &neg}, "partition -1 is negative"},
		{"bucket_disagreeing_with_bucket_count", outbox.Message{Topic: "orders", Key: []byte("k"), Bucket: 200}, "disagrees"},
	}
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := setup(t, o, outbox.Config{}, nil)
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					tx := db.Begin()
					if err := tx.Create(&order{Amount: 1}).Error; err != nil {
						t.Fatal(err)
					}
					m := c.msg
					err := tx.Create(&[]outbox.Message{{Topic: "ok"}, m}).Error
					if !errors.Is(err, outbox.ErrInvalidMessage) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "message 1") {
						t.Fatalf("Create = %v; want ErrInvalidMessage mentioning message 1 and %q", err, c.want)
					}
					if err := tx.Rollback().Error; err != nil {
						t.Fatalf("Rollback after rejected Create = %v; want nil", err)
					}
					if n := countRows(t, db, outbox.DefaultMessagesTable); n != 0 {
						t.Fatalf("%d outbox rows after rejected Create; want 0", n)
					}
					if n := countRows(t, db, "orders"); n != 0 {
						t.Fatalf("%d order rows after rollback; want 0", n)
					}
				})
			}
		})
	}
}

func TestKeyAndValueNilAndEmptyRoundTrip(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := setup(t, o, outbox.Config{}, nil)
			in := []outbox.Message{
				{Topic: "t", Key: nil, Value: nil},
				{Topic: "t", Key: []byte{}, Value: []byte{}},
				{Topic: "t", Key: []byte{0, 255}, Value: []byte("v")},
			}
			if err := db.Create(&in).Error; err != nil {
				t.Fatal(err)
			}
			var out []outbox.Message
			if err := db.Order("id").Find(&out).Error; err != nil {
				t.Fatal(err)
			}
			if len(out) != len(in) {
				t.Fatalf("read %d rows; want %d", len(out), len(in))
			}
			for i := range in {
				for _, f := range []struct {
					name      string
					got, want []byte
				}{{"key", out[i].Key, in[i].Key}, {"value", out[i].Value, in[i].Value}} {
					if (f.got == nil) != (f.want == nil) || !bytes.Equal(f.got, f.want) {
						t.Fatalf("row %d %s = %#v; want %#v (nil and empty must stay distinct)", i, f.name, f.got, f.want)
					}
				}
				if out[i].Headers != nil {
					t.Fatalf("row %d headers = %v; want nil", i, out[i].Headers)
				}
			}
		})
	}
}

func TestPluginRejectsInvalidConfig(t *testing.T) {
	cases := []struct {
		cfg  outbox.Config
		want string
	}{
		{outbox.Config{BucketCount: -1}, "BucketCount -1"},
		{outbox.Config{BucketCount: outbox.MaxBucketCount + 1}, "BucketCount"},
		{outbox.Config{MessagesTable: "orders; DROP TABLE x"}, "MessagesTable"},
		{outbox.Config{Schema: "a.b"}, "Schema"},
		{outbox.Config{LeasesTable: "outbox_messages"}, "distinct"},
	}
	db := testenv.Databases(t)[0].Open(t, nil)
	for _, c := range cases {
		if err := db.Use(outbox.Plugin{Config: c.cfg}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("db.Use(Plugin{%+v}) = %v; want an error naming %q", c.cfg, err, c.want)
		}
	}
}
