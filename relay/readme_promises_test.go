package relay_test

// Tests of relay behaviour the README promises and no other test pins down:
// the defaults of a zero relay.Options, and the instruments behind the
// README's metrics table (their names as the Prometheus exporter of
// outbox-relay shows them are checked in cmd/outbox-relay, the module with
// the exporter).

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/metrictest"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// argsStore records the arguments the relay passes to the store; the
// embedded MemStore does the rest.
type argsStore struct {
	*relaytest.MemStore
	mu             sync.Mutex
	leaseDurations []time.Duration
	limits         []int
	excluded       []int // len(Exclude) of each request that has some
}

func (s *argsStore) AcquireBucketLeases(ctx context.Context, id string, n int, d time.Duration) (relay.Leases, error) {
	s.mu.Lock()
	s.leaseDurations = append(s.leaseDurations, d)
	s.mu.Unlock()
	return s.MemStore.AcquireBucketLeases(ctx, id, n, d)
}

func (s *argsStore) NextBatches(ctx context.Context, reqs []relay.BatchRequest) ([]relay.BatchResult, error) {
	s.mu.Lock()
	for _, r := range reqs {
		s.limits = append(s.limits, r.Limit)
		if len(r.Exclude) > 0 {
			s.excluded = append(s.excluded, len(r.Exclude))
		}
	}
	s.mu.Unlock()
	return s.MemStore.NextBatches(ctx, reqs)
}

// TestZeroOptionsUseTheDocumentedDefaults proves the README's relay options
// table: a zero relay.Options fetches and publishes 500 rows per batch,
// acquires 30 s leases, polls every second and rebalances every 10 s (20 s of
// tolerated clock skew), and names itself after the host with a random
// suffix. (StopTimeout and MeterProvider are left to their own tests.)
func TestZeroOptionsUseTheDocumentedDefaults(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"DefaultBucketCount", relay.DefaultBucketCount, 8},
		{"DefaultBatchSize", relay.DefaultBatchSize, 500},
		{"DefaultPollInterval", relay.DefaultPollInterval, time.Second},
		{"DefaultErrorBackoff", relay.DefaultErrorBackoff, time.Second},
		{"DefaultLeaseDuration", relay.DefaultLeaseDuration, 30 * time.Second},
		{"DefaultLeaseRenewInterval", relay.DefaultLeaseRenewInterval, 10 * time.Second},
		{"renewal margin", relay.DefaultLeaseDuration - relay.DefaultLeaseRenewInterval, 20 * time.Second},
		{"DefaultParkAfter", relay.DefaultParkAfter, 3},
		{"default ParkPolicy", relay.ParkPolicy(0), relay.ParkUnpublishable},
		{"DefaultMaxConcurrentBuckets", relay.DefaultMaxConcurrentBuckets, 4},
		{"DefaultMaxBatchBytes", int64(relay.DefaultMaxBatchBytes), int64(4 << 20)},
		{"DefaultMetricsName", relay.DefaultMetricsName, "outbox"},
		{"DefaultMetricsInterval", relay.DefaultMetricsInterval, 30 * time.Second},
		{"DefaultMetricsTimeout", relay.DefaultMetricsTimeout, 5 * time.Second},
		{"DefaultPublishFailureWindow", relay.DefaultPublishFailureWindow, 5 * time.Minute},
		{"MaxRelayIDLength", relay.MaxRelayIDLength, 128},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v; the README documents %v", c.name, c.got, c.want)
		}
	}

	t.Run("batches_leases_and_poll_interval", func(t *testing.T) {
		s := &argsStore{}
		h := newHarness(t, relay.Options{}, func(m *relaytest.MemStore) relay.Store { s.MemStore = m; return s })
		h.store.AddToBucket(0, msgs(1200, "orders")...)
		h.start()
		h.waitIdle()
		if n := h.store.Len(); n != 0 {
			t.Fatalf("%d rows pending after the relay went idle; want 0", n)
		}
		var sizes []int
		for _, c := range h.pub.Calls() {
			sizes = append(sizes, len(c))
		}
		if want := []int{500, 500, 200}; !slices.Equal(sizes, want) {
			t.Errorf("publish call sizes = %v; want %v (BatchSize 500)", sizes, want)
		}
		s.mu.Lock()
		limits, excluded, durations := slices.Clone(s.limits), slices.Clone(s.excluded), slices.Clone(s.leaseDurations)
		s.mu.Unlock()
		// 500 each; beside a running delete the request leaves the
		// previous batch's 500 rows out (Exclude), rather than reading them.
		if slices.ContainsFunc(limits, func(l int) bool { return l != 500 }) || slices.ContainsFunc(excluded, func(n int) bool { return n != 500 }) {
			t.Errorf("fetch limits = %v, rows left out = %v; want 500 each", limits, excluded)
		}
		if len(durations) == 0 || slices.ContainsFunc(durations, func(d time.Duration) bool { return d != 30*time.Second }) {
			t.Errorf("lease durations asked of the store = %v; want 30s each", durations)
		}
		// Idle on the manual clock that has not moved: the next wake-up is
		// the poll, 1 s away, and the rebalance is 10 s away.
		if next, ok := h.clock.NextDeadline(); !ok || !next.Equal(t0.Add(time.Second)) {
			t.Errorf("next deadline while idle = %v (%v); want the 1s poll at %v", next, ok, t0.Add(time.Second))
		}
		h.drainIdle()
		h.clock.Advance(time.Second)
		h.waitIdle()
		if next, ok := h.clock.NextDeadline(); !ok || !next.Equal(t0.Add(2*time.Second)) {
			t.Errorf("next deadline after one poll = %v (%v); want %v", next, ok, t0.Add(2*time.Second))
		}
		h.drainIdle()
		h.clock.Advance(10*time.Second - time.Second - time.Millisecond)
		h.waitIdle()
		before := len(h.pub.Calls())
		s.mu.Lock()
		acquisitions := len(s.leaseDurations)
		s.mu.Unlock()
		h.drainIdle()
		h.clock.Set(t0.Add(10 * time.Second))
		h.waitIdle()
		s.mu.Lock()
		after := len(s.leaseDurations)
		s.mu.Unlock()
		if after != acquisitions+1 {
			t.Errorf("lease acquisitions at t0+10s: %d → %d; want one more (LeaseRenewInterval 10s)", acquisitions, after)
		}
		if len(h.pub.Calls()) != before {
			t.Errorf("publish calls while idle changed from %d to %d", before, len(h.pub.Calls()))
		}
	})

	t.Run("relay_id_is_the_host_name_and_a_random_suffix", func(t *testing.T) {
		host, err := os.Hostname()
		if err != nil || host == "" {
			t.Skip("no host name")
		}
		pub := relaytest.NewPublisher()
		a, err := relay.New(relaytest.NewMemStore(8, nil), pub, relay.Options{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := relay.New(relaytest.NewMemStore(8, nil), pub, relay.Options{})
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{a.ID(), b.ID()} {
			prefix, suffix, ok := strings.Cut(id, host[:min(len(host), relay.MaxRelayIDLength/2)])
			if !ok || prefix != "" || !strings.HasPrefix(suffix, "-") && len(host) <= relay.MaxRelayIDLength/2 || len(id) > relay.MaxRelayIDLength {
				t.Errorf("ID() = %q; want %q plus a random suffix, at most %d bytes", id, host, relay.MaxRelayIDLength)
			}
		}
		if a.ID() == b.ID() {
			t.Errorf("two relays on one host share the ID %q; want distinct random suffixes", a.ID())
		}
	})
}

// TestMetricInstrumentsBehindTheREADMEsTable proves the instruments behind
// the README's metrics table: the fifteen of them, with the kinds and units
// that make the OpenTelemetry Prometheus exporter show the documented names
// and types (a counter gains _total, unit s _seconds, unit 1 _ratio, a
// {annotation} nothing), each carrying outbox.name="outbox" by default, and
// no other. cmd/outbox-relay's TestMetricNamesAsThePrometheusExporterShowsThem
// checks the names themselves through the worker's exporter.
func TestMetricInstrumentsBehindTheREADMEsTable(t *testing.T) {
	reader := metrictest.NewReader()
	mp := reader.MeterProvider()

	// One failed publish, then a lease set lost while a publish hangs:
	// every counter gets a sample.
	// The store reports a clock offset, as gormstore does.
	h := newHarness(t, relay.Options{BucketCount: 2, MeterProvider: mp, MetricsBacklog: true}, func(m *relaytest.MemStore) relay.Store {
		st := &offsetStore{MemStore: m}
		st.set(-40*time.Second, time.Millisecond)
		return st
	})
	h.store.AddToBucket(0, msgs(1, "t")...)
	h.ops.setBlock(relaytest.OpRenew, func(context.Context) error { return errors.New("database unreachable") })
	release := make(chan struct{})
	var calls sync.Mutex
	n := 0
	h.pub.SetHandler(func(_ context.Context, b []*outbox.Message) relay.Result {
		calls.Lock()
		n++
		first := n == 1
		calls.Unlock()
		if first {
			return relay.Result{Err: errBroker}
		}
		<-release
		return relay.Result{Acknowledged: len(b)}
	})
	h.start()
	h.waitFor("the failed publish", func() bool { return len(h.pub.Calls()) == 1 })
	h.waitIdle()
	// The failing head row is retried after a jittered backoff; the retry
	// hangs until release.
	for i := 0; len(h.pub.Calls()) < 2; i++ {
		next, ok := h.clock.NextDeadline()
		if i == 10 || !ok || next.Sub(t0) > 5*time.Second {
			t.Fatalf("no retry by the %d-th wake-up (next deadline %v, %v)", i, next, ok)
		}
		h.drainIdle()
		h.clock.Set(next)
		h.waitFor("the retry or the next idle wait", func() bool {
			if len(h.pub.Calls()) == 2 {
				return true
			}
			select {
			case <-h.idle:
				return true
			default:
				return false
			}
		})
	}
	h.clock.Advance(31 * time.Second)
	if _, err := h.store.AcquireBucketLeases(context.Background(), "peer", 2, time.Hour); err != nil {
		t.Fatal(err)
	}
	close(release)

	type instrument struct {
		kind metrictest.Kind
		unit string
	}
	want := map[string]instrument{
		relay.MetricOwnedBuckets:        {metrictest.Gauge, "{bucket}"},    // outbox_owned_buckets
		relay.MetricUnownedBuckets:      {metrictest.Gauge, "{bucket}"},    // outbox_buckets_unowned
		relay.MetricPublishAcknowledged: {metrictest.Counter, "{message}"}, // outbox_publish_acknowledged_total
		relay.MetricPublishFailures:     {metrictest.Counter, "{attempt}"}, // outbox_publish_failures_total
		relay.MetricLeaseExpirations:    {metrictest.Counter, "{event}"},   // outbox_lease_expirations_total
		relay.MetricFenced:              {metrictest.Counter, "{bucket}"},  // outbox_fenced_total
		relay.MetricPublishDuration:     {metrictest.Histogram, "s"},       // outbox_publish_duration_seconds
		relay.MetricCycleDuration:       {metrictest.Histogram, "s"},       // outbox_cycle_duration_seconds
		relay.MetricPendingMessages:     {metrictest.Gauge, "{message}"},   // outbox_pending_messages
		relay.MetricPendingOldestAge:    {metrictest.Gauge, "s"},           // outbox_pending_oldest_age_seconds
		relay.MetricPendingAvailable:    {metrictest.Gauge, "1"},           // outbox_pending_available_ratio
		relay.MetricHeadOldestAge:       {metrictest.Gauge, "s"},           // outbox_head_oldest_age_seconds
		relay.MetricPublishStalled:      {metrictest.Gauge, "s"},           // outbox_publish_stalled_seconds
		relay.MetricParked:              {metrictest.Counter, "{message}"}, // outbox_parked_total
		relay.MetricParkedMessages:      {metrictest.Gauge, "{message}"},   // outbox_parked_messages
		relay.MetricClockOffset:         {metrictest.Gauge, "s"},           // outbox_clock_offset_seconds
	}
	var got []metrictest.Point
	h.waitFor("every documented instrument", func() bool {
		var err error
		if got, err = reader.Collect(context.Background()); err != nil {
			t.Fatalf("Collect: %v", err)
		}
		seen := map[string]bool{}
		for _, p := range got {
			seen[p.Name] = true
		}
		for name := range want {
			if !seen[name] {
				return false
			}
		}
		return true
	})
	for _, p := range got {
		w, ok := want[p.Name]
		if !ok {
			t.Errorf("instrument %s is not in the README's metrics table", p.Name)
			continue
		}
		if p.Kind != w.kind || p.Unit != w.unit {
			t.Errorf("%s is a %s in %q; the README's name and type need a %s in %q", p.Name, p.Kind, p.Unit, w.kind, w.unit)
		}
		if name := p.Attr("outbox.name"); name != "outbox" {
			t.Errorf("%s has outbox.name=%q; want %q", p.Name, name, "outbox")
		}
	}
}

// TestPublishFailureKeepsTheRelayHealthy proves the README's health
// promise: a publish failure is not a cycle failure (the row is retried
// with backoff and counted in outbox_publish_failures_total), so Health
// stays nil.
func TestPublishFailureKeepsTheRelayHealthy(t *testing.T) {
	h := newHarness(t, relay.Options{}, nil)
	h.store.AddToBucket(0, msgs(1, "t")...)
	h.pub.SetHandler(func(context.Context, []*outbox.Message) relay.Result { return relay.Result{Err: errBroker} })
	h.start()
	h.waitFor("the failed publish", func() bool { return len(h.pub.Calls()) == 1 })
	h.waitIdle()
	if err := h.r.Health(); err != nil {
		t.Fatalf("Health() after a failed publish = %v; want nil", err)
	}
	if n := h.store.Len(); n != 1 {
		t.Fatalf("%d rows pending after a failed publish; want the row kept for its retry", n)
	}
}
