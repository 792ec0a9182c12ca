package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/metrictest"
	"github.com/gorm-outbox/outbox/relay"
)

// Copies of the helpers of relay's own tests that the tests here use
// (relay/harness_test.go, metrics_test.go, park_test.go).

// t0 is the manual clocks' start.
var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// readings collects the reader's current values: counters and gauges by
// name (absent when not reported), histogram counts by name.
type readings struct {
	values map[string]float64
	counts map[string]uint64
	names  map[string]string // instrument → outbox.name attribute
}

func collect(t *testing.T, r *metrictest.Reader) readings {
	t.Helper()
	points, err := r.Collect(context.Background())
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	out := readings{values: map[string]float64{}, counts: map[string]uint64{}, names: map[string]string{}}
	for _, p := range points {
		switch p.Kind {
		case metrictest.Counter:
			out.values[p.Name] += p.Value
			out.names[p.Name] = p.Attr("outbox.name")
		case metrictest.Gauge:
			out.values[p.Name] = p.Value
		case metrictest.Histogram:
			out.counts[p.Name] += p.Count
		}
	}
	return out
}

// parkedCounts returns outbox.parked by outbox.park.reason.
func parkedCounts(t *testing.T, r *metrictest.Reader) map[string]int64 {
	t.Helper()
	points, err := r.Collect(context.Background())
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	out := map[string]int64{}
	for _, p := range points {
		if p.Name == relay.MetricParked {
			out[p.Attr(relay.AttrParkReason)] += int64(p.Value)
		}
	}
	return out
}
