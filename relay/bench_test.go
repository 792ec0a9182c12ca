package relay_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// TestIdleRelayStatements counts the store calls of an idle relay owning
// all 8 buckets over ten simulated minutes: one discovery query per poll
// interval plus one acquisition round per renew interval.
func TestIdleRelayStatements(t *testing.T) {
	h := newHarness(t, relay.Options{}, nil)
	h.start()
	h.waitIdle()
	const span = 10 * time.Minute
	end := t0.Add(span)
	for h.clock.Now().Before(end) {
		next, ok := h.clock.NextDeadline()
		if !ok {
			t.Fatalf("idle relay has no timer")
		}
		h.drainIdle()
		h.clock.Set(next)
		h.waitIdle()
	}
	if got := h.store.Owners(); len(got) != 8 {
		t.Fatalf("owned buckets = %d; want 8", len(got))
	}
	secs := span.Seconds()
	discovery := float64(h.ops.count(relaytest.OpBucketsWithPending)) / secs
	acquire := float64(h.ops.count(relaytest.OpAcquire)) / secs
	other := h.ops.count(relaytest.OpNextBatches) + h.ops.count(relaytest.OpMarkPublished) + h.ops.count(relaytest.OpRenew)
	t.Logf("idle relay owning 8 buckets: %.2f discovery queries/s + %.2f acquisition rounds/s = %.2f store calls/s", discovery, acquire, discovery+acquire)
	// One of each at start, then one per interval.
	maxDiscovery := int(span/relay.DefaultPollInterval) + 1
	maxAcquire := int(span/relay.DefaultLeaseRenewInterval) + 1
	if d, a := h.ops.count(relaytest.OpBucketsWithPending), h.ops.count(relaytest.OpAcquire); d > maxDiscovery || a > maxAcquire || other != 0 {
		t.Fatalf("idle store calls over %v: %d discovery, %d acquisition, %d other; want <= %d, <= %d and 0", span, d, a, other, maxDiscovery, maxAcquire)
	}
}

// nopPublisher acknowledges every batch.
var nopPublisher = relay.PublishFunc(func(_ context.Context, batches [][]*outbox.Message) []relay.Result {
	results := make([]relay.Result, len(batches))
	for i, b := range batches {
		results[i].Acknowledged = len(b)
	}
	return results
})

// BenchmarkRelayBatch measures the engine's overhead per batch (fetch,
// publish, lease checks, mark) with a no-op publisher and the in-memory
// store; one op is one batch of 50 rows.
func BenchmarkRelayBatch(b *testing.B) {
	const batch = 50
	mem := relaytest.NewMemStore(1, nil)
	rows := make([]*outbox.Message, 0, b.N*batch)
	for i := 0; i < b.N*batch; i++ {
		rows = append(rows, outbox.NewStringMessage("t", "k", "v"))
	}
	mem.Add(rows...)
	r, err := relay.New(mem, nopPublisher, relay.Options{BatchSize: batch, Logger: slog.New(slog.DiscardHandler), SingleWriter: true})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	b.ResetTimer()
	go func() { done <- r.Run(ctx) }()
	for mem.Len() > 0 {
		time.Sleep(50 * time.Microsecond)
	}
	b.StopTimer()
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkSweepManyReadyBuckets measures a concurrent relay draining
// 65,536 buckets of one row each (MemStore, a publisher that does nothing):
// the relay's own cost per batch must not grow with the bucket count (it
// did: a linear lease lookup per check and a scan of every bucket's retry
// slot per batch took 9.4 s per drain, 0.65 s after). One op is one whole
// drain.
func BenchmarkSweepManyReadyBuckets(b *testing.B) {
	const buckets = 65536
	for b.Loop() {
		b.StopTimer()
		mem := relaytest.NewMemStore(buckets, nil)
		for bk := range buckets {
			mem.AddToBucket(bk, outbox.NewStringMessage("t", "k", "v"))
		}
		r, err := relay.New(mem, nopPublisher, relay.Options{BucketCount: buckets, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		b.StartTimer()
		go func() { done <- r.Run(ctx) }()
		for mem.Len() > 0 {
			time.Sleep(time.Millisecond)
		}
		b.StopTimer()
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
