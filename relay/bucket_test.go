package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/metrictest"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// observingPublisher is a relaytest.Publisher that records every owned set
// the relay reports (relay.Publisher.OwnedBuckets).
type observingPublisher struct {
	*relaytest.Publisher
	mu   sync.Mutex
	sets [][]int
}

func (o *observingPublisher) OwnedBuckets(buckets []int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sets = append(o.sets, slices.Clone(buckets))
}

func (o *observingPublisher) owned() [][]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.sets)
}

var _ relay.Publisher = (*observingPublisher)(nil)

// A publish failing with ErrFenced drops that bucket alone: nothing of it
// is deleted or parked (even under ParkAnyFailure with ParkAfter 1), the
// publisher is told the smaller set, the other bucket goes on, and the
// next acquisition round, ErrorBackoff later, takes the bucket back (the
// store still grants it) and publishes its rows.
func TestRelay_drops_a_fenced_bucket_until_the_next_acquisition(t *testing.T) {
	t.Run("sequential", func(t *testing.T) { testDropsFencedBucket(t, false) })
	t.Run("concurrent", func(t *testing.T) { testDropsFencedBucket(t, true) })
}

func testDropsFencedBucket(t *testing.T, concurrent bool) {
	clock := relaytest.NewManualClock(t0)
	store := relaytest.NewMemStore(2, clock.Now)
	pub := &observingPublisher{Publisher: relaytest.NewPublisher()}
	var mu sync.Mutex
	fenced := 0
	pub.SetHandler(func(_ context.Context, batch []*outbox.Message) relay.Result {
		mu.Lock()
		defer mu.Unlock()
		if batch[0].Bucket == 1 && fenced == 0 {
			fenced++
			return relay.Result{Err: fmt.Errorf("bucket 1: producer epoch 3: %w", relay.ErrFenced)}
		}
		return relay.Result{Acknowledged: len(batch)}
	})
	for b := range 2 {
		for i := range 3 {
			store.AddToBucket(b, outbox.NewStringMessage("t", fmt.Sprintf("k%d", i), fmt.Sprintf("b%d-%d", b, i)))
		}
	}
	idle := make(chan struct{}, 1)
	reader := metrictest.NewReader()
	r, err := relay.New(store, pub, relay.Options{
		RelayID: "relay-a", BucketCount: 2, Clock: clock, Logger: slog.New(slog.DiscardHandler),
		ParkPolicy: relay.ParkAnyFailure, ParkAfter: 1, MeterProvider: reader.MeterProvider(),
		SingleWriter: !concurrent, // concurrent: two buckets served at once
	})
	if err != nil {
		t.Fatal(err)
	}
	relay.SetIdleHook(r, func() {
		select {
		case idle <- struct{}{}:
		default:
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v; want nil", err)
		}
	}()
	waitIdle := func() {
		t.Helper()
		select {
		case <-idle:
		case <-time.After(waitLimit):
			t.Fatal("relay did not become idle")
		}
	}

	waitIdle()
	if n := len(store.Pending(0)); n != 0 {
		t.Fatalf("bucket 0 pending = %d; want 0 (the other bucket goes on)", n)
	}
	if n := len(store.Pending(1)); n != 3 {
		t.Fatalf("bucket 1 pending after the fenced publish = %d; want 3 (nothing deleted)", n)
	}
	if p := store.Parked(); !concurrent && len(p) != 0 {
		t.Fatalf("parked %v; want nothing (fencing is not the row's fault)", p)
	}
	sets := pub.owned()
	if len(sets) < 2 || !slices.Equal(sets[0], []int{0, 1}) || !slices.Equal(sets[len(sets)-1], []int{0}) {
		t.Fatalf("owned sets = %v; want [0 1] then [0] after the fence", sets)
	}
	if n := reader.Read(t).Values[relay.MetricFenced]; n != 1 {
		t.Fatalf("%s = %v after one fenced publish; want 1", relay.MetricFenced, n)
	}
	if owner := store.Owners()[1]; owner != "relay-a" {
		t.Fatalf("store owner of bucket 1 = %q; want relay-a (only the local lease is dropped)", owner)
	}

	// ErrorBackoff later the acquisition round takes bucket 1 back.
	for i := 0; len(store.Pending(1)) > 0; i++ {
		if i == 10 {
			t.Fatalf("bucket 1 still pending after %d idle steps; owned sets %v", i, pub.owned())
		}
		select {
		case <-idle:
		default:
		}
		clock.Advance(time.Second)
		waitIdle()
	}
	sets = pub.owned()
	if last := sets[len(sets)-1]; !slices.Equal(last, []int{0, 1}) {
		t.Fatalf("owned sets = %v; want [0 1] again", sets)
	}
	var calls1 int
	for _, c := range pub.Calls() {
		if c[0].Bucket == 1 {
			calls1++
		}
	}
	if calls1 != 2 {
		t.Fatalf("publishes of bucket 1 = %d; want 2 (the fenced one, then the batch)", calls1)
	}
}
