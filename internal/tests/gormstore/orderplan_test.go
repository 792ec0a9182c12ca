package gormstore_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay"
	"gorm.io/gorm"
)

// orderPlanRows and orderPlanBuckets size the table of
// TestNextInOrderReadsThePrimaryKeyInOrder: a shallow backlog over many
// buckets.
const (
	orderPlanRows    = 64_000
	orderPlanBuckets = 4096
)

// TestNextInOrderReadsThePrimaryKeyInOrder: with a shallow backlog of
// 64,000 rows over 4,096 buckets (1000 keys, the first 100 rows parked, so
// that the hold subquery runs per row), NextInOrder for the 4,096 buckets
// less a few holes is one statement that reads the table in id order and
// stops at its limit, whatever the bucket count: on PostgreSQL an index
// scan of the primary key, no sort, no bitmap (with the statistics of the
// table before the backlog, for the custom plan and the generic plan a
// driver's cached statement may get, and with the backlog's statistics); on MySQL and MariaDB the PRIMARY key,
// no filesort; on SQLite a scan of the table in rowid order, no temporary
// b-tree. The hold subquery reads the (bucket, parked_at_ms, id) index.
// The plans and times are logged. Skipped with -short.
func TestNextInOrderReadsThePrimaryKeyInOrder(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a table of 64,000 rows")
	}
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			rec := &testenv.SQLRecorder{}
			db := o.Open(t, &gorm.Config{Logger: rec})
			cfg := outbox.Config{BucketCount: orderPlanBuckets}
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
				r := strings.NewReplacer("{buckets}", fmt.Sprint(orderPlanBuckets), "{from}", fmt.Sprint(from), "{to}", fmt.Sprint(to))
				testenv.MustExec(t, db, r.Replace(fill))
			}
			if o.Name == testenv.Postgres {
				// Statistics of a small table.
				testenv.MustExec(t, db, "ALTER TABLE outbox_messages SET (autovacuum_enabled = false)")
				fillRows(0, 639)
				testenv.MustExec(t, db, "ANALYZE outbox_messages")
				fillRows(640, orderPlanRows-1)
			} else {
				fillRows(0, orderPlanRows-1)
			}
			var first int64
			if err := db.Raw("SELECT MIN(id) FROM outbox_messages").Scan(&first).Error; err != nil {
				t.Fatal(err)
			}
			testenv.MustExec(t, db, fmt.Sprintf("UPDATE outbox_messages SET parked_at_ms = 1, parked_reason = 'test' WHERE id >= %d AND id < %d", first, first+100))
			switch o.Name {
			case testenv.MySQL:
				testenv.MustExec(t, db, "ANALYZE TABLE outbox_messages")
			case testenv.SQLite:
				testenv.MustExec(t, db, "ANALYZE")
			}
			obs := observe(db)
			store, err := gormstore.New(db, gormstore.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			holes := []int{17, 230, 1000, 1001, 1002, 1003, 4000}
			var buckets []int
			for b := range orderPlanBuckets {
				if !slices.Contains(holes, b) {
					buckets = append(buckets, b)
				}
			}
			req := relay.OrderedRequest{Buckets: buckets, Limit: 500}
			if _, err := store.NextInOrder(ctx, req); err != nil { // the first statement on MySQL asks the version
				t.Fatal(err)
			}
			rec.Reset()
			begin := time.Now()
			got, err := store.NextInOrder(ctx, req)
			took := time.Since(begin)
			if err != nil || len(got) != 500 {
				t.Fatalf("NextInOrder(%d buckets, limit 500) = %d rows, %v; want 500", len(buckets), len(got), err)
			}
			sent := obs.last(t, "NextInOrder", "ORDER BY m.id").SQL // as it went to the driver, with its bind variables
			stmts := rec.Statements()
			if o.Name == testenv.Postgres {
				stmts = []string{guardedSelect(t, "NextInOrder", stmts)}
			} else if len(stmts) != 1 {
				t.Fatalf("NextInOrder of %d buckets issued %d statements; want 1", len(buckets), len(stmts))
			}
			stmt := withoutTimeoutPrefix(stmts[0])
			var plan string
			if o.Name == testenv.Postgres {
				plan = explainAnalyzed(t, db, stmt, true)
			} else {
				plan = explainPlan(t, db, o.Name, stmt)
			}
			t.Logf("%s: NextInOrder of %d buckets, 500 rows, took %v; statement:\n%s\nplan:\n%s", o.Name, len(buckets), took, stmt, plan)
			if bad := orderPlanProblem(o.Name, plan); bad != "" {
				t.Fatalf("NextInOrder plan %s:\n%s", bad, plan)
			}
			if o.Name == testenv.Postgres {
				generic := preparedGenericPlan(t, db, sent, "int, int, text, int",
					fmt.Sprintf("0, %d, '{17,230,1000,1001,1002,1003,4000}', 500", orderPlanBuckets-1))
				t.Logf("generic plan:\n%s", generic)
				if bad := orderPlanProblem(o.Name, generic); bad != "" {
					t.Fatalf("NextInOrder generic plan %s:\n%s", bad, generic)
				}
				testenv.MustExec(t, db, "ANALYZE outbox_messages") // statistics of the backlog
				fresh := explainAnalyzed(t, db, stmt, true)
				t.Logf("plan with the backlog's statistics:\n%s", fresh)
				if bad := orderPlanProblem(o.Name, fresh); bad != "" {
					t.Fatalf("NextInOrder plan with the backlog's statistics %s:\n%s", bad, fresh)
				}
			}
		})
	}
}

// orderPlanProblem says what is wrong with a NextInOrder plan on dialect:
// anything but the primary key (the rowid) in order, the hold subquery on
// the bucket index; "" when nothing is.
func orderPlanProblem(dialect, plan string) string {
	const idx = "idx_outbox_messages_bucket_parked_id"
	switch dialect {
	case testenv.Postgres:
		if strings.Contains(plan, "Sort") || strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Bitmap") {
			return "sorts, scans the table or reads a bitmap"
		}
		if !strings.Contains(plan, "Index Scan using outbox_messages_pkey on outbox_messages m") {
			return "does not read the primary key"
		}
		if !strings.Contains(plan, idx) {
			return "does not read the bucket index for the hold"
		}
	case testenv.MySQL:
		if strings.Contains(plan, "filesort") || strings.Contains(plan, "temporary") {
			return "sorts"
		}
		if !strings.Contains(plan, "key=PRIMARY") || !strings.Contains(plan, "key="+idx) {
			return "does not read the primary key, and the bucket index for the hold"
		}
	case testenv.SQLite:
		if strings.Contains(plan, "TEMP B-TREE") || strings.Contains(plan, "SCAN p") {
			return "sorts or scans the table for the hold"
		}
		if !strings.Contains(plan, "SCAN m\n") && !strings.HasSuffix(plan, "SCAN m") || !strings.Contains(plan, idx) {
			return "does not scan the table in rowid order, and the bucket index for the hold"
		}
	}
	return ""
}
