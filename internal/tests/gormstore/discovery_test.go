package gormstore_test

import (
	"slices"
	"testing"

	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
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
