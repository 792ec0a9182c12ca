package relaytest

import (
	"context"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
)

// OpNextBatchBytes is the operation name of ByteBoundedStore.NextBatchBytes
// passed to MemStore.Hook.
const OpNextBatchBytes = "NextBatchBytes"

// ByteBoundedStore is a MemStore that also implements
// relay.ByteBoundedFetcher (a MemStore alone does not, so that the relay
// fetches from it with NextBatch).
type ByteBoundedStore struct{ *MemStore }

// NextBatchBytes implements relay.ByteBoundedFetcher: NextBatch, stopping
// after the first row that brings the total relay.MessageSize beyond
// maxBytes.
func (s ByteBoundedStore) NextBatchBytes(ctx context.Context, bucket, limit int, maxBytes int64) ([]*outbox.Message, error) {
	if err := s.enter(ctx, OpNextBatchBytes); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*outbox.Message
	var total int64
	for _, m := range s.rows[bucket] {
		if len(out) >= limit || total > maxBytes {
			break
		}
		if s.isParked(m.ID) {
			continue
		}
		if c, ok := s.corrupt[m.ID]; ok {
			if len(out) == 0 {
				return nil, &relay.CorruptRowError{ID: m.ID, Bucket: bucket, Err: c.err}
			}
			break
		}
		c := *m
		out = append(out, &c)
		total += relay.MessageSize(m)
	}
	return out, nil
}

var _ relay.ByteBoundedFetcher = ByteBoundedStore{}
