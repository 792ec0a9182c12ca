package gormstore_test

import (
	"strings"
	"testing"

	"github.com/gorm-outbox/outbox/gormstore"
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
			s, err := gormstore.New(db, gormstore.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
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
				stmt, args := gormstore.DeleteStatement(s, 1, chunk)
				plan := explainPlan(t, db, o.Name, stmt, args...)
				t.Logf("%d ids: %s", len(chunk), plan)
				if !strings.Contains(plan, "key=PRIMARY") || strings.Contains(plan, "type=ALL") || strings.Count(plan, "\n") > 0 {
					t.Errorf("MarkPublished of %d ids: plan is not a lookup in the primary key:\n%s\n%s", len(chunk), stmt[:min(len(stmt), 200)], plan)
				}
			}
		})
	}
}
