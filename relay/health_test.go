package relay_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"

	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// TestHealth proves that Health is nil only while Run runs and its latest
// cycle succeeded: a store error or a failed lease acquisition makes it
// report the error until a later cycle (acquisition) succeeds, and a stopped
// relay is unhealthy.
func TestHealth(t *testing.T) {
	h := newHarness(t, relay.Options{}, nil)
	if err := h.r.Health(); err == nil {
		t.Fatalf("Health() before Run = nil; want an error")
	}
	h.start()
	h.waitIdle()
	if err := h.r.Health(); err != nil {
		t.Fatalf("Health() after a successful cycle = %v; want nil", err)
	}

	h.ops.failNext(relaytest.OpBucketsWithPending, 1)
	h.advanceIdle(relay.DefaultPollInterval) // discovery fails; the relay backs off
	if err := h.r.Health(); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("Health() after a failed cycle = %v; want the store error", err)
	}
	h.advanceIdle(relay.DefaultErrorBackoff) // the retry succeeds
	if err := h.r.Health(); err != nil {
		t.Fatalf("Health() after the store recovered = %v; want nil", err)
	}

	// A failed lease acquisition (the database refuses the heartbeat, say)
	// makes the relay unhealthy until an acquisition succeeds again.
	h.ops.failNext(relaytest.OpAcquire, 1)
	h.advanceIdle(relay.DefaultLeaseRenewInterval)
	if err := h.r.Health(); err == nil || !strings.Contains(err.Error(), "acquire leases") {
		t.Fatalf("Health() after a failed acquisition = %v; want the acquisition error", err)
	}
	h.advanceIdle(relay.DefaultErrorBackoff) // the next acquisition succeeds
	if err := h.r.Health(); err != nil {
		t.Fatalf("Health() after a successful acquisition = %v; want nil", err)
	}

	if err := h.stop(); err != nil {
		t.Fatalf("Run() = %v; want nil", err)
	}
	if err := h.r.Health(); err == nil {
		t.Fatalf("Health() after Run returned = nil; want an error")
	}
}

// TestHealthReportsAPublisherFailingEveryCall: a publisher that has failed
// every call for longer than Options.PublishFailureWindow (default 5m) makes
// Health report it, wrapping the latest publish error; the next
// acknowledged publish makes the relay healthy again. Shorter runs of
// failures are not the relay's.
func TestHealthReportsAPublisherFailingEveryCall(t *testing.T) {
	for _, tc := range []struct {
		name   string
		window time.Duration // Options.PublishFailureWindow
		want   time.Duration // the effective window
	}{
		{"default", 0, relay.DefaultPublishFailureWindow},
		{"one_minute", time.Minute, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, relay.Options{BucketCount: 2, PublishFailureWindow: tc.window}, nil)
			h.store.AddToBucket(0, msgs(2, "t")...)
			h.store.AddToBucket(1, msgs(2, "t")...)
			var failing atomic.Bool
			failing.Store(true)
			h.pub.SetHandler(func(context.Context, []*outbox.Message) relay.Result {
				if failing.Load() {
					return relay.Result{Err: errBroker}
				}
				return relay.Result{Acknowledged: 1}
			})
			h.start()
			h.waitFor("the first failed publish", func() bool { return len(h.pub.Calls()) >= 1 })
			h.waitIdle()
			first := h.clock.Now()
			for h.clock.Now().Sub(first) < tc.want {
				if err := h.r.Health(); err != nil {
					t.Fatalf("Health() %v after the first failure (window %v) = %v; want nil", h.clock.Now().Sub(first), tc.want, err)
				}
				h.advanceIdle(time.Second)
			}
			h.advanceIdle(time.Second)
			err := h.r.Health()
			if !errors.Is(err, errBroker) || !strings.Contains(err.Error(), "PublishFailureWindow") {
				t.Fatalf("Health() %v after the first failure = %v; want the publish error, naming the window", h.clock.Now().Sub(first), err)
			}
			t.Logf("Health() = %v", err)
			if n := h.store.Len(); n != 4 {
				t.Fatalf("pending = %d; want the 4 rows kept", n)
			}

			failing.Store(false)
			calls := len(h.pub.Calls())
			for len(h.pub.Calls()) == calls {
				h.advanceIdle(time.Second) // returns at the idle wait after the publish
			}
			if err := h.r.Health(); err != nil {
				t.Fatalf("Health() after an acknowledged publish = %v; want nil", err)
			}
		})
	}
}

// TestHealthForgetsFailedPublishesNoLongerRetried: when no failed publish is
// being retried any more (here the failing row was deleted by hand; a
// takeover of its bucket does the same), the run of failures no longer
// makes the relay unhealthy.
func TestHealthForgetsFailedPublishesNoLongerRetried(t *testing.T) {
	h := newHarness(t, relay.Options{BucketCount: 1, PublishFailureWindow: time.Minute}, nil)
	h.store.AddToBucket(0, msgs(1, "t")...)
	h.pub.SetHandler(func(context.Context, []*outbox.Message) relay.Result { return relay.Result{Err: errBroker} })
	h.start()
	h.waitFor("the first failed publish", func() bool { return len(h.pub.Calls()) >= 1 })
	h.waitIdle()
	for range 70 {
		h.advanceIdle(time.Second)
	}
	if err := h.r.Health(); !errors.Is(err, errBroker) {
		t.Fatalf("Health() after 70s of failures = %v; want the publish error", err)
	}
	if err := h.store.MarkPublished(context.Background(), h.store.Pending(0)); err != nil {
		t.Fatal(err)
	}
	for range 12 { // the head row's backoff is at most LeaseRenewInterval
		h.advanceIdle(time.Second)
	}
	if err := h.r.Health(); err != nil {
		t.Fatalf("Health() with nothing left to retry = %v; want nil", err)
	}
}

// TestFailingDiscoveryDoesNotStopReadyBuckets: while every discovery fails
// (a walk slower than the store's statement timeout, say), the relay still
// publishes the buckets it knows to be ready — here from a writer's hint —
// and reports the discovery's error in Health until one succeeds.
func TestFailingDiscoveryDoesNotStopReadyBuckets(t *testing.T) {
	h := newHarness(t, relay.Options{}, nil)
	h.start()
	h.waitIdle()
	h.ops.failNext(relaytest.OpBucketsWithPending, 1000)
	h.advanceIdle(relay.DefaultPollInterval) // the discovery fails
	h.store.AddToBucket(3, msgs(2, "t")...)
	h.r.Notifier().NotifyBucket(3)
	h.waitFor("the hinted bucket published", func() bool { return len(h.pub.Acknowledged()) == 2 })
	if err := h.r.Health(); err == nil || !strings.Contains(err.Error(), "discover pending buckets") {
		t.Fatalf("Health() while discovery fails = %v; want the discovery error", err)
	}
}
