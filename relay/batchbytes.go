package relay

import (
	"context"

	"github.com/gorm-outbox/outbox"
)

// ByteBoundedFetcher is an optional Store capability: fetching a batch
// bounded in bytes as well as in rows, so that a bucket of large rows does
// not load BatchSize of them at once. The relay prefers it to NextBatch when
// the store has it. What a ConcurrentFetcher or a ConcurrentStore says about
// NextBatch holds for it too.
type ByteBoundedFetcher interface {
	// NextBatchBytes is NextBatch (up to limit pending rows of bucket,
	// oldest first, parked rows skipped) that also stops after the first row
	// that brings the batch's total size, by MessageSize, beyond maxBytes:
	// that row is included, so that the relay can tell a batch cut by its
	// size from a drained bucket; the relay publishes the rows within the
	// bound (at least one) and fetches the rest again. A store may count
	// sizes its own way (the stored header encoding, say) as long as it
	// does not count a row smaller than MessageSize does.
	NextBatchBytes(ctx context.Context, bucket, limit int, maxBytes int64) ([]*outbox.Message, error)
}

// MessageSize is the size of a row as Options.MaxBatchBytes counts it: the
// bytes of its key, value, and header names and values.
func MessageSize(m *outbox.Message) int64 {
	n := int64(len(m.Key) + len(m.Value))
	for _, h := range m.Headers {
		n += int64(len(h.Key) + len(h.Value))
	}
	return n
}

// trimToBytes returns the longest prefix of batch whose total MessageSize
// stays within maxBytes, and at least its first row (a row larger than the
// bound goes alone). over reports that batch exceeded the bound, so that
// the bucket may hold more rows even if batch is shorter than the limit
// (a ByteBoundedFetcher stops after the row crossing the bound).
func trimToBytes(batch []*outbox.Message, maxBytes int64) (kept []*outbox.Message, over bool) {
	var total int64
	for i, m := range batch {
		total += MessageSize(m)
		if total > maxBytes {
			return batch[:max(i, 1)], true
		}
	}
	return batch, false
}
