package relay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/metrictest"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
)

// TestPublishStalledMetric: outbox.publish.stalled reports, on the relay's
// clock, how long publishing has made no progress: the hung publish's age,
// then, after it failed, still the time since that first attempt started,
// through the backoff and the retry, until a publish is acknowledged; 0
// while idle. Reading it does not wait for the hung publish. (An in-flight
// age fell back to 0 at each failed attempt, so an alert's "for" never
// held against a paused broker.)
func TestPublishStalledMetric(t *testing.T) {
	reader := metrictest.NewReader()
	h := newHarness(t, relay.Options{BucketCount: 1, MeterProvider: reader.MeterProvider()}, nil)
	stalled := func() float64 {
		t.Helper()
		v, ok := collect(t, reader).values[relay.MetricPublishStalled]
		if !ok {
			t.Fatalf("%s not reported", relay.MetricPublishStalled)
		}
		return v
	}
	entered := make(chan int, 2)
	answer := make(chan relay.Result)
	free := make(chan struct{}) // closed: every later call is acknowledged at once
	calls := 0
	h.pub.SetHandler(func(ctx context.Context, b []*outbox.Message) relay.Result {
		calls++
		select {
		case <-free:
			return relay.Result{Acknowledged: len(b)}
		default:
		}
		entered <- calls
		select {
		case res := <-answer:
			if res.Err == nil {
				res.Acknowledged = len(b)
			}
			return res
		case <-ctx.Done():
			return relay.Result{Err: ctx.Err()}
		}
	})
	h.start()
	h.waitIdle()
	if got := stalled(); got != 0 {
		t.Fatalf("%s while idle = %v; want 0", relay.MetricPublishStalled, got)
	}

	h.store.Add(msgs(3, "t")...)
	h.drainIdle()
	h.clock.Advance(relay.DefaultPollInterval)
	waitCall := func(n int) {
		t.Helper()
		select {
		case got := <-entered:
			if got != n {
				t.Fatalf("publish call %d; want %d", got, n)
			}
		case <-time.After(waitLimit):
			t.Fatalf("publish call %d did not start", n)
		}
	}
	waitCall(1)
	start := h.clock.Now()
	if got := stalled(); got != 0 {
		t.Fatalf("%s at the start of the publish = %v; want 0", relay.MetricPublishStalled, got)
	}
	h.clock.Advance(7 * time.Second) // less than the renew interval: no other timer fires
	if got := stalled(); got != 7 {
		t.Fatalf("%s 7s into a hung publish = %v; want 7", relay.MetricPublishStalled, got)
	}

	// The hung attempt fails (a timeout): the stall goes on through the
	// backoff and into the retry, counted from the first attempt's start.
	answer <- relay.Result{Err: errors.New("kafka: request timed out")}
	h.waitFor("the failure counted", func() bool { return collect(t, reader).values[relay.MetricPublishFailures] == 1 })
	for retried := false; !retried; {
		if got, want := stalled(), h.clock.Now().Sub(start).Seconds(); got != want {
			t.Fatalf("%s %v after the first attempt started, between attempts = %v; want %v", relay.MetricPublishStalled, h.clock.Now().Sub(start), got, want)
		}
		h.clock.Advance(250 * time.Millisecond)
		select {
		case n := <-entered:
			if n != 2 {
				t.Fatalf("publish call %d; want 2", n)
			}
			retried = true
		case <-time.After(20 * time.Millisecond):
		}
	}
	h.clock.Advance(2 * time.Second)
	if got, want := stalled(), h.clock.Now().Sub(start).Seconds(); got != want || got < 9 {
		t.Fatalf("%s in the retry = %v; want %v (since the first attempt)", relay.MetricPublishStalled, got, want)
	}

	close(free)
	answer <- relay.Result{} // acknowledged (the retry may carry the head row alone)
	h.waitFor("the rows to be published", func() bool { return h.store.Len() == 0 })
	h.waitFor(relay.MetricPublishStalled+" back to 0", func() bool { return stalled() == 0 })
}
