package relay_test

import (
	"bytes"
	"slices"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// TestMaxBatchBytes: large rows are published in batches whose total
// MessageSize stays within MaxBatchBytes, in order, each once; a row larger
// than the bound goes alone. The store is asked for the bound
// (NextBatch's maxBytes) and the relay trims what crosses it.
func TestMaxBatchBytes(t *testing.T) {
	const bound = 1000
	for _, tc := range []struct {
		name  string
		wrap  func(*relaytest.MemStore) relay.Store
		fetch string
	}{
		{"next_batch", nil, relaytest.OpNextBatches},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, relay.Options{BucketCount: 1, MaxBatchBytes: bound}, tc.wrap)
			var rows []*outbox.Message
			for i := range 12 {
				size := 300 // three per batch
				if i == 5 {
					size = 3 * bound // alone
				}
				m := outbox.NewStringMessage("t", "", "")
				m.Key = nil
				m.Value = bytes.Repeat([]byte{'v'}, size-10)
				m.Headers = outbox.Headers{{Key: "h", Value: bytes.Repeat([]byte{'x'}, 9)}}
				rows = append(rows, m)
			}
			h.store.Add(rows...)
			h.start()
			h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
			calls := h.pub.Calls()
			checkPublishedOnce(t, calls, len(rows))
			var sizes []int
			for _, c := range calls {
				var total int64
				for _, m := range c {
					total += relay.MessageSize(m)
				}
				if total > bound && len(c) > 1 {
					t.Fatalf("a batch of %d rows holds %d bytes; want at most %d", len(c), total, bound)
				}
				sizes = append(sizes, len(c))
			}
			// 0-2, 3-4 (the big row next), 5 alone, 6-8, 9-11.
			if want := []int{3, 2, 1, 3, 3}; !slices.Equal(sizes, want) {
				t.Fatalf("batch sizes %v; want %v", sizes, want)
			}
			if h.ops.count(tc.fetch) == 0 {
				t.Fatalf("no %s call; want the batches fetched with it", tc.fetch)
			}
		})
	}
}
