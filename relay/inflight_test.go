package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/metrictest"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
)

// TestPublishInflightAgeMetric: outbox.publish.inflight_age reports, on the
// relay's clock, how long the Publish call in flight has been running, and
// 0 when none is; reading it does not wait for the hung publish.
func TestPublishInflightAgeMetric(t *testing.T) {
	reader := metrictest.NewReader()
	h := newHarness(t, relay.Options{BucketCount: 1, MeterProvider: reader.MeterProvider()}, nil)
	age := func() float64 {
		t.Helper()
		v, ok := collect(t, reader).values[relay.MetricPublishInflightAge]
		if !ok {
			t.Fatalf("%s not reported", relay.MetricPublishInflightAge)
		}
		return v
	}
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	h.pub.SetHandler(func(ctx context.Context, b []*outbox.Message) relay.Result {
		select {
		case entered <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-ctx.Done():
			return relay.Result{Err: ctx.Err()}
		}
		return relay.Result{Acknowledged: len(b)}
	})
	h.start()
	h.waitIdle()
	if got := age(); got != 0 {
		t.Fatalf("%s while idle = %v; want 0", relay.MetricPublishInflightAge, got)
	}

	h.store.Add(msgs(3, "t")...)
	h.drainIdle()
	h.clock.Advance(relay.DefaultPollInterval)
	select {
	case <-entered:
	case <-time.After(waitLimit):
		t.Fatal("the publish did not start")
	}
	if got := age(); got != 0 {
		t.Fatalf("%s at the start of the publish = %v; want 0", relay.MetricPublishInflightAge, got)
	}
	h.clock.Advance(7 * time.Second) // less than the renew interval: no other timer fires
	if got := age(); got != 7 {
		t.Fatalf("%s 7s into a hung publish = %v; want 7", relay.MetricPublishInflightAge, got)
	}
	h.clock.Advance(1500 * time.Millisecond)
	if got := age(); got != 8.5 {
		t.Fatalf("%s 8.5s into a hung publish = %v; want 8.5", relay.MetricPublishInflightAge, got)
	}

	close(release)
	h.waitFor("the rows to be published", func() bool { return h.store.Len() == 0 })
	h.waitFor(relay.MetricPublishInflightAge+" back to 0", func() bool { return age() == 0 })
}
