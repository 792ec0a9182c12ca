package main

import (
	"context"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/storetest"
)

// TestConformance runs the conformance kit against the custom store with
// the two hooks every harness needs (the guide's docs/custom-stores.md
// shows it): every behaviour the relay relies on, and a randomised
// multi-relay run; the scenarios that need other hooks are skipped.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, bucketCount int) *storetest.Harness {
		b := NewBackend(bucketCount)
		return &storetest.Harness{
			NewStore: func(now func() time.Time) relay.Store { return NewStore(b, now) },
			Insert:   func(_ context.Context, msgs []*outbox.Message) error { b.Insert(msgs...); return nil },
		}
	})
}

// TestConformanceWithEveryHook gives the kit every Harness hook, so that
// the scenarios needing them (lease inspection, a lease set by hand,
// injected failures) run too.
func TestConformanceWithEveryHook(t *testing.T) {
	storetest.Run(t, func(t *testing.T, bucketCount int) *storetest.Harness {
		b := NewBackend(bucketCount)
		return &storetest.Harness{
			NewStore: func(now func() time.Time) relay.Store { return NewStore(b, now) },
			Insert: func(_ context.Context, msgs []*outbox.Message) error {
				b.Insert(msgs...)
				return nil
			},
			Leases: func(context.Context) ([]storetest.Lease, error) {
				b.mu.Lock()
				defer b.mu.Unlock()
				var out []storetest.Lease
				for i, l := range b.leases {
					out = append(out, storetest.Lease{Bucket: i, Owner: l.owner, ExpiresAt: l.expires})
				}
				return out, nil
			},
			SetLease: func(_ context.Context, l storetest.Lease) error {
				b.mu.Lock()
				defer b.mu.Unlock()
				b.leases[l.Bucket] = lease{owner: l.Owner, expires: l.ExpiresAt}
				return nil
			},
			FailNext: func(step storetest.Step) {
				b.mu.Lock()
				defer b.mu.Unlock()
				b.failNext[string(step)] = true
			},
		}
	})
}
