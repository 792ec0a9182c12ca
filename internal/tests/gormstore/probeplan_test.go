package gormstore_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"gorm.io/gorm"
)

// TestMisconfigurationProbeReadsOnlyTheIndexEnds: the acquisition round's
// probe for rows outside [0, BucketCount) reads the ends of the bucket
// index, not the table, on every database, even when the planner has no
// statistics of a backlog (autovacuum off for the table: nothing analyzes
// it). "bucket < 0 OR bucket >= n LIMIT 1" was planned on PostgreSQL as a
// sequential scan expected to stop at its first row: with no row out of
// range it read all of a 200,000-row, 230 MB table at every round of every
// relay (0.7–1.7 s each), pushing the relays' rows out of the cache; four
// relays then drained at 0.13× the raw loop and their deletes hit the 5 s
// statement timeout. On PostgreSQL the generic plan is checked too: the one
// a driver's cached prepared statement gets after five executions.
func TestMisconfigurationProbeReadsOnlyTheIndexEnds(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			rec := &testenv.SQLRecorder{}
			db := o.Open(t, &gorm.Config{Logger: rec})
			cfg := newConfig(t, db, 8)
			table := cfg.MessagesTableName()
			if o.Name == testenv.Postgres {
				if err := db.Exec("ALTER TABLE " + table + " SET (autovacuum_enabled = false)").Error; err != nil {
					t.Fatal(err)
				}
			}
			rows := make([]*outbox.Message, 24000)
			for i := range rows {
				rows[i] = pendingMessage(int32(i % 8))
				rows[i].Value = make([]byte, 1024)
			}
			if err := raw(db).Table(table).CreateInBatches(rows, 1000).Error; err != nil {
				t.Fatal(err)
			}
			s, err := gormstore.New(db, gormstore.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			rec.Reset()
			if _, err := s.AcquireBucketLeases(context.Background(), "relay-a", 8, time.Minute); err != nil {
				t.Fatal(err)
			}
			var probe string
			for _, st := range rec.Statements() {
				if strings.Contains(st, "MIN(bucket)") || strings.Contains(st, "ORDER BY bucket DESC LIMIT 1") || strings.Contains(st, " OR bucket >= ") { // today's, or the earlier form
					probe = st
				}
			}
			if probe == "" {
				t.Fatalf("no probe among the round's statements:\n%s", strings.Join(rec.Statements(), "\n"))
			}
			plan := explainPlan(t, db, o.Name, probe)
			if o.Name == testenv.Postgres {
				plan += "\n" + genericPlan(t, db, probe)
			}
			t.Logf("%s\n%s", probe, plan)
			full := map[string][]string{
				testenv.Postgres: {"Seq Scan"},
				testenv.SQLite:   {"SCAN " + table},
				testenv.MySQL:    {"type=ALL", "type=index"},
			}[o.Name]
			for _, f := range full {
				if strings.Contains(plan, f) {
					t.Errorf("the probe reads the whole table (%q in its plan):\n%s\n%s", f, probe, plan)
				}
			}
		})
	}
}

// genericPlan is PostgreSQL's generic plan of stmt, whose integer literals
// become parameters (as the driver sends them).
func genericPlan(t *testing.T, db *gorm.DB, stmt string) string {
	t.Helper()
	var args []string
	param := regexp.MustCompile(`\b\d+\b`).ReplaceAllStringFunc(stmt, func(lit string) string {
		args = append(args, lit)
		return fmt.Sprintf("$%d", len(args))
	})
	var plan []string
	err := db.Connection(func(c *gorm.DB) error {
		if err := c.Exec("PREPARE probe_plan AS " + param).Error; err != nil {
			return err
		}
		defer c.Exec("DEALLOCATE probe_plan")
		if err := c.Exec("SET plan_cache_mode = force_generic_plan").Error; err != nil {
			return err
		}
		defer c.Exec("RESET plan_cache_mode")
		exec := "EXPLAIN EXECUTE probe_plan"
		if len(args) > 0 {
			exec += "(" + strings.Join(args, ", ") + ")"
		}
		return c.Raw(exec).Scan(&plan).Error
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(plan, "\n")
}
