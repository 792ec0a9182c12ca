package gormstore_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay"
	"gorm.io/gorm"
)

// TestNextInOrderScansTheRowidInOrderOnSQLite: with a backlog of 64,000
// rows over 4,096 buckets (1000 keys, the first 100 rows parked, so that
// the hold subquery runs per row), NextInOrder for the buckets less a few
// holes is one statement that scans the table in rowid order and stops at
// its limit, the hold reading the (bucket, parked_at_ms, id) index: no
// temporary b-tree (a sort of every pending row), with the backlog's
// statistics and with those of a table that held two rows (an ANALYZE of
// the drained outbox). Skipped with -short.
func TestNextInOrderScansTheRowidInOrderOnSQLite(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a table of 64,000 rows")
	}
	o := testenv.Databases(t)[0]
	if o.Name != testenv.SQLite {
		t.Fatalf("first test database is %s; want SQLite", o.Name)
	}
	const rows, buckets = 64_000, 4096
	rec := &testenv.SQLRecorder{}
	db := o.Open(t, &gorm.Config{Logger: rec})
	cfg := outbox.Config{BucketCount: buckets}
	if err := outbox.AutoMigrate(db, cfg); err != nil {
		t.Fatal(err)
	}
	testenv.MustExec(t, db,
		`WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 64000)
		 INSERT INTO outbox_messages (message_id, bucket, topic, record_key, record_value, created_at)
		 SELECT lower(hex(randomblob(16))), n % 4096, 'orders', CAST('k' || (n % 1000) AS BLOB), x'00', '2026-01-01 00:00:00' FROM g`,
		"UPDATE outbox_messages SET parked_at_ms = 1, parked_reason = 'test' WHERE id <= 100",
		"ANALYZE")
	store, err := gormstore.New(db, gormstore.Options{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	holes := []int{17, 230, 1000, 1001, 1002, 1003, 4000}
	var req relay.BatchRequest
	for b := range buckets {
		if !slices.Contains(holes, b) {
			req.Buckets = append(req.Buckets, b)
		}
	}
	req.Limit = 500
	check := func(stats string) {
		t.Helper()
		rec.Reset()
		res, err := store.NextBatches(context.Background(), []relay.BatchRequest{req})
		if err != nil || len(res[0].Rows) != 500 {
			t.Fatalf("%s: NextBatches(%d buckets, limit 500) = %v, %v; want 500 rows", stats, len(req.Buckets), res, err)
		}
		stmts := rec.Statements()
		if len(stmts) != 1 {
			t.Fatalf("%s: NextInOrder issued %d statements; want 1", stats, len(stmts))
		}
		plan := explainSQLite(t, db, stmts[0])
		inOrder := (strings.Contains(plan, "SCAN m\n") || strings.HasSuffix(plan, "SCAN m")) &&
			strings.Contains(plan, "idx_outbox_messages_bucket_parked_id") &&
			!strings.Contains(plan, "TEMP B-TREE") && !strings.Contains(plan, "SCAN p")
		if !inOrder {
			t.Fatalf("%s: NextInOrder does not scan the table in rowid order, the hold on the bucket index:\n%s\n%s", stats, stmts[0], plan)
		}
	}
	check("the backlog's statistics")
	testenv.MustExec(t, db,
		"UPDATE sqlite_stat1 SET stat = '2 1 1 1' WHERE idx = 'idx_outbox_messages_bucket_parked_id'",
		"ANALYZE sqlite_schema") // reloads the statistics
	check("statistics of a two-row table")
}
