package gormstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"gorm.io/gorm"
)

// TestPendingMetricsOnALargeTable: with 60,000 rows (above the exact
// threshold) in 8 buckets, the heads of bucket 1 parked, PendingMetrics
// reports Parked exactly, Oldest as the oldest unparked head, and Count
// as an estimate of the right order of magnitude (exact on SQLite),
// without the whole-table aggregate on PostgreSQL and MySQL. The estimate
// comes from statistics the database refreshes when it likes, so the test
// pins what the gauge is for — a backlog of tens of thousands, not
// thousands or millions — not a tolerance the statistics may miss.
func TestPendingMetricsOnALargeTable(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	const rows, parked = 60_000, 5
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			rec := &testenv.SQLRecorder{}
			db := o.Open(t, &gorm.Config{Logger: rec})
			cfg := outbox.Config{BucketCount: 8}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				t.Fatal(err)
			}
			msgs := make([]*outbox.Message, rows)
			for i := range msgs {
				g := i + 1
				msgs[i] = pendingMessage(int32(g % 8))
				msgs[i].CreatedAt = base.Add(time.Duration(g) * time.Second)
			}
			if err := raw(db).Table(cfg.MessagesTableName()).CreateInBatches(msgs, 1000).Error; err != nil {
				t.Fatal(err)
			}
			// Park the 5 oldest rows of bucket 1 (g = 1, 9, 17, …): the
			// oldest unparked row is then g = 2, bucket 2's head.
			var ids []int64
			for _, m := range msgs[:8*parked] {
				if m.Bucket == 1 {
					ids = append(ids, m.ID)
				}
			}
			if err := db.Table(cfg.MessagesTableName()).Where("id IN ?", ids).
				Updates(map[string]any{"parked_at_ms": 1, "parked_reason": "test"}).Error; err != nil {
				t.Fatal(err)
			}
			switch o.Name {
			case testenv.Postgres:
				testenv.MustExec(t, db, "ANALYZE outbox_messages")
			case testenv.MySQL:
				testenv.MustExec(t, db, "ANALYZE TABLE outbox_messages")
			}
			store, err := gormstore.New(db, gormstore.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			rec.Reset()
			began := time.Now()
			got, err := store.PendingMetrics(context.Background())
			took := time.Since(began)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("PendingMetrics = %+v in %v; statements:\n%s", *got, took.Round(time.Microsecond), strings.Join(rec.Statements(), "\n"))
			if got.Parked != parked {
				t.Errorf("Parked = %d; want %d", got.Parked, parked)
			}
			if want := base.Add(2 * time.Second); !got.Oldest.Equal(want) {
				t.Errorf("Oldest = %v; want %v (bucket 2's head)", got.Oldest, want)
			}
			want := int64(rows - parked)
			if o.Name == testenv.SQLite {
				if got.Count != want {
					t.Errorf("Count = %d; want exactly %d", got.Count, want)
				}
			} else if got.Count < want/10 || got.Count > want*10 {
				t.Errorf("Count = %d; want the order of magnitude of %d (within a factor of 10)", got.Count, want)
			}
			if o.Name != testenv.SQLite {
				for _, s := range rec.Statements() {
					if strings.Contains(s, "MIN(CASE") || strings.Contains(s, "COUNT(*) - COUNT(parked_at_ms)") {
						t.Errorf("a whole-table aggregate ran on a large table: %s", s)
					}
				}
			}
		})
	}
}
