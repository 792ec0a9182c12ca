package relay_test

import (
	"context"
	"errors"
	"log/slog"
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
	"github.com/gorm-outbox/outbox/relay/relaytest"
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

	// A real clock with millisecond backoffs: the relay's package tests
	// drive the same parking on a manual clock (park_test.go there); this
	// one proves the Kafka publisher's classification leads to it.
	store := relaytest.NewMemStore(1, time.Now)
	pub := relaytest.NewPublisher()
	var mu sync.Mutex
	var errs []error
	pub.SetHandler(func(ctx context.Context, batch []*outbox.Message) relay.Result {
		res := kp.Publish(ctx, [][]*outbox.Message{batch})[0]
		if res.Err != nil {
			mu.Lock()
			errs = append(errs, res.Err)
			mu.Unlock()
		}
		return res
	})
	r, err := relay.New(store, pub, relay.Options{
		BucketCount: 1, RelayID: "relay-a", PollInterval: 5 * time.Millisecond,
		ErrorBackoff: time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	big := outbox.NewStringMessage(topic, "A", strings.Repeat("x", 8192))
	a2 := outbox.NewStringMessage(topic, "A", "a2")
	b1, b2 := outbox.NewStringMessage(topic, "B", "b1"), outbox.NewStringMessage(topic, "B", "b2")
	store.AddToBucket(0, big, b1, a2, b2)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	deadline := time.Now().Add(20 * time.Second)
	for len(store.ParkedIDs(0)) != 1 || store.Len() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("after 20s: parked %v, %d rows left; want A's big row parked and B's rows published", store.ParkedIDs(0), store.Len())
		}
		time.Sleep(time.Millisecond)
	}

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
	if got, want := store.ParkedIDs(0), []int64{big.ID}; !slices.Equal(got, want) {
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
