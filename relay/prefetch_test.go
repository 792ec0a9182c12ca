package relay_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// TestPrefetch: with a ConcurrentBuckets store served one bucket at a time
// (MaxConcurrentBuckets 1), the next ready bucket's batch
// is fetched while the current one is being published, and every bucket is
// still published in id order, each row once.
func TestPrefetch(t *testing.T) {
	h := newHarness(t, relay.Options{BatchSize: 4, MaxConcurrentBuckets: 1}, asConcurrent)
	for _, b := range []int{1, 2, 3, 5} {
		h.store.AddToBucket(b, msgs(10, "orders")...)
	}
	// The first publish (bucket 1 of the first sweep, with buckets 2, 3 and
	// 5 ready behind it) waits for a second fetch: that fetch can only be
	// the prefetch of bucket 2. The prefetch may start before the publisher
	// is called, so the second fetch waits for the first publish to start
	// (it would come after the publish, and find it started, without
	// prefetch): the two then overlap for sure.
	publishing := make(chan struct{})
	var fetches atomic.Int32
	h.ops.setBlock(relaytest.OpNextBatch, func(context.Context) error {
		if fetches.Add(1) == 2 {
			select {
			case <-publishing:
			case <-time.After(waitLimit):
			}
		}
		return nil
	})
	var mu sync.Mutex
	first, overlapped := true, false
	h.pub.SetHandler(func(ctx context.Context, batch []*outbox.Message) relay.Result {
		mu.Lock()
		isFirst := first
		first = false
		mu.Unlock()
		if isFirst {
			close(publishing)
			deadline := time.Now().Add(waitLimit)
			for fetches.Load() < 2 && time.Now().Before(deadline) {
				time.Sleep(100 * time.Microsecond)
			}
			mu.Lock()
			overlapped = fetches.Load() >= 2
			mu.Unlock()
		}
		return relay.Result{Acknowledged: len(batch)}
	})
	h.start()
	h.waitFor("store empty", func() bool { return h.store.Len() == 0 })

	mu.Lock()
	defer mu.Unlock()
	if !overlapped {
		t.Fatalf("no NextBatch ran during a publish; want the next bucket prefetched")
	}
	seen := map[int64]bool{}
	last := map[int32]int64{}
	for _, call := range h.pub.Calls() {
		for _, m := range call {
			if seen[m.ID] {
				t.Fatalf("row %d published twice", m.ID)
			}
			seen[m.ID] = true
			if m.ID < last[m.Bucket] {
				t.Fatalf("bucket %d: row %d after row %d; want id order", m.Bucket, m.ID, last[m.Bucket])
			}
			last[m.Bucket] = m.ID
		}
	}
	if len(seen) != 40 {
		t.Fatalf("published %d rows; want 40", len(seen))
	}
}
