package gormstore_test

import (
	"strings"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// TestMarkPublishedDeletesByPrimaryKeyOnMySQL checks MarkPublished's plan
// on MySQL/MariaDB: a lookup of each id in the primary key, whatever the
// number of ids (one, some, the 1000 of a full chunk) and however few rows
// the table holds beside them. MariaDB picks, for the single-table form, a
// full scan of the table once the ids are most of its rows; at REPEATABLE
// READ that scan locks every row and waits on writers' uncommitted ones
// (TestMarkPublishedDoesNotDeadlockConcurrentWriters).
func TestMarkPublishedDeletesByPrimaryKeyOnMySQL(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		if o.Name != testenv.MySQL {
			continue
		}
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			cfg := newConfig(t, db, 4)
			var ids []int64
			for i := range 40 {
				m := pendingMessage(int32(i % 4))
				if err := raw(db).Table(cfg.MessagesTableName()).Create(m).Error; err != nil {
					t.Fatal(err)
				}
				if m.Bucket == 1 {
					ids = append(ids, m.ID)
				}
			}
			full := make([]int64, 1000)
			for i := range full {
				full[i] = ids[0] + int64(i)
			}
			for _, chunk := range [][]int64{ids[:1], ids, full} {
				del := deleteStatement(t, o, cfg, false, 1, chunk)
				stmt := del.SQL
				plan := explainPlan(t, db, o.Name, stmt, del.Args...)
				t.Logf("%d ids: %s", len(chunk), plan)
				if !strings.Contains(plan, "key=PRIMARY") || strings.Contains(plan, "type=ALL") || strings.Count(plan, "\n") > 0 {
					t.Errorf("MarkPublished of %d ids: plan is not a lookup in the primary key:\n%s\n%s", len(chunk), stmt[:min(len(stmt), 200)], plan)
				}
			}
		})
	}
}

// TestMarkPublishedDeletesByPrimaryKeyOnPostgreSQLWithStaleStatistics: on
// PostgreSQL, MarkPublished's plan looks each id up in the primary key even
// when the planner has no statistics of the backlog (an outbox table is
// analyzed while the relay keeps up; the backlog of an outage is not,
// until autovacuum gets to it). With the guard on the bucket index's columns the
// planner, believing a bucket holds a row or two, walked the
// (bucket, parked_at_ms, id) index over the whole bucket and filtered the
// ids: every 500-row delete read the bucket's ~25,000 rows, and a
// 200,000-row drain over 8 buckets ran at 0.45× the raw loop, 396 ms per
// delete (BENCHMARKS.md).
func TestMarkPublishedDeletesByPrimaryKeyOnPostgreSQLWithStaleStatistics(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		if o.Name != testenv.Postgres {
			continue
		}
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			cfg := newConfig(t, db, 8)
			table := cfg.MessagesTableName()
			if err := db.Exec("ALTER TABLE " + table + " SET (autovacuum_enabled = false)").Error; err != nil {
				t.Fatal(err)
			}
			// A backlog of 24,000 1 KiB rows the planner has no statistics
			// of (autovacuum off for the table: nothing analyzes it).
			rows := make([]*outbox.Message, 24000)
			for i := range rows {
				rows[i] = pendingMessage(int32(i % 8))
				rows[i].Value = make([]byte, 1024)
			}
			if err := raw(db).Table(table).CreateInBatches(rows, 1000).Error; err != nil {
				t.Fatal(err)
			}
			var ids []int64
			if err := db.Table(table).Where("bucket = ?", 1).Order("id").Limit(500).Pluck("id", &ids).Error; err != nil {
				t.Fatal(err)
			}
			del := deleteStatement(t, o, cfg, false, 1, ids)
			stmt := del.SQL
			plan := explainPlan(t, db, o.Name, stmt, del.Args...)
			t.Logf("%d ids: %s", len(ids), plan)
			if !strings.Contains(plan, table+"_pkey") || strings.Contains(plan, "bucket_parked_id") {
				t.Errorf("MarkPublished of %d ids with stale statistics: plan is not a lookup in the primary key:\n%s\n%s", len(ids), stmt, plan)
			}
		})
	}
}
