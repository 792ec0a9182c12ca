package relaytest_test

import (
	"context"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
	"github.com/gorm-outbox/outbox/storetest"
)

// TestMemStoreConformance runs the conformance kit against MemStore, the
// reference store the relay's own tests use.
func TestMemStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, bucketCount int) *storetest.Harness {
		m := relaytest.NewMemStore(bucketCount, nil)
		return &storetest.Harness{
			NewStore: func(now func() time.Time) relay.Store { return m.WithClock(now) },
			Insert: func(_ context.Context, msgs []*outbox.Message) error {
				for _, msg := range msgs {
					m.AddToBucket(int(msg.Bucket), msg)
				}
				return nil
			},
			InsertCorrupt: func(_ context.Context, bucket int) error {
				m.AddCorrupt(bucket, nil)
				return nil
			},
		}
	})
}
