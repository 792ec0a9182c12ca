package gormstore_test

import (
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay/relaytest"
	"gorm.io/gorm"
)

// TestMySQLDriverSettings: the store works with a DSN without parseTime=true
// (the driver's default, which returns DATETIME as text): NextBatch and
// PendingMetrics read created_at as the UTC instant the writer stored; and
// with loc set to another zone on writer and relay alike, the instant is
// the same. Writers here use outbox.Plugin's create path on their own DSN.
func TestMySQLDriverSettings(t *testing.T) {
	var mysqlDB testenv.Opener
	for _, o := range testenv.Databases(t) {
		if o.Name == testenv.MySQL {
			mysqlDB = o
		}
	}
	if mysqlDB.Name == "" {
		t.Skip("no MySQL/MariaDB")
	}
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Skipf("no zone data: %v", err)
	}
	for _, tc := range []struct {
		name           string
		writer, reader func(c *mysqldrv.Config)
	}{
		{"parseTime=false", func(*mysqldrv.Config) {}, func(c *mysqldrv.Config) { c.ParseTime = false }},
		{"parseTime=false,multiStatements=false", func(*mysqldrv.Config) {}, func(c *mysqldrv.Config) {
			c.ParseTime = false
			c.MultiStatements = false
		}},
		{"loc=Asia/Tokyo", func(c *mysqldrv.Config) { c.Loc = tokyo }, func(c *mysqldrv.Config) { c.Loc = tokyo }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := mysqlDB.Open(t, nil)
			cfg := outbox.Config{BucketCount: 2}
			if err := outbox.AutoMigrate(base, cfg); err != nil {
				t.Fatal(err)
			}
			writer := testenv.MySQLWith(t, base, tc.writer)
			reader := testenv.MySQLWith(t, base, tc.reader)
			created := time.Date(2026, 3, 4, 5, 6, 7, 123_000_000, time.UTC)
			for _, db := range []*gorm.DB{writer} {
				m := pendingMessage(0)
				m.CreatedAt = created
				if err := raw(db).Table(cfg.MessagesTableName()).Create(m).Error; err != nil {
					t.Fatal(err)
				}
			}
			store, err := gormstore.New(reader, gormstore.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			if owned, err := relaytest.Owned(store.AcquireBucketLeases(ctx, "relay-a", 2, 30*time.Second)); err != nil || len(owned) != 2 {
				t.Fatalf("AcquireBucketLeases = %v, %v", owned, err)
			}
			batch, err := nextBatch(ctx, store, 0, 10, 0)
			if err != nil || len(batch) != 1 {
				t.Fatalf("NextBatch = %d rows, %v; want 1", len(batch), err)
			}
			if got := batch[0].CreatedAt; !got.Equal(created) || got.Location() != time.UTC {
				t.Errorf("CreatedAt = %v; want %v (UTC)", got, created)
			}
			p, err := store.PendingMetrics(ctx)
			if err != nil || p.Count != 1 || !p.Oldest.Equal(created) {
				t.Errorf("PendingMetrics = %+v, %v; want 1 row, oldest %v", p, err, created)
			}
			if err := store.MarkPublished(ctx, batch); err != nil {
				t.Fatal(err)
			}
		})
	}
}
