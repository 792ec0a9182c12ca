package kafkapub

import (
	"context"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/testenv"
)

// Helpers of the transactional mode's tests.

// newTestTxnPublisher returns a transactional publisher on b for outbox name,
// closed at cleanup.
func newTestTxnPublisher(t testing.TB, b testenv.Broker, outboxName string, cfg Config) *Publisher {
	t.Helper()
	if cfg.Transactions == nil {
		cfg.Transactions = &Transactions{}
	}
	tc := *cfg.Transactions
	tc.Outbox = outboxName
	cfg.Transactions = &tc
	return newPublisher(t, b, cfg)
}

// own tells p that its relay owns buckets and waits (at most 30 s) until
// their producers are initialised; it fails t if one could not be.
func own(t testing.TB, p *Publisher, buckets ...int) {
	t.Helper()
	p.OwnedBuckets(buckets)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, b := range buckets {
		prod := p.producer(b)
		if prod == nil {
			t.Fatalf("bucket %d: no producer after OwnedBuckets", b)
		}
		select {
		case <-prod.ready:
		case <-ctx.Done():
			t.Fatalf("bucket %d: producer not initialised after 30s", b)
		}
		if prod.initErr != nil {
			t.Fatalf("bucket %d: %v", b, prod.initErr)
		}
	}
}
