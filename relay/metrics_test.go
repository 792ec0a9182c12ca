package relay_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/metrictest"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
	"go.opentelemetry.io/otel"
)

// setGlobalMeterProvider installs a recording provider as the OpenTelemetry
// global for the test and returns its reader; cleanup restores the previous
// global.
func setGlobalMeterProvider(t *testing.T) *metrictest.Reader {
	t.Helper()
	reader := metrictest.NewReader()
	prev := otel.GetMeterProvider()
	otel.SetMeterProvider(reader.MeterProvider())
	t.Cleanup(func() { otel.SetMeterProvider(prev) })
	return reader
}

func TestMetrics(t *testing.T) {
	t.Run("nil_meter_provider_records_to_the_global_provider", func(t *testing.T) {
		reader := setGlobalMeterProvider(t)
		h := newHarness(t, relay.Options{BucketCount: 1, MetricsName: "global"}, nil)
		h.store.Add(msgs(3, "t")...)
		h.start()
		h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
		h.waitIdle()
		got := reader.Read(t)
		if got.Values[relay.MetricPublishAcknowledged] != 3 {
			t.Errorf("%s on the global provider = %v; want 3", relay.MetricPublishAcknowledged, got.Values[relay.MetricPublishAcknowledged])
		}
		if got.Values[relay.MetricOwnedBuckets] != 1 {
			t.Errorf("%s on the global provider = %v; want 1", relay.MetricOwnedBuckets, got.Values[relay.MetricOwnedBuckets])
		}
		if got.Names[relay.MetricPublishAcknowledged] != "global" {
			t.Errorf("outbox.name = %q; want %q", got.Names[relay.MetricPublishAcknowledged], "global")
		}
	})

	t.Run("default_relay_issues_no_backlog_queries_even_with_a_global_provider", func(t *testing.T) {
		reader := setGlobalMeterProvider(t)
		h := newHarness(t, relay.Options{BucketCount: 1, MetricsInterval: time.Second}, nil)
		h.store.Add(msgs(3, "t")...)
		h.start()
		h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
		for range 3 { // three metrics intervals
			h.advanceIdle(time.Second)
		}
		if got := h.ops.count(relaytest.OpPendingMetrics); got != 0 {
			t.Fatalf("backlog queries of a default relay = %d; want 0 without Options.MetricsBacklog", got)
		}
		if v, ok := reader.Read(t).Values[relay.MetricPendingAvailable]; !ok || v != 0 {
			t.Fatalf("%s = %v (reported %v); want 0", relay.MetricPendingAvailable, v, ok)
		}
	})

	t.Run("explicit_meter_provider_alone_issues_no_backlog_queries", func(t *testing.T) {
		reader := metrictest.NewReader()
		h := newHarness(t, relay.Options{BucketCount: 1, MetricsInterval: time.Second, MeterProvider: reader.MeterProvider()}, nil)
		h.store.Add(msgs(3, "t")...)
		h.start()
		h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
		for range 3 {
			h.advanceIdle(time.Second)
		}
		if got := h.ops.count(relaytest.OpPendingMetrics); got != 0 {
			t.Fatalf("backlog queries with a MeterProvider but no MetricsBacklog = %d; want 0", got)
		}
	})

	t.Run("every_counter_is_exported_at_zero_from_the_start", func(t *testing.T) {
		// increase() over a series that appears with its first failure
		// misses that failure: every counter exists, at 0, once Run starts.
		reader := metrictest.NewReader()
		h := newHarness(t, relay.Options{BucketCount: 1, MeterProvider: reader.MeterProvider()}, nil)
		h.start()
		h.waitIdle()
		points, err := reader.Collect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		zero := map[string]int{}
		for _, p := range points {
			if p.Kind == metrictest.Counter && p.Value == 0 {
				zero[p.Name]++
			}
		}
		for name, series := range map[string]int{
			relay.MetricPublishAcknowledged: 1, relay.MetricPublishFailures: 1, relay.MetricLeaseExpirations: 1,
			relay.MetricFenced: 1, relay.MetricParked: 4, // one per park reason
		} {
			if zero[name] != series {
				t.Errorf("%s: %d series at 0 before any event; want %d", name, zero[name], series)
			}
		}
	})

	t.Run("publish_instruments_count_batches_and_acknowledged_attempts", func(t *testing.T) {
		reader := metrictest.NewReader()
		h := newHarness(t, relay.Options{BucketCount: 1, MetricsName: "orders", MeterProvider: reader.MeterProvider()}, nil)
		h.store.Add(msgs(5, "t")...)
		var once sync.Once
		h.pub.SetHandler(func(_ context.Context, b []*outbox.Message) relay.Result {
			res := relay.Result{Acknowledged: len(b)}
			once.Do(func() { res = relay.Result{Acknowledged: 2, Err: errBroker} })
			return res
		})
		h.start()
		for h.store.Len() > 0 {
			h.advanceIdle(time.Second)
		}
		got := reader.Read(t)
		if got.Values[relay.MetricPublishAcknowledged] != 5 {
			t.Errorf("%s = %v; want 5 (2 of the failed batch, then 1 + 2)", relay.MetricPublishAcknowledged, got.Values[relay.MetricPublishAcknowledged])
		}
		if got.Values[relay.MetricPublishFailures] != 1 {
			t.Errorf("%s = %v; want 1", relay.MetricPublishFailures, got.Values[relay.MetricPublishFailures])
		}
		if n := got.Counts[relay.MetricPublishDuration]; n != 3 {
			t.Errorf("%s count = %d; want 3 publish calls", relay.MetricPublishDuration, n)
		}
		if got.Counts[relay.MetricCycleDuration] == 0 {
			t.Errorf("%s count = 0; want cycles recorded", relay.MetricCycleDuration)
		}
		if got.Values[relay.MetricOwnedBuckets] != 1 {
			t.Errorf("%s = %v; want 1", relay.MetricOwnedBuckets, got.Values[relay.MetricOwnedBuckets])
		}
		if got.Names[relay.MetricPublishAcknowledged] != "orders" {
			t.Errorf("outbox.name = %q; want %q", got.Names[relay.MetricPublishAcknowledged], "orders")
		}
	})

	t.Run("lease_expiration_counted_once_per_lost_lease_set", func(t *testing.T) {
		reader := metrictest.NewReader()
		h := newHarness(t, relay.Options{BucketCount: 2, MeterProvider: reader.MeterProvider()}, nil)
		h.store.AddToBucket(0, msgs(1, "t")...)
		h.ops.setBlock(relaytest.OpRenew, func(context.Context) error { return errors.New("database unreachable") })
		release := make(chan struct{})
		h.pub.SetHandler(func(_ context.Context, b []*outbox.Message) relay.Result {
			<-release
			return relay.Result{Acknowledged: len(b)}
		})
		h.start()
		h.waitFor("publish started", func() bool { return len(h.pub.Calls()) == 1 })
		h.clock.Advance(31 * time.Second)
		if _, err := h.store.AcquireBucketLeases(context.Background(), "peer", 2, time.Hour); err != nil {
			t.Fatal(err)
		}
		close(release)
		h.waitFor("expiration counted", func() bool { return reader.Read(t).Values[relay.MetricLeaseExpirations] >= 1 })
		if got := reader.Read(t).Values[relay.MetricLeaseExpirations]; got != 1 {
			t.Fatalf("%s = %v; want 1 for one lost set of 2 buckets", relay.MetricLeaseExpirations, got)
		}
	})

	t.Run("pending_gauges_report_the_sampled_backlog", func(t *testing.T) {
		reader := metrictest.NewReader()
		h := newHarness(t, relay.Options{MetricsBacklog: true, BucketCount: 1, MeterProvider: reader.MeterProvider()}, nil)
		old := outbox.NewStringMessage("t", "k", "v")
		old.CreatedAt = t0.Add(-90 * time.Second)
		h.store.Add(old)
		h.store.Add(msgs(3, "t")...)
		release := make(chan struct{})
		h.pub.SetHandler(func(ctx context.Context, b []*outbox.Message) relay.Result {
			<-release // keep the backlog in place
			return relay.Result{Err: errBroker}
		})
		h.start()
		h.waitFor("a sample", func() bool { return reader.Read(t).Values[relay.MetricPendingAvailable] == 1 })
		got := reader.Read(t)
		if got.Values[relay.MetricPendingMessages] != 4 {
			t.Errorf("%s = %v; want 4", relay.MetricPendingMessages, got.Values[relay.MetricPendingMessages])
		}
		if age := got.Values[relay.MetricPendingOldestAge]; age != 90 {
			t.Errorf("%s = %v; want 90", relay.MetricPendingOldestAge, age)
		}
		close(release)
	})

	t.Run("a_drained_backlog_is_resampled_within_a_poll_interval", func(t *testing.T) {
		// MetricsInterval is an hour: only the drain can bring the next
		// sample, one poll interval after the relay finds its buckets empty.
		reader := metrictest.NewReader()
		h := newHarness(t, relay.Options{MetricsBacklog: true, BucketCount: 1, PollInterval: time.Second, MetricsInterval: time.Hour,
			MeterProvider: reader.MeterProvider()}, nil)
		h.store.Add(msgs(3, "t")...)
		sampled := make(chan struct{})
		h.pub.SetHandler(func(ctx context.Context, b []*outbox.Message) relay.Result {
			<-sampled // publish only once the sample counted the backlog
			return relay.Result{Acknowledged: len(b)}
		})
		h.start()
		h.waitFor("the first sample", func() bool { return reader.Read(t).Values[relay.MetricPendingMessages] == 3 })
		close(sampled)
		h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
		h.waitIdle()
		samples := h.ops.count(relaytest.OpPendingMetrics)
		for range 2 {
			h.advanceIdle(time.Second)
		}
		h.waitFor("a new sample after the drain", func() bool { return h.ops.count(relaytest.OpPendingMetrics) > samples })
		h.waitFor("the gauge at 0", func() bool { return reader.Read(t).Values[relay.MetricPendingMessages] == 0 })
		// An empty backlog is not resampled again before MetricsInterval.
		after := h.ops.count(relaytest.OpPendingMetrics)
		for range 3 {
			h.advanceIdle(time.Second)
		}
		if got := h.ops.count(relaytest.OpPendingMetrics); got != after {
			t.Errorf("backlog queries while idle with an empty sample = %d more; want none before MetricsInterval", got-after)
		}
	})

	t.Run("pending_is_unavailable_not_zero_when_the_store_cannot_sample", func(t *testing.T) {
		reader := metrictest.NewReader()
		h := newHarness(t, relay.Options{MetricsBacklog: true, BucketCount: 1, MeterProvider: reader.MeterProvider()}, func(m *relaytest.MemStore) relay.Store { return noBacklog{m} })
		h.start()
		h.waitIdle()
		got := reader.Read(t)
		if v, ok := got.Values[relay.MetricPendingAvailable]; !ok || v != 0 {
			t.Errorf("%s = %v (reported %v); want 0", relay.MetricPendingAvailable, v, ok)
		}
		if v, ok := got.Values[relay.MetricPendingMessages]; ok {
			t.Errorf("%s = %v; want no value", relay.MetricPendingMessages, v)
		}
	})

	t.Run("pending_is_unavailable_after_a_failed_sample", func(t *testing.T) {
		reader := metrictest.NewReader()
		h := newHarness(t, relay.Options{MetricsBacklog: true, BucketCount: 1, MetricsInterval: time.Minute, MeterProvider: reader.MeterProvider()}, nil)
		h.store.Add(msgs(2, "t")...)
		h.ops.failNext(relaytest.OpPendingMetrics, 1)
		h.start()
		h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
		h.waitFor("the failed sample", func() bool { return h.ops.count(relaytest.OpPendingMetrics) == 1 })
		h.waitIdle()
		got := reader.Read(t)
		if v, ok := got.Values[relay.MetricPendingAvailable]; !ok || v != 0 {
			t.Errorf("%s after a failed sample = %v (reported %v); want 0", relay.MetricPendingAvailable, v, ok)
		}
		if v, ok := got.Values[relay.MetricPendingMessages]; ok {
			t.Errorf("%s after a failed sample = %v; want no value", relay.MetricPendingMessages, v)
		}
		h.clock.Advance(time.Minute) // the next sample succeeds: an empty store is 0, available
		h.waitFor("a good sample", func() bool { return reader.Read(t).Values[relay.MetricPendingAvailable] == 1 })
		if got := reader.Read(t).Values[relay.MetricPendingMessages]; got != 0 {
			t.Errorf("%s of an empty store = %v; want 0", relay.MetricPendingMessages, got)
		}
	})

	t.Run("bucket_zero_mode_samples_only_on_the_owner_of_bucket_0", func(t *testing.T) {
		reader := metrictest.NewReader()
		h := newHarness(t, relay.Options{MetricsBacklog: true, BucketCount: 2, MetricsBucketZeroOnly: true, MeterProvider: reader.MeterProvider()}, nil)
		if _, err := h.store.AcquireBucketLeases(context.Background(), "peer", 2, time.Hour); err != nil {
			t.Fatal(err)
		}
		h.start()
		h.waitIdle()
		h.clock.WaitForWaiters(context.Background(), 2) // the sampler parked too
		if got := h.ops.count(relaytest.OpPendingMetrics); got != 0 {
			t.Fatalf("backlog queries of a relay not owning bucket 0 = %d; want 0", got)
		}
		if v := reader.Read(t).Values[relay.MetricPendingAvailable]; v != 0 {
			t.Fatalf("%s = %v; want 0 on a non-owner", relay.MetricPendingAvailable, v)
		}
	})
}

// noBacklog is a MemStore without backlog metrics (PendingMetrics answers
// nil, nil).
type noBacklog struct{ *relaytest.MemStore }

func (noBacklog) PendingMetrics(context.Context) (*relay.Pending, error) { return nil, nil }
