package gormstore_test

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay"
	"gorm.io/gorm"
)

// fetchGuard is the setting NextBatch and NextBatches run their SELECT
// under on PostgreSQL, in the same transaction (see gormstore's fetch).
const fetchGuard = "SELECT set_config('enable_bitmapscan', 'off', true)"

// explainAnalyzed returns EXPLAIN (ANALYZE, BUFFERS) of stmt, a statement
// as the recorder saw it (its values in place), in a transaction rolled
// back at the end, under fetchGuard when guarded (a fetch as the store runs
// it on PostgreSQL).
func explainAnalyzed(t *testing.T, db *gorm.DB, stmt string, guarded bool) string {
	t.Helper()
	var plan []string
	err := db.Transaction(func(tx *gorm.DB) error {
		if guarded {
			if err := tx.Exec(fetchGuard).Error; err != nil {
				return err
			}
		}
		if err := tx.Raw("EXPLAIN (ANALYZE, BUFFERS) " + stmt).Scan(&plan).Error; err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	return strings.Join(plan, "\n")
}

// planBuffers returns the shared buffers (hit and read) of a plan's top
// node.
func planBuffers(t *testing.T, plan string) int {
	t.Helper()
	m := regexp.MustCompile(`Buffers: shared((?: \w+=\d+)+)`).FindStringSubmatch(plan)
	if m == nil {
		t.Fatalf("no buffers in the plan:\n%s", plan)
	}
	n := 0
	for _, kv := range strings.Fields(m[1]) {
		if k, v, _ := strings.Cut(kv, "="); k == "hit" || k == "read" {
			c, _ := strconv.Atoi(v)
			n += c
		}
	}
	return n
}

// guardedSelect returns the SELECT of a fetch the recorder saw, failing t
// unless the fetch ran it right after fetchGuard.
func guardedSelect(t *testing.T, what string, stmts []string) string {
	t.Helper()
	if len(stmts) != 2 || stmts[0] != fetchGuard || !strings.HasPrefix(stmts[1], "SELECT") {
		t.Fatalf("%s issued %q; want %q, then its SELECT", what, stmts, fetchGuard)
	}
	return stmts[1]
}

// TestHotPathFetchesInIndexOrderWhenStatisticsSayEmpty: statistics of a
// drained outbox table (ANALYZE of it empty: no rows in its pages, the
// column statistics of an earlier backlog kept) make PostgreSQL estimate a
// bucket of a new backlog at one row; it then plans NextBatch's SELECT as a
// bitmap scan of the whole bucket and a sort (200-270 ms for 500 of 25,000
// rows, against 1-5 ms by the index). The state lasts until autovacuum
// analyzes the table again — in the benchmark, two drains in eleven ran
// seven times slower. NextBatch and NextBatches must read the index in
// order, touching about as many buffers as rows they return.
func TestHotPathFetchesInIndexOrderWhenStatisticsSayEmpty(t *testing.T) {
	pg := postgresOpener(t)
	rec := &testenv.SQLRecorder{}
	db := pg.Open(t, &gorm.Config{Logger: rec})
	if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
		t.Fatal(err)
	}
	backlogOnEmptyStatistics(t, db)
	store, err := gormstore.New(db, gormstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	inOrder := func(what, stmt string, rows int) {
		t.Helper()
		t.Logf("%s, without the guard (for comparison):\n%s", what, explainAnalyzed(t, db, stmt, false))
		plan := explainAnalyzed(t, db, stmt, true)
		t.Logf("%s, as the store runs it:\n%s", what, plan)
		if !strings.Contains(plan, "Index Scan using idx_outbox_messages_bucket_parked_id on outbox_messages m") ||
			strings.Contains(plan, "Bitmap") || strings.Contains(plan, "Sort") || strings.Contains(plan, "Seq Scan") {
			t.Fatalf("%s does not read (bucket, parked_at_ms, id) in order:\n%s", what, plan)
		}
		if n := planBuffers(t, plan); n > 2*rows {
			t.Fatalf("%s touched %d buffers for %d rows; want at most %d:\n%s", what, n, rows, 2*rows, plan)
		}
	}

	rec.Reset()
	batch, err := nextBatch(ctx, store, 3, 500, 0)
	if err != nil || len(batch) != 500 {
		t.Fatalf("NextBatch = %d rows, %v; want 500", len(batch), err)
	}
	inOrder("NextBatch", guardedSelect(t, "NextBatch", rec.Statements()), 500)

	rec.Reset()
	reqs := []relay.BatchRequest{{Buckets: []int{4}, Limit: 100}, {Buckets: []int{5}, Limit: 100}, {Buckets: []int{6}, Limit: 100}}
	results, err := store.NextBatches(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range results {
		if r.Err != nil || len(r.Rows) != 100 {
			t.Fatalf("NextBatches, bucket %d: %d rows, %v; want 100", reqs[i].Buckets[0], len(r.Rows), r.Err)
		}
	}
	inOrder("NextBatches", guardedSelect(t, "NextBatches", rec.Statements()), 300)

	// The relay's fetches while the previous batch's delete runs: that
	// batch is left out by the statement, its rows passed over in the index.
	rec.Reset()
	results, err = store.NextBatches(ctx, []relay.BatchRequest{{Buckets: []int{3}, Limit: 500, Exclude: batch}})
	if err != nil || results[0].Err != nil || len(results[0].Rows) != 500 || results[0].Rows[0].ID <= batch[len(batch)-1].ID {
		t.Fatalf("NextBatches without the previous batch = %d rows, %v, %v; want the 500 after it", len(results[0].Rows), err, results[0].Err)
	}
	inOrder("NextBatch leaving out a batch", guardedSelect(t, "NextBatch leaving out a batch", rec.Statements()), 1000)
	rec.Reset()
	reqs = []relay.BatchRequest{{Buckets: []int{3}, Limit: 100, Exclude: batch}, {Buckets: []int{4}, Limit: 100}, {Buckets: []int{5}, Limit: 100}}
	if results, err = store.NextBatches(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	for i, r := range results {
		if r.Err != nil || len(r.Rows) != 100 {
			t.Fatalf("NextBatches leaving out a batch, bucket %d: %d rows, %v; want 100", reqs[i].Buckets[0], len(r.Rows), r.Err)
		}
	}
	inOrder("NextBatches leaving out a batch", guardedSelect(t, "NextBatches leaving out a batch", rec.Statements()), 800)
}

// backlogOnEmptyStatistics fills db's outbox_messages with 80,000 rows in
// 8 buckets on statistics of the table drained: ANALYZE of it empty (no
// rows in its pages), the column statistics of an earlier backlog kept,
// autovacuum off.
func backlogOnEmptyStatistics(t *testing.T, db *gorm.DB) {
	t.Helper()
	fill := `INSERT INTO outbox_messages (message_id, bucket, topic, record_value, created_at)
		 SELECT gen_random_uuid(), g % 8, 'orders', convert_to(repeat('x', 200), 'UTF8'), now() FROM generate_series(1, 80000) g`
	testenv.MustExec(t, db,
		"ALTER TABLE outbox_messages SET (autovacuum_enabled = false)",
		fill, "ANALYZE outbox_messages", "DELETE FROM outbox_messages", "ANALYZE outbox_messages", fill)
	var stats struct {
		Relpages  int64
		Reltuples float64
		Columns   int
	}
	if err := db.Raw(`SELECT relpages, reltuples, (SELECT COUNT(*) FROM pg_stats WHERE tablename = 'outbox_messages') AS columns
		FROM pg_class WHERE relname = 'outbox_messages'`).Scan(&stats).Error; err != nil {
		t.Fatal(err)
	}
	if stats.Reltuples != 0 || stats.Relpages == 0 || stats.Columns == 0 {
		t.Fatalf("statistics: %d pages, %v rows, %d columns; want rows 0 in many pages, the columns' kept", stats.Relpages, stats.Reltuples, stats.Columns)
	}
}

// TestHotPathFetchesRunUnderTheirGuard: the guard and the fetch are sent
// together (one pgx batch), and the guard must be in effect when
// PostgreSQL plans the fetch, not merely sent. On statistics that say the
// table is empty, a fetch planned without it is a bitmap scan, which
// fetches no row through the index (pg_stat_user_indexes.idx_tup_fetch
// counts plain index scans' rows only); planned with it, the index scan
// fetches each row it returns. On a pool GORM wraps (not a *sql.DB) the
// fetch runs in a transaction after the guard.
func TestHotPathFetchesRunUnderTheirGuard(t *testing.T) {
	pg := postgresOpener(t)
	for _, tc := range []struct {
		name string
		cfg  *gorm.Config
	}{
		{"one pgx batch", nil},
		{"a transaction, on a pool GORM wraps (PrepareStmt)", &gorm.Config{PrepareStmt: true}},
	} {
		t.Run(tc.name, func(t *testing.T) { fetchesRunUnderTheirGuard(t, pg.Open(t, tc.cfg)) })
	}
}

func fetchesRunUnderTheirGuard(t *testing.T, db *gorm.DB) {
	if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
		t.Fatal(err)
	}
	backlogOnEmptyStatistics(t, db)
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	sqlDB.SetMaxOpenConns(1) // the store's fetch and the statistics' flush on one backend
	fetched := func() int64 {
		t.Helper()
		var n int64
		if err := db.Exec("SELECT pg_stat_force_next_flush()").Error; err != nil {
			t.Fatal(err)
		}
		if err := db.Raw("SELECT idx_tup_fetch FROM pg_stat_user_indexes WHERE indexrelname = 'idx_outbox_messages_bucket_parked_id'").Row().Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if plan := explainAnalyzed(t, db, "SELECT id FROM outbox_messages m WHERE bucket >= 3 AND bucket <= 3 AND parked_at_ms IS NULL ORDER BY bucket, parked_at_ms, id LIMIT (SELECT 500)", false); !strings.Contains(plan, "Bitmap") {
		t.Fatalf("unguarded, a fetch is not a bitmap scan on these statistics; the test proves nothing:\n%s", plan)
	}
	store, err := gormstore.New(db, gormstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	before := fetched()
	batch, err := nextBatch(ctx, store, 3, 500, 0)
	if err != nil || len(batch) != 500 {
		t.Fatalf("NextBatch = %d rows, %v; want 500", len(batch), err)
	}
	if n := fetched() - before; n < 500 {
		t.Fatalf("NextBatch fetched %d rows through the (bucket, parked_at_ms, id) index; want its 500: it was not planned under the guard", n)
	}
	before = fetched()
	results, err := store.NextBatches(ctx, []relay.BatchRequest{{Buckets: []int{4}, Limit: 100}, {Buckets: []int{5}, Limit: 100}, {Buckets: []int{6}, Limit: 100}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if r.Err != nil || len(r.Rows) != 100 {
			t.Fatalf("NextBatches: %d rows, %v; want 100", len(r.Rows), r.Err)
		}
	}
	if n := fetched() - before; n < 300 {
		t.Fatalf("NextBatches fetched %d rows through the (bucket, parked_at_ms, id) index; want its 300: it was not planned under the guard", n)
	}
	var setting string // the pool's one connection: the guard ended with the fetch
	if err := db.Raw("SHOW enable_bitmapscan").Row().Scan(&setting); err != nil || setting != "on" {
		t.Fatalf("after the fetches, the connection's enable_bitmapscan = %q, %v; want on: the guard outlived its fetch", setting, err)
	}
}
