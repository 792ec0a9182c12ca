package kafkapub_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay"
)

// The steps of the end-to-end tests through a relay and a database (as in
// relay's own end-to-end tests).

// forEachDBAndBroker runs f as subtests named <database>_<broker>: every
// database with the in-process broker and, on PostgreSQL, also with the
// real broker when the environment names one.
func forEachDBAndBroker(t *testing.T, f func(t *testing.T, db testenv.Opener, b testenv.Broker)) {
	t.Helper()
	type pairing struct {
		db     testenv.Opener
		broker func(t *testing.T) (testenv.Broker, bool)
	}
	fake := func(t *testing.T) (testenv.Broker, bool) { return testenv.NewFake(t), true }
	real := func(t *testing.T) (testenv.Broker, bool) { return testenv.RealBroker(t) }
	var pairings []pairing
	for _, o := range testenv.Databases(t) {
		pairings = append(pairings, pairing{o, fake})
		if o.Name == testenv.Postgres {
			pairings = append(pairings, pairing{o, real})
		}
	}
	for _, p := range pairings {
		b, ok := p.broker(t)
		if !ok {
			continue
		}
		t.Run(p.db.Name+"_"+b.Name, func(t *testing.T) { f(t, p.db, b) })
	}
}

// fullStore is a Store with renewal and release, as the end-to-end relays
// use.
type fullStore interface {
	relay.Store
	relay.LeaseRenewer
	relay.LeaseReleaser
}

// pausable stalls every call of one relay's store while paused, like a
// database connection that hangs.
type pausable struct {
	fullStore
	mu     sync.Mutex
	paused chan struct{} // non-nil while paused; closed on resume
}

func (p *pausable) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused == nil {
		p.paused = make(chan struct{})
	}
}

func (p *pausable) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused != nil {
		close(p.paused)
		p.paused = nil
	}
}

func (p *pausable) gate(ctx context.Context) error {
	p.mu.Lock()
	ch := p.paused
	p.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *pausable) AcquireBucketLeases(ctx context.Context, id string, n int, d time.Duration) ([]int, error) {
	if err := p.gate(ctx); err != nil {
		return nil, err
	}
	return p.fullStore.AcquireBucketLeases(ctx, id, n, d)
}
func (p *pausable) BucketsWithPending(ctx context.Context, b []int) ([]int, error) {
	if err := p.gate(ctx); err != nil {
		return nil, err
	}
	return p.fullStore.BucketsWithPending(ctx, b)
}
func (p *pausable) NextBatch(ctx context.Context, b, limit int) ([]*outbox.Message, error) {
	if err := p.gate(ctx); err != nil {
		return nil, err
	}
	return p.fullStore.NextBatch(ctx, b, limit)
}
func (p *pausable) MarkPublished(ctx context.Context, b int, m []*outbox.Message) error {
	if err := p.gate(ctx); err != nil {
		return err
	}
	return p.fullStore.MarkPublished(ctx, b, m)
}
func (p *pausable) RenewBucketLeases(ctx context.Context, id string, b []int, d time.Duration) (bool, error) {
	if err := p.gate(ctx); err != nil {
		return false, err
	}
	return p.fullStore.RenewBucketLeases(ctx, id, b, d)
}
