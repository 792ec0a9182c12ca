package gormstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"gorm.io/gorm"
)

// TestNextBatchWalksTheParkedIndexInOrderOnPostgres: with 200,000 rows and
// 100 parked rows at the head of bucket 0, NextBatch's query must be planned
// as a scan of the (bucket, parked_at_ms, id) index in order (no Sort), which
// starts at the bucket's first unparked entry, and BucketsWithPending's
// skip scan must probe the same index in both of its steps. With "bucket = $1 ORDER BY id" the
// PostgreSQL planner walks the primary key and filters, reading every row of
// the other buckets ahead of this bucket's head (about 130 ms per batch at
// 200,000 rows instead of under 1 ms); an ORDER BY that does not match the
// index adds a sort of every unparked row of the bucket.
func TestNextBatchWalksTheParkedIndexInOrderOnPostgres(t *testing.T) {
	pg := postgresOpener(t)
	rec := &testenv.SQLRecorder{}
	db := pg.Open(t, &gorm.Config{Logger: rec})
	if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
		t.Fatal(err)
	}
	testenv.MustExec(t, db,
		`INSERT INTO outbox_messages (message_id, bucket, topic, record_value, created_at)
		 SELECT gen_random_uuid(), g % 8, 'orders', '\x00'::bytea, now() FROM generate_series(1, 200000) g`,
		`UPDATE outbox_messages SET parked_at_ms = 1, parked_reason = 'test'
		 WHERE id IN (SELECT id FROM outbox_messages WHERE bucket = 0 ORDER BY id LIMIT 100)`,
		"ANALYZE outbox_messages")
	var lastParked int64
	if err := db.Raw("SELECT max(id) FROM outbox_messages WHERE parked_at_ms IS NOT NULL").Scan(&lastParked).Error; err != nil {
		t.Fatal(err)
	}
	store, err := gormstore.New(db, gormstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	explain := func(stmt string) string {
		t.Helper()
		var plan []string
		if err := db.Raw("EXPLAIN (ANALYZE) " + stmt).Scan(&plan).Error; err != nil {
			t.Fatal(err)
		}
		return strings.Join(plan, "\n")
	}

	rec.Reset()
	batch, err := nextBatch(context.Background(), store, 0, 500, 0)
	if err != nil || len(batch) != 500 {
		t.Fatalf("NextBatch = %d rows, %v; want 500", len(batch), err)
	}
	if batch[0].ID <= lastParked {
		t.Fatalf("NextBatch starts at id %d; want past the parked rows (last %d)", batch[0].ID, lastParked)
	}
	for i := 1; i < len(batch); i++ {
		if batch[i].Bucket != 0 || batch[i].ID <= batch[i-1].ID {
			t.Fatalf("row %d: bucket %d id %d after id %d; want bucket 0 in id order", i, batch[i].Bucket, batch[i].ID, batch[i-1].ID)
		}
	}
	stmt := guardedSelect(t, "NextBatch", rec.Statements())
	plan := explainAnalyzed(t, db, stmt, true)
	if !strings.Contains(plan, "Index Scan using idx_outbox_messages_bucket_parked_id") || strings.Contains(plan, "Sort") {
		t.Fatalf("NextBatch plan is not an in-order scan of the (bucket, parked_at_ms, id) index:\n%s\n%s", stmt, plan)
	}
	t.Logf("NextBatch plan:\n%s", plan)

	rec.Reset()
	if got, err := store.BucketsWithPending(context.Background(), []int{0, 1, 2}); err != nil || len(got) != 3 {
		t.Fatalf("BucketsWithPending = %v, %v; want [0 1 2]", got, err)
	}
	stmts := rec.Statements()
	if len(stmts) != 1 {
		t.Fatalf("BucketsWithPending issued %d statements; want 1", len(stmts))
	}
	plan = explain(stmts[0])
	if strings.Count(plan, "Scan using idx_outbox_messages_bucket_parked_id") != 2 || strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Sort") {
		t.Fatalf("BucketsWithPending's skip scan does not probe the (bucket, parked_at_ms, id) index in its two steps:\n%s\n%s", stmts[0], plan)
	}
	t.Logf("BucketsWithPending plan:\n%s", plan)
}

// TestNextBatchPlanIgnoresStaleStatisticsOnPostgres: statistics taken
// when the table held 10,240 rows in 1,024 buckets make the planner expect
// about 70 rows in a bucket that holds 5,000 (a backlog in 8 buckets).
// NextBatch's plan must still be an in-order scan of the (bucket,
// parked_at_ms, id) index that stops at the limit, as the custom plan of
// its statement and as the generic plan a driver's cached statement gets.
// With the limit a bind variable the custom plan was a bitmap heap scan of
// the whole bucket and a top-N sort (the planner expected fewer rows than
// the limit): at 19,000 rows a bucket, 80-160 ms a batch instead of 1-15.
func TestNextBatchPlanIgnoresStaleStatisticsOnPostgres(t *testing.T) {
	pg := postgresOpener(t)
	rec := &testenv.SQLRecorder{}
	db := pg.Open(t, &gorm.Config{Logger: rec})
	if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
		t.Fatal(err)
	}
	testenv.MustExec(t, db,
		"ALTER TABLE outbox_messages SET (autovacuum_enabled = false)",
		`INSERT INTO outbox_messages (message_id, bucket, topic, record_value, created_at)
		 SELECT gen_random_uuid(), g % 1024, 'orders', '\x00'::bytea, now() FROM generate_series(1, 10240) g`,
		"ANALYZE outbox_messages",
		"DELETE FROM outbox_messages",
		`INSERT INTO outbox_messages (message_id, bucket, topic, record_value, created_at)
		 SELECT gen_random_uuid(), g % 8, 'orders', '\x00'::bytea, now() FROM generate_series(1, 40000) g`)
	obs := observe(db)
	store, err := gormstore.New(db, gormstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec.Reset()
	batch, err := nextBatch(context.Background(), store, 3, 500, 0)
	if err != nil || len(batch) != 500 {
		t.Fatalf("NextBatch = %d rows, %v; want 500", len(batch), err)
	}
	sent := obs.last(t, "NextBatch", "SELECT").SQL // as it went to the driver, with its bind variables
	stmt := guardedSelect(t, "NextBatch", rec.Statements())
	inOrder := func(plan string) bool {
		return strings.Contains(plan, "Index Scan using idx_outbox_messages_bucket_parked_id on outbox_messages m") &&
			!strings.Contains(plan, "Bitmap") && !strings.Contains(plan, "Sort")
	}
	plan := explainAnalyzed(t, db, stmt, true)
	t.Logf("custom plan:\n%s", plan)
	if !inOrder(plan) {
		t.Fatalf("NextBatch's custom plan is not an in-order scan of the bucket index:\n%s\n%s", stmt, plan)
	}
	generic := preparedGenericPlan(t, db, sent, "int, int, int, int, int", "3, 3, 3, 3, 500")
	t.Logf("generic plan:\n%s", generic)
	if !inOrder(generic) {
		t.Fatalf("NextBatch's generic plan is not an in-order scan of the bucket index:\n%s", generic)
	}
}

// TestNextBatchWalksTheParkedIndexInOrderOnSQLite: on SQLite NextBatch
// selects the bucket by equality, so that the (bucket, parked_at_ms, id)
// index is walked in order and read only up to the limit, and
// BucketsWithPending's skip scan searches the same index without a sort. The range form PostgreSQL needs is planned by SQLite as a
// range scan followed by a sort of the whole bucket ("USE TEMP B-TREE FOR
// RIGHT PART OF ORDER BY"): 57 ms instead of 3 ms per batch on a 25k-row
// bucket, the SQLite drain's main cost.
func TestNextBatchWalksTheParkedIndexInOrderOnSQLite(t *testing.T) {
	db, rec := sqliteBacklog(t)
	testenv.MustExec(t, db,
		`UPDATE outbox_messages SET parked_at_ms = 1, parked_reason = 'test'
		 WHERE id IN (SELECT id FROM outbox_messages WHERE bucket = 0 ORDER BY id LIMIT 100)`,
		"ANALYZE")
	store, err := gormstore.New(db, gormstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	explain := func(stmt string) string { return explainSQLite(t, db, stmt) }
	inOrder := func(plan string) bool {
		return strings.Contains(plan, "INDEX idx_outbox_messages_bucket_parked_id (bucket=? AND parked_at_ms=?)") &&
			!strings.Contains(plan, "TEMP B-TREE")
	}

	rec.Reset()
	if _, err := nextBatch(context.Background(), store, 0, 500, 0); err != nil {
		t.Fatal(err)
	}
	stmts := rec.Statements()
	if len(stmts) != 1 {
		t.Fatalf("NextBatch issued %d statements; want 1", len(stmts))
	}
	if plan := explain(stmts[0]); !inOrder(plan) {
		t.Fatalf("NextBatch plan is not an in-order walk of the (bucket, parked_at_ms, id) index:\n%s\n%s", stmts[0], plan)
	}
	rec.Reset()
	if got, err := store.BucketsWithPending(context.Background(), []int{0, 1, 2}); err != nil || len(got) != 3 {
		t.Fatalf("BucketsWithPending = %v, %v; want [0 1 2]", got, err)
	}
	stmts = rec.Statements()
	if len(stmts) != 1 {
		t.Fatalf("BucketsWithPending issued %d statements; want 1", len(stmts))
	}
	if plan := explain(stmts[0]); strings.Count(plan, "USING COVERING INDEX idx_outbox_messages_bucket_parked_id") != 2 || strings.Contains(plan, "TEMP B-TREE") {
		t.Fatalf("BucketsWithPending's skip scan does not walk the index in order in its two steps:\n%s\n%s", stmts[0], plan)
	}
}

// explainSQLite returns SQLite's EXPLAIN QUERY PLAN of stmt, one line per
// step.
func explainSQLite(t *testing.T, db *gorm.DB, stmt string) string {
	t.Helper()
	rows, err := db.Raw("EXPLAIN QUERY PLAN " + stmt).Rows()
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	return strings.Join(plan, "\n")
}

// TestMarkPublishedBucketsLooksUpEachRowOnSQLiteWhateverTheStatistics: with
// statistics taken when the outbox held two rows (an ANALYZE or PRAGMA
// optimize of the drained table) and a backlog of 20,000 rows, SQLite plans
// "id IN (…)" without a bucket as a scan of the whole table: every group
// delete of a drain read the backlog (55 ms per 500 rows of 100,000,
// against 2). MarkPublishedBuckets' statement must be a lookup of the rowid,
// and it must delete exactly the given rows.
func TestMarkPublishedBucketsLooksUpEachRowOnSQLiteWhateverTheStatistics(t *testing.T) {
	db, rec := sqliteBacklog(t)
	testenv.MustExec(t, db,
		"ANALYZE",
		"UPDATE sqlite_stat1 SET stat = '2 1 1 1' WHERE idx = 'idx_outbox_messages_bucket_parked_id'",
		"ANALYZE sqlite_schema") // reloads the statistics
	store, err := gormstore.New(db, gormstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var published []*outbox.Message
	for b := range 8 {
		rows, err := nextBatch(context.Background(), store, b, 60, 0)
		if err != nil {
			t.Fatal(err)
		}
		published = append(published, rows...)
	}
	rec.Reset()
	if err := store.MarkPublished(context.Background(), published); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range rec.Statements() {
		if !strings.HasPrefix(stmt, "DELETE") {
			continue
		}
		if plan := explainSQLite(t, db, stmt); strings.Contains(plan, "SCAN") || !strings.Contains(plan, "rowid=?") {
			t.Fatalf("MarkPublishedBuckets' delete is not a rowid lookup with statistics of a two-row table:\n%s\n%s", stmt, plan)
		}
	}
	var left int64
	if err := db.Raw("SELECT count(*) FROM outbox_messages").Scan(&left).Error; err != nil || left != 20000-int64(len(published)) {
		t.Fatalf("rows left after deleting %d of 20000 = %d, %v; want %d", len(published), left, err, 20000-len(published))
	}
}

// sqliteBacklog opens the SQLite test database with its statements
// recorded, and fills its outbox with 20,000 rows over 8 buckets.
func sqliteBacklog(t *testing.T) (*gorm.DB, *testenv.SQLRecorder) {
	t.Helper()
	o := testenv.Databases(t)[0]
	if o.Name != testenv.SQLite {
		t.Fatalf("first test database is %s; want SQLite", o.Name)
	}
	rec := &testenv.SQLRecorder{}
	db := o.Open(t, &gorm.Config{Logger: rec})
	if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
		t.Fatal(err)
	}
	testenv.MustExec(t, db,
		`WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 20000)
		 INSERT INTO outbox_messages (message_id, bucket, topic, record_value, created_at)
		 SELECT lower(hex(randomblob(16))), n % 8, 'orders', x'00', '2026-01-01 00:00:00' FROM g`)
	return db, rec
}
