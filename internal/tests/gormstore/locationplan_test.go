package gormstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay"
	"gorm.io/gorm"
)

// postgresOpener returns the PostgreSQL test database, or skips t.
func postgresOpener(t *testing.T) testenv.Opener {
	t.Helper()
	for _, o := range testenv.Databases(t) {
		if o.Name == testenv.Postgres {
			return o
		}
	}
	t.Skip("OUTBOX_TEST_POSTGRES_DSN not set")
	return testenv.Opener{}
}

// byLocation marks gormstore's deletes by location: each listed ctid
// joined with the row's, its id compared with the row's.
const byLocation = "m.ctid = x.tid AND m.id + 0 = x.id"

// TestHotPathDeletesByLocationAfterADrainWasAnalyzed: ANALYZE of a drained
// table records no rows in many pages, and PostgreSQL then believes every
// later backlog empty until the table is analyzed again. In that state the
// generic plan of the delete by id read the ids out of the (bucket,
// parked_at_ms, id) index, a scan of the whole index per id (2.2 s for 182
// rows of a 200,000-row backlog), and MIN(bucket) and MAX(bucket)
// aggregated a scan of the whole index (540-940 ms). MarkPublished and
// MarkPublishedBuckets must delete the rows NextBatch and NextBatches read
// in one statement each, by a TID scan in its custom and its generic plan
// that compares each row found with the id listed with its location,
// and the acquisition round's probe of the bucket range must read only the
// index's ends.
func TestHotPathDeletesByLocationAfterADrainWasAnalyzed(t *testing.T) {
	pg := postgresOpener(t)
	rec := &testenv.SQLRecorder{}
	db := pg.Open(t, &gorm.Config{Logger: rec})
	if err := outbox.AutoMigrate(db, outbox.Config{BucketCount: 64}); err != nil {
		t.Fatal(err)
	}
	fill := `INSERT INTO outbox_messages (message_id, bucket, topic, record_value, created_at)
		 SELECT gen_random_uuid(), g % 64, 'orders', '\x00'::bytea, now() FROM generate_series(1, 50000) g`
	testenv.MustExec(t, db,
		"ALTER TABLE outbox_messages SET (autovacuum_enabled = false)",
		fill, "DELETE FROM outbox_messages", "ANALYZE outbox_messages", fill)
	var stats struct {
		Relpages  int64
		Reltuples float64
	}
	if err := db.Raw("SELECT relpages, reltuples FROM pg_class WHERE relname = 'outbox_messages'").Scan(&stats).Error; err != nil {
		t.Fatal(err)
	}
	if stats.Reltuples != 0 || stats.Relpages == 0 {
		t.Fatalf("statistics: %d pages, %v rows; want rows 0 in many pages", stats.Relpages, stats.Reltuples)
	}
	obs := observe(db) // the statements by location as they go to the driver, with their bind variables
	store, err := gormstore.New(db, gormstore.Options{Config: outbox.Config{BucketCount: 64}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	onlyStatement := func(what, want string) string {
		t.Helper()
		stmts := rec.Statements()
		if len(stmts) != 1 || !strings.Contains(stmts[0], want) {
			t.Fatalf("%s issued %q; want one statement with %q", what, stmts, want)
		}
		return stmts[0]
	}
	gone := func(what string, msgs []*outbox.Message) {
		t.Helper()
		ids := make([]int64, len(msgs))
		for i, m := range msgs {
			ids[i] = m.ID
		}
		var n int64
		if err := db.Table("outbox_messages").Where("id IN ?", ids).Count(&n).Error; err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("%s left %d of its %d rows", what, n, len(ids))
		}
	}
	// One bucket.
	rec.Reset()
	batch, err := nextBatch(ctx, store, 5, 200, 0)
	if err != nil || len(batch) != 200 {
		t.Fatalf("NextBatch = %d rows, %v; want 200", len(batch), err)
	}
	rec.Reset()
	if err := store.MarkPublished(ctx, batch); err != nil {
		t.Fatal(err)
	}
	del := onlyStatement("MarkPublished", byLocation)
	byBucket := obs.last(t, "MarkPublished", byLocation).SQL
	gone("MarkPublished", batch)
	tids, ids := nextLocations(t, db, 200, 6)
	requireTIDLookups(t, "MarkPublished's custom plan", explainPlan(t, db, testenv.Postgres, byBucket, 6, tids, ids))
	requireTIDLookups(t, "MarkPublished's generic plan", preparedGenericPlan(t, db, byBucket, "int, text, text", fmt.Sprintf("6, '%s', '%s'", tids, ids)))
	t.Logf("MarkPublished: %.200s…", del)

	// A group of buckets.
	reqs := []relay.BatchRequest{{Buckets: []int{7}, Limit: 60}, {Buckets: []int{8}, Limit: 60}, {Buckets: []int{9}, Limit: 60}}
	results, err := store.NextBatches(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	var rows []*outbox.Message
	for i, r := range results {
		if r.Err != nil || len(r.Rows) != 60 {
			t.Fatalf("NextBatches, bucket %d: %d rows, %v; want 60", reqs[i].Buckets[0], len(r.Rows), r.Err)
		}
		rows = append(rows, r.Rows...)
	}
	rec.Reset()
	if err := store.MarkPublished(ctx, rows); err != nil {
		t.Fatal(err)
	}
	onlyStatement("MarkPublishedBuckets", byLocation)
	byBuckets := obs.last(t, "MarkPublishedBuckets", byLocation).SQL
	gone("MarkPublishedBuckets", rows)
	tids, ids = nextLocations(t, db, 60, 10, 11, 12)
	requireTIDLookups(t, "MarkPublishedBuckets' custom plan", explainPlan(t, db, testenv.Postgres, byBuckets, tids, ids))
	requireTIDLookups(t, "MarkPublishedBuckets' generic plan", preparedGenericPlan(t, db, byBuckets, "text, text", fmt.Sprintf("'%s', '%s'", tids, ids)))

	// The bucket range probe of an acquisition round.
	rec.Reset()
	if _, err := store.AcquireBucketLeases(ctx, "relay-a", 64, time.Minute); err != nil {
		t.Fatal(err)
	}
	var probe string
	for _, st := range rec.Statements() {
		if strings.Contains(st, "ORDER BY bucket DESC LIMIT 1") || strings.Contains(st, "MAX(bucket)") {
			probe = st
		}
	}
	if probe == "" {
		t.Fatalf("no probe of the bucket range among the round's statements:\n%s", strings.Join(rec.Statements(), "\n"))
	}
	plan := explainPlan(t, db, testenv.Postgres, probe)
	t.Logf("%s\n%s", probe, plan)
	if strings.Contains(plan, "Aggregate") || strings.Contains(plan, "Seq Scan") || strings.Count(plan, "Limit") != 2 {
		t.Fatalf("the probe of the bucket range does not read the index's two ends:\n%s\n%s", probe, plan)
	}
}

// requireTIDLookups fails t unless plan (PostgreSQL's EXPLAIN of a delete
// by location) finds its rows by TID lookups alone: no sequential or index
// scan, no join that compares rows with the list, no list searched for
// each row found (a generic plan's = ANY is linear).
func requireTIDLookups(t *testing.T, what, plan string) {
	t.Helper()
	t.Logf("%s:\n%s", what, plan)
	if !strings.Contains(plan, "Tid Scan on outbox_messages") || strings.Contains(plan, "Index") || strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Join Filter") {
		t.Fatalf("%s is not a TID lookup per row:\n%s", what, plan)
	}
	for _, line := range strings.Split(plan, "\n") {
		if strings.Contains(line, "ANY") && !strings.Contains(line, "TID Cond: (ctid = ANY") {
			t.Fatalf("%s searches a list for each row it finds (a generic plan's = ANY is linear):\n%s", what, plan)
		}
	}
}

// nextLocations returns the next rows of buckets (n each) of
// outbox_messages as the arguments of the statements by location: their
// ctids and their ids.
func nextLocations(t *testing.T, db *gorm.DB, n int, buckets ...int) (tids, ids string) {
	t.Helper()
	var r struct{ Tids, Ids string }
	if err := db.Raw(`SELECT array_agg(ctid)::text AS tids, array_agg(id)::text AS ids FROM
		(SELECT ctid, id, row_number() OVER (PARTITION BY bucket ORDER BY id) AS k FROM outbox_messages WHERE bucket IN ?) x
		WHERE k <= ?`, buckets, n).Scan(&r).Error; err != nil {
		t.Fatal(err)
	}
	return r.Tids, r.Ids
}

// TestDeleteByLocationIsATIDLookupWhateverTheTableSize: MarkPublished and
// MarkPublishedBuckets delete by a TID lookup per row in their custom and
// generic plans also when the table is small enough for the planner to
// prefer reading it whole, with fresh statistics. As a join of the table
// with the listed locations, the planner estimated the guarded table at
// one row and compared every row of the bucket with every location: 1.2 s
// to delete 2,000 rows of 20,000 1 KiB rows (a drain with BatchSize 2000),
// 0.66 s for 1,000 of 60,000 200-byte rows, against 3-8 ms by TID.
func TestDeleteByLocationIsATIDLookupWhateverTheTableSize(t *testing.T) {
	pg := postgresOpener(t)
	db := pg.Open(t, &gorm.Config{Logger: &testenv.SQLRecorder{}}) // observe sees the statements the logger is shown
	cfg := outbox.Config{BucketCount: 8}
	if err := outbox.AutoMigrate(db, cfg); err != nil {
		t.Fatal(err)
	}
	testenv.MustExec(t, db, "ALTER TABLE outbox_messages SET (autovacuum_enabled = false)")
	obs := observe(db)
	store, err := gormstore.New(db, gormstore.Options{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []struct{ rows, valueSize, batch int }{{20000, 1024, 2000}, {60000, 200, 1000}} {
		t.Run(fmt.Sprintf("%d_rows_of_%d_bytes_batch_%d", c.rows, c.valueSize, c.batch), func(t *testing.T) {
			testenv.MustExec(t, db, "TRUNCATE outbox_messages",
				fmt.Sprintf(`INSERT INTO outbox_messages (message_id, bucket, topic, record_value, created_at)
					SELECT gen_random_uuid(), g %% 8, 'orders', convert_to(repeat('v', %d), 'UTF8'), now() FROM generate_series(1, %d) g`, c.valueSize, c.rows),
				"ANALYZE outbox_messages")
			count := func() int64 {
				t.Helper()
				var n int64
				if err := db.Table("outbox_messages").Count(&n).Error; err != nil {
					t.Fatal(err)
				}
				return n
			}

			batch, err := nextBatch(ctx, store, 3, c.batch, 0)
			if err != nil || len(batch) != c.batch {
				t.Fatalf("NextBatch = %d rows, %v; want %d", len(batch), err, c.batch)
			}
			if err := store.MarkPublished(ctx, batch); err != nil {
				t.Fatal(err)
			}
			if n := count(); n != int64(c.rows-c.batch) {
				t.Fatalf("MarkPublished of %d rows left %d of %d", c.batch, n, c.rows)
			}
			byBucket := obs.last(t, "MarkPublished", byLocation).SQL
			tids, ids := nextLocations(t, db, c.batch, 4)
			requireTIDLookups(t, "MarkPublished's custom plan", explainPlan(t, db, testenv.Postgres, byBucket, 4, tids, ids))
			requireTIDLookups(t, "MarkPublished's generic plan", preparedGenericPlan(t, db, byBucket, "int, text, text", fmt.Sprintf("4, '%s', '%s'", tids, ids)))

			results, err := store.NextBatches(ctx, []relay.BatchRequest{{Buckets: []int{5}, Limit: c.batch / 2}, {Buckets: []int{6}, Limit: c.batch / 2}})
			if err != nil {
				t.Fatal(err)
			}
			var rows []*outbox.Message
			for _, r := range results {
				rows = append(rows, r.Rows...)
			}
			if len(rows) != c.batch {
				t.Fatalf("NextBatches = %d rows; want %d", len(rows), c.batch)
			}
			if err := store.MarkPublished(ctx, rows); err != nil {
				t.Fatal(err)
			}
			if n := count(); n != int64(c.rows-2*c.batch) {
				t.Fatalf("MarkPublishedBuckets of %d rows left %d of %d", c.batch, n, c.rows-c.batch)
			}
			byBuckets := obs.last(t, "MarkPublishedBuckets", byLocation).SQL
			tids, ids = nextLocations(t, db, c.batch/2, 7, 0)
			requireTIDLookups(t, "MarkPublishedBuckets' custom plan", explainPlan(t, db, testenv.Postgres, byBuckets, tids, ids))
			requireTIDLookups(t, "MarkPublishedBuckets' generic plan", preparedGenericPlan(t, db, byBuckets, "text, text", fmt.Sprintf("'%s', '%s'", tids, ids)))
		})
	}
}

// threeRowsRead writes three pending rows into bucket of db's
// outbox_messages (4 buckets) and returns a Store that read them with
// NextBatch, and the batch.
func threeRowsRead(t *testing.T, db *gorm.DB, bucket int) (*gormstore.Store, []*outbox.Message) {
	t.Helper()
	for range 3 {
		if err := raw(db).Table("outbox_messages").Create(pendingMessage(int32(bucket))).Error; err != nil {
			t.Fatal(err)
		}
	}
	store, err := gormstore.New(db, gormstore.Options{Config: outbox.Config{BucketCount: 4}})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := nextBatch(context.Background(), store, bucket, 10, 0)
	if err != nil || len(batch) != 3 {
		t.Fatalf("NextBatch = %d rows, %v; want 3", len(batch), err)
	}
	return store, batch
}

// TestDeleteByLocationNeverDeletesAnotherRow: a row read by NextBatch that
// is gone before MarkPublished (another relay published and deleted it
// after a rebalance) and whose slot a new row took after a VACUUM must not
// take the new row with it; a row that moved (an UPDATE) is deleted all the
// same, by id.
func TestDeleteByLocationNeverDeletesAnotherRow(t *testing.T) {
	pg := postgresOpener(t)
	db := pg.Open(t, nil)
	if err := outbox.AutoMigrate(db, outbox.Config{BucketCount: 4}); err != nil {
		t.Fatal(err)
	}
	testenv.MustExec(t, db, "ALTER TABLE outbox_messages SET (autovacuum_enabled = false)")
	ctx := context.Background()
	store, batch := threeRowsRead(t, db, 1)
	ctid := func(id int64) string {
		t.Helper()
		var c string
		if err := db.Raw("SELECT ctid::text FROM outbox_messages WHERE id = ?", id).Scan(&c).Error; err != nil {
			t.Fatal(err)
		}
		return c
	}
	gone, moved := batch[0], batch[1]
	slot := ctid(gone.ID)
	testenv.MustExec(t, db,
		fmt.Sprintf("UPDATE outbox_messages SET topic = 'moved' WHERE id = %d", moved.ID),
		fmt.Sprintf("DELETE FROM outbox_messages WHERE id = %d", gone.ID),
		"VACUUM outbox_messages")
	newcomer := pendingMessage(1)
	if err := raw(db).Table("outbox_messages").Create(newcomer).Error; err != nil {
		t.Fatal(err)
	}
	if got := ctid(newcomer.ID); got != slot {
		t.Fatalf("the new row is at %s, not in the freed slot %s: the test needs it there", got, slot)
	}
	if err := store.MarkPublished(ctx, batch); err != nil {
		t.Fatal(err)
	}
	var left []int64
	if err := db.Table("outbox_messages").Order("id").Pluck("id", &left).Error; err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0] != newcomer.ID {
		t.Fatalf("rows left %v; want only the new row %d (the moved row %d deleted by id, the new row in the gone row's slot kept)", left, newcomer.ID, moved.ID)
	}
}

// TestDeleteByLocationKeepsARowParkedWhileItWaited: a row parked by another
// transaction while MarkPublished waits for its lock is not deleted: the
// delete checks its conditions again on the row's latest version, which
// is parked and at a new location.
func TestDeleteByLocationKeepsARowParkedWhileItWaited(t *testing.T) {
	pg := postgresOpener(t)
	db := pg.Open(t, nil)
	if err := outbox.AutoMigrate(db, outbox.Config{BucketCount: 4}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	store, batch := threeRowsRead(t, db, 2)
	parked := batch[1]
	parker := db.Begin()
	if err := parker.Exec("UPDATE outbox_messages SET parked_at_ms = 1, parked_reason = 'poison' WHERE id = ?", parked.ID).Error; err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- store.MarkPublished(ctx, batch) }()
	for waiting := int64(0); waiting == 0; {
		if err := db.Raw("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'DELETE%'").Scan(&waiting).Error; err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			t.Fatalf("MarkPublished returned (%v) without waiting for the parking transaction's lock", err)
		case <-time.After(2 * time.Millisecond): // the next look at pg_stat_activity
		}
	}
	if err := parker.Commit().Error; err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var left []int64
	if err := db.Table("outbox_messages").Order("id").Pluck("id", &left).Error; err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0] != parked.ID {
		t.Fatalf("rows left %v; want only the row parked meanwhile, %d", left, parked.ID)
	}
}
