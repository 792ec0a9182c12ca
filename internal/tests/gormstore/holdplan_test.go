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
	"gorm.io/gorm"
)

// holdPlanRows is the table size of TestNextBatchWithParkedKeysStaysOnTheIndex.
const holdPlanRows = 1_000_000

// TestNextBatchWithParkedKeysStaysOnTheIndex (issue 27): with 1,000,000
// rows (1000 keys, 8 buckets) and the first row of 100 keys parked at the
// heads of their buckets, NextBatch's statement, whose hold condition looks
// up the parked rows of each row's key, is planned on every database as an
// in-order scan of the (bucket, parked_at_ms, id) index with its subqueries
// on that index too: no sort, no scan of the table. The batch holds no row
// of a parked key. The plan and the batch's time are logged. Skipped with
// -short.
func TestNextBatchWithParkedKeysStaysOnTheIndex(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a table of 1,000,000 rows")
	}
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			rec := &testenv.SQLRecorder{}
			db := o.Open(t, &gorm.Config{Logger: rec})
			if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
				t.Fatal(err)
			}
			fill := map[string][]string{
				testenv.Postgres: {`INSERT INTO outbox_messages (message_id, bucket, topic, record_key, record_value, created_at)
				 SELECT gen_random_uuid(), g % 8, 'orders', convert_to('k' || (g % 1000), 'UTF8'), '\x00'::bytea, now()
				 FROM generate_series(1, {rows}) g`, "ANALYZE outbox_messages"},
				testenv.MySQL: {`INSERT INTO outbox_messages (message_id, bucket, topic, record_key, record_value, created_at)
				 WITH RECURSIVE d(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM d WHERE n < 999),
				 g(n) AS (SELECT a.n * 1000 + b.n + 1 FROM d a CROSS JOIN d b WHERE a.n * 1000 + b.n < {rows})
				 SELECT UUID(), n % 8, 'orders', CONCAT('k', n % 1000), x'00', NOW(6) FROM g`, "ANALYZE TABLE outbox_messages"},
				testenv.SQLite: {`WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {rows})
				 INSERT INTO outbox_messages (message_id, bucket, topic, record_key, record_value, created_at)
				 SELECT lower(hex(randomblob(16))), n % 8, 'orders', CAST('k' || (n % 1000) AS BLOB), x'00', '2026-01-01 00:00:00' FROM g`, "ANALYZE"},
			}[o.Name]
			start := time.Now()
			testenv.MustExec(t, db, strings.ReplaceAll(fill[0], "{rows}", fmt.Sprint(holdPlanRows)))
			var first int64
			if err := db.Raw("SELECT MIN(id) FROM outbox_messages").Scan(&first).Error; err != nil {
				t.Fatal(err)
			}
			// Rows first..first+99 are the first rows of 100 keys (key n % 1000,
			// bucket n % 8: each key lives in one bucket).
			testenv.MustExec(t, db, fmt.Sprintf("UPDATE outbox_messages SET parked_at_ms = 1, parked_reason = 'test' WHERE id >= %d AND id < %d", first, first+100), fill[1])
			t.Logf("%s: %d rows, 100 parked, in %v", o.Name, holdPlanRows, time.Since(start).Round(time.Millisecond))
			var parkedKeys []string
			if err := db.Raw("SELECT record_key FROM outbox_messages WHERE parked_at_ms IS NOT NULL AND bucket = 0").Pluck("record_key", &parkedKeys).Error; err != nil {
				t.Fatal(err)
			}
			obs := observe(db)
			store, err := gormstore.New(db, gormstore.Options{})
			if err != nil {
				t.Fatal(err)
			}

			rec.Reset()
			begin := time.Now()
			batch, err := nextBatch(context.Background(), store, 0, 500, 0)
			took := time.Since(begin)
			if err != nil || len(batch) != 500 {
				if o.Name == testenv.MySQL {
					if st, ok := obs.find("SELECT"); ok { // the statement as it ran, with its arguments
						t.Logf("plan:\n%s", explainPlan(t, db, o.Name, st.SQL, st.Args...))
					}
				}
				t.Fatalf("NextBatch = %d rows, %v; want 500", len(batch), err)
			}
			for i, m := range batch {
				for _, k := range parkedKeys {
					if string(m.Key) == k {
						t.Fatalf("row %d (id %d) is of the parked key %q", i, m.ID, k)
					}
				}
				if i > 0 && m.ID <= batch[i-1].ID {
					t.Fatalf("row %d: id %d after %d; want id order", i, m.ID, batch[i-1].ID)
				}
			}
			var stmts []string
			for _, st := range rec.Statements() {
				if st != "SELECT VERSION()" { // the store's first statement on MySQL/MariaDB
					stmts = append(stmts, st)
				}
			}
			var plan string
			if o.Name == testenv.Postgres {
				stmts = []string{guardedSelect(t, "NextBatch", stmts)}
				plan = explainAnalyzed(t, db, stmts[0], true)
			} else if len(stmts) != 1 {
				t.Fatalf("NextBatch issued %d statements; want 1", len(stmts))
			} else {
				plan = explainPlan(t, db, o.Name, stmts[0])
			}
			t.Logf("%s: NextBatch of 500 with %d parked keys in the bucket took %v; plan:\n%s", o.Name, len(parkedKeys), took, plan)
			if bad := planProblem(o.Name, plan); bad != "" {
				t.Fatalf("NextBatch plan %s:\n%s\n%s", bad, stmts[0], plan)
			}
		})
	}
}

// explainPlan returns the database's plan of stmt (with args for its bind
// variables), one line per node.
func explainPlan(t *testing.T, db *gorm.DB, dialect, stmt string, args ...any) string {
	t.Helper()
	if i := strings.Index(stmt, " FOR SELECT "); strings.HasPrefix(stmt, "SET STATEMENT") && i > 0 {
		stmt = stmt[i+len(" FOR "):] // MariaDB's statement timeout prefix
	}
	prefix := map[string]string{testenv.Postgres: "EXPLAIN ", testenv.MySQL: "EXPLAIN ", testenv.SQLite: "EXPLAIN QUERY PLAN "}[dialect]
	rows, err := db.Raw(prefix+stmt, args...).Rows()
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		var line []string
		for i, v := range vals {
			if b, ok := v.([]byte); ok {
				v = string(b)
			}
			if dialect == testenv.MySQL {
				line = append(line, fmt.Sprintf("%s=%v", cols[i], v))
			} else if dialect == testenv.Postgres || i == len(vals)-1 {
				line = append(line, fmt.Sprint(v))
			}
		}
		plan = append(plan, strings.Join(line, " "))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(plan, "\n")
}

// planProblem says what is wrong with a NextBatch plan on dialect: a sort,
// a scan of the table, or a node not on the (bucket, parked_at_ms, id)
// index; "" when none.
func planProblem(dialect, plan string) string {
	const idx = "idx_outbox_messages_bucket_parked_id"
	switch dialect {
	case testenv.Postgres:
		if strings.Contains(plan, "Sort") || strings.Contains(plan, "Seq Scan") {
			return "sorts or scans the table"
		}
		// The hold subquery probes a few parked rows: PostgreSQL reads them
		// by an index scan or, as its statistics make it choose, by a bitmap
		// built from the same index; either is on the index.
		if strings.Count(plan, "Bitmap Heap Scan") > strings.Count(plan, "Bitmap Index Scan on "+idx) {
			return "reads a bitmap not built from the index"
		}
		if strings.Count(plan, "using "+idx)+strings.Count(plan, "Bitmap Index Scan on "+idx) < 3 {
			return "does not use the index for the scan and both subqueries"
		}
	case testenv.MySQL:
		if strings.Contains(plan, "filesort") || strings.Contains(plan, "type=ALL") || strings.Contains(plan, "temporary") {
			return "sorts or scans the table"
		}
		if strings.Count(plan, "key="+idx) < 3 {
			return "does not use the index for the scan and both subqueries"
		}
	case testenv.SQLite:
		if strings.Contains(plan, "TEMP B-TREE") || strings.Contains(plan, "SCAN outbox_messages") || strings.Contains(plan, "SCAN m") || strings.Contains(plan, "SCAN p") {
			return "sorts or scans the table"
		}
		if strings.Count(plan, "USING INDEX "+idx) < 1 || !strings.Contains(plan, "USING COVERING INDEX "+idx) && strings.Count(plan, idx) < 3 {
			return "does not use the index for the scan and both subqueries"
		}
	}
	return ""
}
