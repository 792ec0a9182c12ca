package relaytest

import (
	"context"
	"slices"
	"sync"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
)

// Publisher is a scriptable relay.Publisher. By default it acknowledges
// every batch; SetHandler scripts other outcomes (failures, partial
// acknowledgments, blocking). It records every call and every acknowledged
// message. It is safe for concurrent use.
type Publisher struct {
	mu      sync.Mutex
	handler func(ctx context.Context, batch []*outbox.Message) relay.Result
	calls   [][]*outbox.Message
	acked   []*outbox.Message
	changed signal // a call started or ended
}

// NewPublisher returns a Publisher that acknowledges everything.
func NewPublisher() *Publisher {
	return &Publisher{}
}

// SetHandler makes h decide the result of later calls; nil acknowledges
// everything. h may block, honouring ctx.
func (p *Publisher) SetHandler(h func(ctx context.Context, batch []*outbox.Message) relay.Result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.handler = h
}

// Publish implements relay.Publisher: each batch in turn, recorded as a
// call of its own.
func (p *Publisher) Publish(ctx context.Context, batches [][]*outbox.Message) []relay.Result {
	results := make([]relay.Result, len(batches))
	for i, batch := range batches {
		p.mu.Lock()
		h := p.handler
		p.calls = append(p.calls, slices.Clone(batch))
		p.changed.broadcast()
		p.mu.Unlock()
		results[i] = relay.Result{Acknowledged: len(batch)}
		if h != nil {
			results[i] = h(ctx, batch)
		}
		p.mu.Lock()
		p.acked = append(p.acked, batch[:min(max(results[i].Acknowledged, 0), len(batch))]...)
		p.changed.broadcast()
		p.mu.Unlock()
	}
	return results
}

// OwnedBuckets implements relay.Publisher: it does nothing.
func (p *Publisher) OwnedBuckets([]int) {}

// Calls returns the batches of every call so far, in call order.
func (p *Publisher) Calls() [][]*outbox.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

// Acknowledged returns every acknowledged message so far, in order,
// repeats included.
func (p *Publisher) Acknowledged() []*outbox.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.acked)
}

// WaitCalls blocks until at least n calls have started or ctx is done, and
// reports whether the count was reached.
func (p *Publisher) WaitCalls(ctx context.Context, n int) bool {
	return p.changed.wait(ctx, &p.mu, func() bool { return len(p.calls) >= n })
}

// FailWhere returns a handler that acknowledges a batch up to the first
// message for which fail returns a non-nil error, and reports that error.
func FailWhere(fail func(*outbox.Message) error) func(context.Context, []*outbox.Message) relay.Result {
	return func(_ context.Context, batch []*outbox.Message) relay.Result {
		for i, m := range batch {
			if err := fail(m); err != nil {
				return relay.Result{Acknowledged: i, Err: err}
			}
		}
		return relay.Result{Acknowledged: len(batch)}
	}
}

var _ relay.Publisher = (*Publisher)(nil)
