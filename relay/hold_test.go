package relay_test

import (
	"context"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// The containment tests of issue 27: which rows of a parked key wait is
// decided by the store, whatever a relay missed.

// peerOn returns a harness for relay id on h's store with a clock of its
// own: a relay whose process can be paused (its clock stands still while
// the store's runs) and resumed (its clock jumps).
func (h *harness) peerOn(id string, opts relay.Options, clock *relaytest.ManualClock) *harness {
	h.t.Helper()
	p := &harness{t: h.t, clock: clock, store: h.store, pub: relaytest.NewPublisher(), idle: make(chan struct{}, 1), ops: h.ops}
	opts.RelayID = id
	opts.Clock = clock
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	r, err := relay.New(h.store, p.pub, opts)
	if err != nil {
		h.t.Fatalf("relay.New: %v", err)
	}
	relay.SetIdleHook(r, func() {
		select {
		case p.idle <- struct{}{}:
		default:
		}
	})
	p.r = r
	return p
}

// rejectingAlways returns a flag that holds.
func rejectingAlways() *atomic.Bool {
	var b atomic.Bool
	b.Store(true)
	return &b
}

// isParked reports whether row id of bucket 0 is parked.
func isParked(s *relaytest.MemStore, id int64) bool {
	return slices.Contains(s.ParkedIDs(0), id)
}

// publishedOf returns the ids of key's rows p's publisher acknowledged.
func publishedOf(p *harness, key string) []int64 {
	var out []int64
	for _, m := range p.pub.Acknowledged() {
		if string(m.Key) == key {
			out = append(out, m.ID)
		}
	}
	return out
}

// TestRelayBackFromAPausePublishesNoRowBehindAPeersParkedHead (defect 1):
// relay A owns the bucket and is paused in its idle wait past its lease;
// relay B takes the bucket, parks key K's head and stops. A resumes, its
// first acquisition returns the same bucket, and K's next row must wait
// behind the parked head.
func TestRelayBackFromAPausePublishesNoRowBehindAPeersParkedHead(t *testing.T) {
	h := newHarness(t, relay.Options{BucketCount: 1, RelayID: "relay-b"}, nil)
	a := h.peerOn("relay-a", relay.Options{BucketCount: 1}, relaytest.NewManualClock(t0))
	a.start()
	a.waitIdle()
	if got := h.store.Owners()[0]; got != "relay-a" {
		t.Fatalf("bucket 0 owned by %q; want relay-a", got)
	}

	// A is paused: the store's clock runs past A's lease, A's does not.
	h.clock.Advance(relay.DefaultLeaseDuration + time.Second)
	k := keyed("K", 3)
	h.store.AddToBucket(0, k[0], k[1])
	rejectKey(h, "K", errTooLarge, rejectingAlways())
	h.start()
	h.waitIdle()
	h.step("K's head parked by relay-b", 40, func() bool { return isParked(h.store, k[0].ID) })
	if err := h.stop(); err != nil {
		t.Fatalf("relay-b Run = %v", err)
	}
	h.store.AddToBucket(0, k[2])

	// A resumes: its clock jumps past its lease and its rebalance.
	a.advanceIdle(relay.DefaultLeaseDuration + time.Second)
	a.advanceIdle(relay.DefaultPollInterval)
	if got := h.store.Owners()[0]; got != "relay-a" {
		t.Fatalf("after the pause bucket 0 owned by %q; want relay-a", got)
	}
	if got := publishedOf(a, "K"); len(got) != 0 {
		t.Fatalf("relay-a published K's rows %v while K's head %d is parked", got, k[0].ID)
	}
}

// TestRequeueOfACorruptRowAloneReleasesNothingBehindTheParkedHead (defect
// 2): a corrupt row C of key K is parked alone; K's head H is parked later.
// C, repaired, is requeued alone (as the runbook says): C is published, but
// K's rows after H keep waiting.
func TestRequeueOfACorruptRowAloneReleasesNothingBehindTheParkedHead(t *testing.T) {
	h := newHarness(t, relay.Options{BucketCount: 1}, nil)
	c := h.store.AddCorrupt(0, []byte("K"))
	k := keyed("K", 3)
	h.store.AddToBucket(0, k[0], k[1])
	h.pub.SetHandler(relaytest.FailWhere(func(m *outbox.Message) error {
		if m.ID == k[0].ID {
			return errTooLarge
		}
		return nil
	}))
	h.start()
	h.waitIdle()
	h.step("C and K's head parked", 40, func() bool { return isParked(h.store, c) && isParked(h.store, k[0].ID) })

	h.store.Repair(c)
	if n, err := h.store.RequeueParked(context.Background(), relay.ParkedSelector{ID: c}); err != nil || n != 1 {
		t.Fatalf("RequeueParked(ID %d) = %d, %v; want 1, nil", c, n, err)
	}
	h.store.AddToBucket(0, k[2])
	h.r.Notifier().NotifyBucket(0)
	h.waitFor("C published", func() bool { return len(publishedOf(h, "K")) > 0 })
	h.waitIdle()
	h.advanceIdle(relay.DefaultPollInterval)
	if got := publishedOf(h, "K"); len(got) != 1 || got[0] != c {
		t.Fatalf("published K's rows %v; want only the requeued corrupt row %d (K's head %d is parked)", got, c, k[0].ID)
	}
}

// TestParkAfterLosingTheLeaseChangesNothing (defect 3): the relay decides
// to park K's head and is paused before the statement runs; meanwhile its
// lease expires and a peer takes the bucket. The late statement must park
// nothing: the peer owns the bucket's rows now.
func TestParkAfterLosingTheLeaseChangesNothing(t *testing.T) {
	h := newHarness(t, relay.Options{BucketCount: 1}, nil)
	k := keyed("K", 2)
	h.store.AddToBucket(0, k[0], k[1])
	rejectKey(h, "K", errTooLarge, rejectingAlways())
	h.ops.setBlock(relaytest.OpPark, func(ctx context.Context) error {
		h.clock.Advance(relay.DefaultLeaseDuration + time.Second) // the lease expires: a renewal fails
		got, err := relaytest.Owned(h.store.AcquireBucketLeases(ctx, "relay-b", 1, relay.DefaultLeaseDuration))
		if err != nil || len(got) != 1 {
			t.Errorf("relay-b acquired %v, %v; want bucket 0", got, err)
		}
		return nil
	})
	h.start()
	h.waitIdle()
	h.step("a park attempted", 40, func() bool { return h.ops.count(relaytest.OpPark) > 0 })
	if got := h.store.ParkedIDs(0); len(got) != 0 {
		t.Fatalf("parked %v after relay-a lost bucket 0 to relay-b; want nothing", got)
	}
}
