package gormstore_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"gorm.io/gorm"
)

// TestBucketsWithPendingFindsEveryRequestedBucketPastTheSkipScansLimit: the
// skip scan visits at most a quarter of the requested buckets' count of
// non-empty buckets (at least 8); the requested buckets beyond the last one
// it reached are probed one by one. With every one of 256 buckets holding a
// row (bucket 100 only a parked one), asking for all of them, for every
// fourth (the walk meets three other relays' buckets per own one), or for
// the empty and the parked-only ones, returns exactly the requested buckets
// that hold an unparked row.
func TestBucketsWithPendingFindsEveryRequestedBucketPastTheSkipScansLimit(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			ctx := t.Context()
			db := o.Open(t, nil)
			const n = 256
			cfg := newConfig(t, db, n)
			msgs := cfg.MessagesTableName()
			for b := range int32(n) {
				if b == 7 {
					continue // empty
				}
				if err := raw(db).Table(msgs).Create(pendingMessage(b)).Error; err != nil {
					t.Fatal(err)
				}
			}
			testenv.MustExec(t, db, "UPDATE "+msgs+" SET parked_at_ms = 1, parked_reason = 'test' WHERE bucket = 100")
			store, err := gormstore.New(db, gormstore.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			var all, fourth []int
			for b := range n {
				all = append(all, b)
				if b%4 == 0 {
					fourth = append(fourth, b)
				}
			}
			pending := func(bs []int) []int {
				return slices.DeleteFunc(slices.Clone(bs), func(b int) bool { return b == 7 || b == 100 })
			}
			for _, tc := range []struct {
				name string
				ask  []int
			}{
				{"all", all},
				{"every_fourth", fourth},
				{"empty_and_parked_only", []int{7, 100}},
				{"one", []int{255}},
			} {
				got, err := store.BucketsWithPending(ctx, tc.ask)
				if err != nil {
					t.Fatalf("%s: BucketsWithPending: %v", tc.name, err)
				}
				if want := pending(tc.ask); !slices.Equal(got, want) {
					t.Errorf("%s: BucketsWithPending = %v; want %v", tc.name, got, want)
				}
			}
		})
	}
}

// TestBucketsWithPendingProbesPastTheWalkInSmallPlans: on PostgreSQL the
// buckets beyond the skip scan's last one are probed by statements whose
// plan is a loop over their buckets, however many they are. As columns of
// scalar subqueries, PostgreSQL planned every subquery at every execution:
// 120–180 ms per 1000 buckets, 1.6 s of the server's time per drain of
// 100,000 rows in 65,536 buckets.
func TestBucketsWithPendingProbesPastTheWalkInSmallPlans(t *testing.T) {
	pg := postgresOpener(t)
	rec := &testenv.SQLRecorder{}
	db := pg.Open(t, &gorm.Config{Logger: rec})
	const n = 4096 // the walk stops after 999 of them
	cfg := newConfig(t, db, n)
	rows := make([]*outbox.Message, n)
	for b := range rows {
		rows[b] = pendingMessage(int32(b))
	}
	if err := raw(db).Table(cfg.MessagesTableName()).CreateInBatches(rows, 1000).Error; err != nil {
		t.Fatal(err)
	}
	store, err := gormstore.New(db, gormstore.Options{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	all := make([]int, n)
	for b := range all {
		all[b] = b
	}
	rec.Reset()
	got, err := store.BucketsWithPending(t.Context(), all)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, all) {
		t.Fatalf("BucketsWithPending found %d buckets; want all %d", len(got), n)
	}
	var probes []string
	for _, st := range rec.Statements() {
		if !strings.Contains(st, "WITH RECURSIVE") && strings.Contains(st, "parked_at_ms IS NULL") {
			probes = append(probes, st)
		}
	}
	if len(probes) == 0 {
		t.Fatal("no statement probed the buckets past the walk")
	}
	for _, probe := range probes {
		plan := explainPlan(t, db, testenv.Postgres, probe)
		if lines := strings.Count(plan, "\n") + 1; lines > 20 {
			t.Errorf("a probe's plan has %d lines (a subplan per bucket?); want a loop over the buckets:\n%.2000s", lines, plan)
		}
	}
}
