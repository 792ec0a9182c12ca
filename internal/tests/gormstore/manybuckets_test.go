package gormstore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// TestEveryDocumentedBucketCountLeases: with outbox.MaxBucketCount (65,536)
// buckets, one relay acquires all of them, renews and releases them; then
// two relays share them (32,768 each: the first releases its excess, the
// second claims it), renew, and release, on every database. No statement
// may exceed a dialect's bind-variable limit (SQLite 32,766, PostgreSQL and
// MySQL 65,535). Each step's time is logged.
func TestEveryDocumentedBucketCountLeases(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	const n = outbox.MaxBucketCount
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := o.Open(t, nil)
			cfg := outbox.Config{BucketCount: n}
			if err := outbox.AutoMigrate(db, cfg); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			const lease = time.Minute
			newStore := func() *gormstore.Store {
				s, err := gormstore.New(db, gormstore.Options{Config: cfg})
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			step := func(what string, f func() error) {
				t.Helper()
				began := time.Now()
				if err := f(); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				t.Logf("%s: %v", what, time.Since(began).Round(time.Millisecond))
			}
			acquire := func(s *gormstore.Store, id string, want int) []int {
				t.Helper()
				var got []int
				step("acquire "+id, func() error {
					var err error
					got, err = relaytest.Owned(s.AcquireBucketLeases(ctx, id, n, lease))
					return err
				})
				if len(got) != want {
					t.Fatalf("%s: AcquireBucketLeases = %d buckets; want %d", id, len(got), want)
				}
				return got
			}
			renew := func(s *gormstore.Store, id string, buckets []int) {
				t.Helper()
				step("renew "+id, func() error {
					ok, err := s.RenewBucketLeases(ctx, id, buckets, lease)
					if err == nil && !ok {
						t.Errorf("%s: RenewBucketLeases(%d buckets) = false; want true", id, len(buckets))
					}
					return err
				})
			}
			release := func(s *gormstore.Store, id string) {
				t.Helper()
				step("release "+id, func() error { return s.ReleaseBucketLeases(ctx, id) })
			}
			owned := func(id string) int64 {
				t.Helper()
				var c int64
				if err := db.Table(cfg.LeasesTableName()).Where("owner = ?", id).Count(&c).Error; err != nil {
					t.Fatal(err)
				}
				return c
			}

			// One relay: every bucket.
			a := newStore()
			all := acquire(a, "solo", n)
			if all[0] != 0 || all[n-1] != n-1 {
				t.Fatalf("solo owns %d..%d; want 0..%d", all[0], all[n-1], n-1)
			}
			acquire(a, "solo", n) // a second round keeps (extends) them all
			renew(a, "solo", all)
			release(a, "solo")
			if c := owned("solo"); c != 0 {
				t.Fatalf("after release, solo still owns %d buckets", c)
			}

			// Two relays: 32,768 each.
			a, b := newStore(), newStore()
			acquire(a, "relay-a", n)
			acquire(b, "relay-b", 0)         // a holds all; b is now active
			ga := acquire(a, "relay-a", n/2) // a releases its excess
			gb := acquire(b, "relay-b", n/2) // b claims it
			if mixed := slices.Concat(ga, gb); len(slices.Compact(slices.Sorted(slices.Values(mixed)))) != n {
				t.Fatalf("the shares overlap or miss buckets")
			}
			renew(a, "relay-a", ga)
			renew(b, "relay-b", gb)
			// A scattered share (every other bucket) renews in chunks too.
			odd := make([]int, 0, n/2)
			for i := 1; i < n; i += 2 {
				odd = append(odd, i)
			}
			step("renew relay-a (scattered, partly lost)", func() error {
				ok, err := a.RenewBucketLeases(ctx, "relay-a", odd, lease)
				if err == nil && ok && !slices.Equal(ga, odd) {
					t.Errorf("RenewBucketLeases of buckets relay-a does not all hold = true; want false")
				}
				return err
			})
			release(a, "relay-a")
			release(b, "relay-b")
			if ca, cb := owned("relay-a"), owned("relay-b"); ca != 0 || cb != 0 {
				t.Fatalf("after release, the relays still own %d and %d buckets", ca, cb)
			}
		})
	}
}
