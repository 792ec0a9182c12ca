package relay_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/metrictest"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// idleWithin waits for the relay's next idle wait; a relay that does not
// idle within a few seconds of wall time is spinning on a bucket it no
// longer owns, which is what it names.
func (h *harness) idleWithin(what string) {
	h.t.Helper()
	select {
	case <-h.idle:
	case <-time.After(5 * time.Second):
		h.t.Fatalf("%s: the relay never went idle: it spins on a bucket it dropped", what)
	}
}

// TestLeaseLostAtParkDropsTheBucket: a Park that the store refuses with
// ErrLeaseLost (a peer holds the bucket now) drops that bucket from the
// lease set at once, as a round that did not grant it would: the owned
// gauge and the publisher's owned set shrink, nothing of it is fetched
// again, and only the next acquisition round, ErrorBackoff later, takes it
// back when the store grants it.
func TestLeaseLostAtParkDropsTheBucket(t *testing.T) {
	reader := metrictest.NewReader()
	var obs *observingPublisher
	h := newHarnessPub(t, relay.Options{BucketCount: 2, ParkPolicy: relay.ParkAnyFailure, ParkAfter: 1, MeterProvider: reader.MeterProvider()}, nil,
		func(p *relaytest.Publisher) relay.Publisher { obs = &observingPublisher{Publisher: p}; return obs })
	h.pub.SetHandler(func(_ context.Context, batch []*outbox.Message) relay.Result {
		if batch[0].Bucket == 1 {
			return relay.Result{Err: errBroker}
		}
		return relay.Result{Acknowledged: len(batch)}
	})
	h.store.AddToBucket(1, outbox.NewStringMessage("t", "k", "poison"))
	h.ops.failNext(relaytest.OpPark, 0)
	h.ops.setBlock(relaytest.OpPark, func(context.Context) error {
		return fmt.Errorf("bucket 1 is held by relay-b now: %w", relay.ErrLeaseLost)
	})
	h.start()
	h.waitIdle()
	if got := reader.Read(t).Values[relay.MetricOwnedBuckets]; got != 1 {
		t.Fatalf("%s after Park reported the lease lost = %v; want 1 (bucket 1 dropped)", relay.MetricOwnedBuckets, got)
	}
	if sets := obs.owned(); !slices.Equal(sets[len(sets)-1], []int{0}) {
		t.Fatalf("owned sets the publisher saw = %v; want [0] last", sets)
	}
	acquired := h.ops.count(relaytest.OpAcquire)
	h.advanceIdle(relay.DefaultErrorBackoff)
	if got := h.ops.count(relaytest.OpAcquire); got <= acquired {
		t.Fatalf("acquisition rounds %v after the drop = %d; want another (ErrorBackoff after it)", relay.DefaultErrorBackoff, got)
	}
	if sets := obs.owned(); len(sets) < 3 || !slices.Equal(sets[2], []int{0, 1}) {
		t.Fatalf("owned sets = %v; want [0 1], [0], then [0 1] again once a round grants bucket 1", sets)
	}
}

// TestAHintForADroppedBucketLeavesTheRelayIdle: a commit hint for a bucket
// that arrives while its publish is in flight, which then fails with
// ErrFenced, does not make the dropped bucket ready: the relay goes idle
// until a round grants the bucket again, instead of dispatching a bucket
// it does not own in a loop.
func TestAHintForADroppedBucketLeavesTheRelayIdle(t *testing.T) {
	h := newHarness(t, relay.Options{BucketCount: 2}, nil)
	inFlight, release := make(chan struct{}), make(chan struct{})
	fenced := false
	h.pub.SetHandler(func(_ context.Context, batch []*outbox.Message) relay.Result {
		if batch[0].Bucket == 1 && !fenced {
			fenced = true
			close(inFlight)
			<-release
			return relay.Result{Err: fmt.Errorf("bucket 1: producer epoch 7: %w", relay.ErrFenced)}
		}
		return relay.Result{Acknowledged: len(batch)}
	})
	h.store.AddToBucket(1, msgs(1, "t")...)
	h.start()
	<-inFlight
	h.r.Notifier().NotifyBucket(1) // a commit in bucket 1 while its publish runs
	h.waitFor("the hint taken by the sweep", func() bool { return len(h.pub.Calls()) == 1 })
	close(release)
	h.idleWithin("after a hint for a bucket dropped for ErrFenced")
	h.r.Notifier().NotifyBucket(1) // and one after the drop
	if n := len(h.pub.Calls()); n != 1 {
		t.Fatalf("publishes before the next round = %d; want 1 (the dropped bucket waits for a round)", n)
	}
	h.advanceIdle(relay.DefaultErrorBackoff)
	h.waitFor("bucket 1 published once a round grants it again", func() bool { return len(h.store.Pending(1)) == 0 })
}

// TestUnownedBucketsShowOnTheGaugeAndInHealth: a relay that held both
// buckets with an hour's lease dies; once its heartbeat is older than a
// lease, the surviving relay's acquisition rounds count both buckets
// without a live owner (outbox.buckets.unowned 2, within two leases of the
// death), and after a LeaseDuration of that Health says so.
func TestUnownedBucketsShowOnTheGaugeAndInHealth(t *testing.T) {
	reader := metrictest.NewReader()
	h := newHarness(t, relay.Options{BucketCount: 2, MeterProvider: reader.MeterProvider()}, nil)
	if _, err := h.store.AcquireBucketLeases(context.Background(), "ghost", 2, time.Hour); err != nil {
		t.Fatal(err)
	}
	h.start()
	h.waitIdle()
	if got := reader.Read(t).Values[relay.MetricUnownedBuckets]; got != 0 {
		t.Fatalf("%s while the ghost is live = %v; want 0", relay.MetricUnownedBuckets, got)
	}
	died := h.clock.Now()
	for h.clock.Now().Sub(died) < 2*relay.DefaultLeaseDuration {
		h.advanceIdle(time.Second)
		if reader.Read(t).Values[relay.MetricUnownedBuckets] == 2 {
			break
		}
	}
	if got := reader.Read(t).Values[relay.MetricUnownedBuckets]; got != 2 {
		t.Fatalf("%s two leases after the ghost died = %v; want 2", relay.MetricUnownedBuckets, got)
	}
	shown := h.clock.Now()
	if err := h.r.Health(); err != nil {
		t.Fatalf("Health as the buckets became unowned = %v; want nil (not yet a lease)", err)
	}
	for h.clock.Now().Sub(shown) <= relay.DefaultLeaseDuration {
		h.advanceIdle(time.Second)
	}
	if err := h.r.Health(); err == nil || !strings.Contains(err.Error(), "2 buckets have had no live owner") {
		t.Fatalf("Health a lease after = %v; want the unowned buckets named", err)
	}
}
