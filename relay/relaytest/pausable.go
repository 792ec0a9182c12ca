package relaytest

import (
	"context"
	"sync"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
)

// Pausable wraps a relay.Store and, while paused, stalls its lease, discovery,
// fetch and delete calls (AcquireBucketLeases, RenewBucketLeases,
// BucketsWithPending, NextBatches, MarkPublished) until Resume or the call's
// context ends: a database connection that hangs under one relay while its
// peers go on. Its other methods pass through.
type Pausable struct {
	relay.Store
	mu      sync.Mutex
	paused  bool
	resumed signal
}

// Pause makes the next gated calls stall.
func (p *Pausable) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
}

// Resume lets the stalled calls and the next ones through.
func (p *Pausable) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = false
	p.resumed.broadcast()
}

func (p *Pausable) gate(ctx context.Context) error {
	if !p.resumed.wait(ctx, &p.mu, func() bool { return !p.paused }) {
		return ctx.Err()
	}
	return nil
}

// AcquireBucketLeases implements relay.Store, stalled while paused.
func (p *Pausable) AcquireBucketLeases(ctx context.Context, id string, n int, d time.Duration) (relay.Leases, error) {
	if err := p.gate(ctx); err != nil {
		return relay.Leases{}, err
	}
	return p.Store.AcquireBucketLeases(ctx, id, n, d)
}

// RenewBucketLeases implements relay.Store, stalled while paused.
func (p *Pausable) RenewBucketLeases(ctx context.Context, id string, b []int, d time.Duration) (bool, error) {
	if err := p.gate(ctx); err != nil {
		return false, err
	}
	return p.Store.RenewBucketLeases(ctx, id, b, d)
}

// BucketsWithPending implements relay.Store, stalled while paused.
func (p *Pausable) BucketsWithPending(ctx context.Context, b []int) ([]int, error) {
	if err := p.gate(ctx); err != nil {
		return nil, err
	}
	return p.Store.BucketsWithPending(ctx, b)
}

// NextBatches implements relay.Store, stalled while paused.
func (p *Pausable) NextBatches(ctx context.Context, reqs []relay.BatchRequest) ([]relay.BatchResult, error) {
	if err := p.gate(ctx); err != nil {
		return nil, err
	}
	return p.Store.NextBatches(ctx, reqs)
}

// MarkPublished implements relay.Store, stalled while paused.
func (p *Pausable) MarkPublished(ctx context.Context, m []*outbox.Message) error {
	if err := p.gate(ctx); err != nil {
		return err
	}
	return p.Store.MarkPublished(ctx, m)
}
