package relay_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// TestRecordTooLargeForTheTopicIsParkedWhileItsBucketFlows: with the Kafka
// publisher on the in-process broker, a row larger than its topic's
// max.message.bytes is classified ErrUnpublishable and parked after
// ParkAfter single-row attempts, the later row of its key is held, and the
// rows of another key in the same bucket reach the topic.
func TestRecordTooLargeForTheTopicIsParkedWhileItsBucketFlows(t *testing.T) {
	b := testenv.NewFake(t)
	topic := testenv.Unique("park-")
	b.CreateTopic(t, topic, 2, map[string]string{"max.message.bytes": "2048"})
	kp, err := kafkapub.New(kafkapub.Config{Brokers: b.Addrs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kp.Close() })

	h := newHarness(t, relay.Options{BucketCount: 1}, nil)
	var mu sync.Mutex
	var errs []error
	h.pub.SetHandler(func(ctx context.Context, batch []*outbox.Message) relay.Result {
		res := kp.Publish(ctx, batch)
		if res.Err != nil {
			mu.Lock()
			errs = append(errs, res.Err)
			mu.Unlock()
		}
		return res
	})
	big := outbox.NewStringMessage(topic, "A", strings.Repeat("x", 8192))
	a2 := outbox.NewStringMessage(topic, "A", "a2")
	b1, b2 := outbox.NewStringMessage(topic, "B", "b1"), outbox.NewStringMessage(topic, "B", "b2")
	h.store.AddToBucket(0, big, b1, a2, b2)
	h.start()
	h.waitIdle()
	h.step("A's row parked", 20, func() bool { return len(h.store.ParkedIDs(0)) == 1 })
	h.waitFor("B's rows published", func() bool { return h.store.Len() == 2 })

	mu.Lock()
	defer mu.Unlock()
	if len(errs) != 1+relay.DefaultParkAfter {
		t.Fatalf("%d failed publishes; want the batch's and ParkAfter = %d of the row alone", len(errs), relay.DefaultParkAfter)
	}
	for _, err := range errs {
		if !errors.Is(err, relay.ErrUnpublishable) || !errors.Is(err, kafka.MessageSizeTooLarge) {
			t.Fatalf("publish error %v; want ErrUnpublishable and MessageSizeTooLarge", err)
		}
	}
	if got, want := h.store.ParkedIDs(0), []int64{big.ID}; !slices.Equal(got, want) {
		t.Fatalf("parked = %v; want %v", got, want)
	}
	var got []string
	for _, r := range b.ReadAll(t, topic, 2, 10*time.Second) {
		got = append(got, string(r.Key)+"="+string(r.Value))
	}
	if strings.Join(got, ",") != "B=b1,B=b2" {
		t.Fatalf("topic holds %v; want B's two rows only", got)
	}
}
