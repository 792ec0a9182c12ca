package gormstore_test

import (
	"context"
	"errors"
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

// multiPlanRows and multiPlanBuckets size the table of
// TestNextBatchesReadsEachBucketByItsIndex.
const (
	multiPlanRows    = 128_000
	multiPlanBuckets = 64
)

// TestNextBatchesReadsEachBucketByItsIndex: with a backlog of 128,000 rows
// in 64 buckets (1000 keys, the first 100 rows parked: one or two at the
// head of every bucket, so that every bucket's hold condition runs per
// row), NextBatches for the 64 buckets is one statement whose plan reads
// each bucket's head from the (bucket, parked_at_ms, id) index in order —
// no sort, no scan of the table — with its hold subqueries on that index
// too; on PostgreSQL with the statistics of the table before the backlog
// (ANALYZE at 640 rows, autovacuum off), for the custom plan and for the
// generic plan a driver's cached statement may get. MarkPublishedBuckets of
// the 64 batches' rows looks each id up in the primary key (PostgreSQL:
// the pkey index, not the bucket index; MariaDB: key=PRIMARY; SQLite: the
// rowid). The plans and times are logged. Skipped with -short.
func TestNextBatchesReadsEachBucketByItsIndex(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a table of 128,000 rows")
	}
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			rec := &testenv.SQLRecorder{}
			db := o.Open(t, &gorm.Config{Logger: rec})
			cfg := outbox.Config{BucketCount: multiPlanBuckets}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				t.Fatal(err)
			}
			fill := map[string]string{
				testenv.Postgres: `INSERT INTO outbox_messages (message_id, bucket, topic, record_key, record_value, created_at)
				 SELECT gen_random_uuid(), g % {buckets}, 'orders', convert_to('k' || (g % 1000), 'UTF8'), '\x00'::bytea, now()
				 FROM generate_series({from}, {to}) g`,
				testenv.MySQL: `INSERT INTO outbox_messages (message_id, bucket, topic, record_key, record_value, created_at)
				 WITH RECURSIVE d(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM d WHERE n < 999),
				 g(n) AS (SELECT a.n * 1000 + b.n FROM d a CROSS JOIN d b)
				 SELECT UUID(), n % {buckets}, 'orders', CONCAT('k', n % 1000), x'00', NOW(6) FROM g WHERE n >= {from} AND n <= {to}`,
				testenv.SQLite: `WITH RECURSIVE g(n) AS (SELECT {from} UNION ALL SELECT n + 1 FROM g WHERE n < {to})
				 INSERT INTO outbox_messages (message_id, bucket, topic, record_key, record_value, created_at)
				 SELECT lower(hex(randomblob(16))), n % {buckets}, 'orders', CAST('k' || (n % 1000) AS BLOB), x'00', '2026-01-01 00:00:00' FROM g`,
			}[o.Name]
			fillRows := func(from, to int) {
				t.Helper()
				r := strings.NewReplacer("{buckets}", fmt.Sprint(multiPlanBuckets), "{from}", fmt.Sprint(from), "{to}", fmt.Sprint(to))
				testenv.MustExec(t, db, r.Replace(fill))
			}
			begin := time.Now()
			if o.Name == testenv.Postgres {
				// Statistics of a small table: the planner believes a bucket
				// holds ten rows.
				testenv.MustExec(t, db, "ALTER TABLE outbox_messages SET (autovacuum_enabled = false)")
				fillRows(0, 10*multiPlanBuckets-1)
				testenv.MustExec(t, db, "ANALYZE outbox_messages")
				fillRows(10*multiPlanBuckets, multiPlanRows-1)
			} else {
				fillRows(0, multiPlanRows-1)
			}
			var first int64
			if err := db.Raw("SELECT MIN(id) FROM outbox_messages").Scan(&first).Error; err != nil {
				t.Fatal(err)
			}
			testenv.MustExec(t, db, fmt.Sprintf("UPDATE outbox_messages SET parked_at_ms = 1, parked_reason = 'test' WHERE id >= %d AND id < %d", first, first+100))
			if o.Name == testenv.MySQL {
				testenv.MustExec(t, db, "ANALYZE TABLE outbox_messages")
			}
			t.Logf("%s: %d rows in %d buckets, 100 parked, in %v", o.Name, multiPlanRows, multiPlanBuckets, time.Since(begin).Round(time.Millisecond))
			obs := observe(db)
			store, err := gormstore.New(db, gormstore.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			reqs := make([]relay.BatchRequest, multiPlanBuckets)
			for b := range reqs {
				reqs[b] = relay.BatchRequest{Buckets: []int{b}, Limit: 500}
			}
			if _, err := store.NextBatches(ctx, reqs); err != nil { // the first statement on MySQL asks the version
				t.Fatal(err)
			}
			rec.Reset()
			begin = time.Now()
			got, err := store.NextBatches(ctx, reqs)
			took := time.Since(begin)
			if err != nil {
				t.Fatal(err)
			}
			var batches []*outbox.Message
			for i, r := range got {
				if r.Err != nil || len(r.Rows) != 500 {
					t.Fatalf("NextBatches bucket %d = %d rows, %v; want 500", reqs[i].Buckets[0], len(r.Rows), r.Err)
				}
				batches = append(batches, r.Rows...)
			}
			sent := obs.last(t, "NextBatches", "SELECT").SQL // as it went to the driver, with its bind variables
			stmts := rec.Statements()
			if o.Name == testenv.Postgres {
				stmts = []string{guardedSelect(t, "NextBatches", stmts)}
			} else if len(stmts) != 1 {
				t.Fatalf("NextBatches of %d buckets issued %d statements; want 1", multiPlanBuckets, len(stmts))
			}
			stmt := stmts[0]
			if i := strings.Index(stmt, " FOR ("); strings.HasPrefix(stmt, "SET STATEMENT") && i > 0 {
				stmt = stmt[i+len(" FOR "):] // MariaDB's statement timeout prefix
			}
			var plan string
			if o.Name == testenv.Postgres {
				plan = explainAnalyzed(t, db, stmt, true)
			} else {
				plan = explainPlan(t, db, o.Name, stmt)
			}
			t.Logf("%s: NextBatches of %d buckets × 500 rows took %v; plan:\n%s", o.Name, multiPlanBuckets, took, plan)
			if bad := multiPlanProblem(o.Name, plan); bad != "" {
				t.Fatalf("NextBatches plan %s:\n%s\n%s", bad, stmts[0][:min(len(stmts[0]), 2000)], plan)
			}
			if o.Name == testenv.Postgres {
				buckets, limits := make([]string, multiPlanBuckets), make([]string, multiPlanBuckets)
				for b := range buckets {
					buckets[b], limits[b] = fmt.Sprint(b), "500"
				}
				generic := preparedGenericPlan(t, db, sent, "text, text",
					"'{"+strings.Join(buckets, ",")+"}', '{"+strings.Join(limits, ",")+"}'")
				t.Logf("generic plan:\n%s", generic)
				if bad := multiPlanProblem(o.Name, generic); bad != "" {
					t.Fatalf("NextBatches generic plan %s:\n%s", bad, generic)
				}
			}

			// The delete of every batch's rows, explained before it runs (as
			// a store that did not read them runs it: by id).
			del := deleteStatement(t, o, cfg, true, 0, ids(batches[:1000])) // one chunk
			stmt = del.SQL
			plan = explainPlan(t, db, o.Name, stmt, del.Args...)
			t.Logf("%s: MarkPublishedBuckets plan of 1000 ids:\n%s", o.Name, plan)
			if bad := deletePlanProblem(o.Name, plan); bad != "" {
				t.Fatalf("MarkPublishedBuckets plan %s:\n%s\n%s", bad, stmt[:min(len(stmt), 300)], plan)
			}
			begin = time.Now()
			if err := store.MarkPublished(ctx, batches); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: MarkPublishedBuckets of %d rows took %v", o.Name, len(batches), time.Since(begin))
		})
	}
}

// multiPlanProblem says what is wrong with a NextBatches plan of
// multiPlanBuckets buckets on dialect (see planProblem); "" when none.
func multiPlanProblem(dialect, plan string) string {
	const idx = "idx_outbox_messages_bucket_parked_id"
	if bad := planProblem(dialect, plan); bad != "" {
		return bad
	}
	switch dialect {
	case testenv.Postgres:
		if !strings.Contains(plan, "Function Scan on") || !strings.Contains(plan, "Nested Loop") {
			return "is not a nested loop over the requests"
		}
	case testenv.MySQL:
		if n := strings.Count(plan, "key="+idx); n < 3*multiPlanBuckets {
			return fmt.Sprintf("uses the index %d times; want 3 per bucket (its scan and both subqueries)", n)
		}
	case testenv.SQLite:
		if n := strings.Count(plan, idx); n < 3*multiPlanBuckets {
			return fmt.Sprintf("uses the index %d times; want 3 per bucket (its scan and both subqueries)", n)
		}
	}
	return ""
}

// deletePlanProblem says what is wrong with a MarkPublishedBuckets plan on
// dialect: anything but a lookup of each id in the primary key.
func deletePlanProblem(dialect, plan string) string {
	switch dialect {
	case testenv.Postgres:
		if !strings.Contains(plan, "outbox_messages_pkey") || strings.Contains(plan, "bucket_parked_id") || strings.Contains(plan, "Seq Scan") {
			return "is not a lookup in the primary key"
		}
	case testenv.MySQL:
		if !strings.Contains(plan, "key=PRIMARY") || strings.Contains(plan, "type=ALL") || strings.Count(plan, "\n") > 0 {
			return "is not a lookup in the primary key"
		}
	case testenv.SQLite:
		if !strings.Contains(plan, "INTEGER PRIMARY KEY") || strings.Contains(plan, "SCAN") {
			return "is not a lookup of the rowid"
		}
	}
	return ""
}

// preparedGenericPlan is PostgreSQL's generic plan of stmt (bind variables of
// types, run with args), as a driver's cached prepared statement may get.
func preparedGenericPlan(t *testing.T, db *gorm.DB, stmt, types, args string) string {
	t.Helper()
	var plan []string
	err := db.Connection(func(c *gorm.DB) error {
		if err := c.Exec("PREPARE multi_plan(" + types + ") AS " + stmt).Error; err != nil {
			return err
		}
		defer c.Exec("DEALLOCATE multi_plan")
		return c.Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec("SET LOCAL plan_cache_mode = force_generic_plan").Error; err != nil {
				return err
			}
			if err := tx.Raw("EXPLAIN (ANALYZE, BUFFERS) EXECUTE multi_plan(" + args + ")").Scan(&plan).Error; err != nil {
				return err
			}
			return errRollback
		})
	})
	if !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	return strings.Join(plan, "\n")
}
