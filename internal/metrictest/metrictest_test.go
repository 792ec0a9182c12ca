package metrictest_test

import (
	"context"
	"slices"
	"testing"

	"github.com/gorm-outbox/outbox/internal/metrictest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

func TestReaderKeepsWhatTheSDKsManualReaderWould(t *testing.T) {
	ctx := context.Background()
	r := metrictest.NewReader()
	m := r.MeterProvider().Meter("scope")
	a := metric.WithAttributeSet(attribute.NewSet(attribute.String("k", "a")))
	b := metric.WithAttributes(attribute.String("k", "b"))

	c, _ := m.Int64Counter("c", metric.WithUnit("{x}"), metric.WithDescription("a counter"))
	if !c.Enabled(ctx) {
		t.Error("counter not enabled")
	}
	c.Add(ctx, 2, a)
	c.Add(ctx, 3, a)
	c.Add(ctx, 0, b) // a zero measurement creates the series
	h, _ := m.Float64Histogram("h", metric.WithUnit("s"))
	h.Record(ctx, 0.5, a)
	h.Record(ctx, 1.5, a)
	g, _ := m.Int64ObservableGauge("g")
	f, _ := m.Float64ObservableGauge("f", metric.WithFloat64Callback(func(_ context.Context, o metric.Float64Observer) error {
		o.Observe(1.25, a)
		return nil
	}))
	_ = f
	observe := true
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		if observe {
			o.ObserveInt64(g, 7, a)
		}
		return nil
	}, g)
	if err != nil {
		t.Fatal(err)
	}

	type row struct {
		name  string
		kind  metrictest.Kind
		k     string
		value float64
		count uint64
	}
	read := func() []row {
		t.Helper()
		ps, err := r.Collect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []row
		for _, p := range ps {
			if p.Scope != "scope" {
				t.Errorf("%s: scope %q", p.Name, p.Scope)
			}
			out = append(out, row{p.Name, p.Kind, p.Attr("k"), p.Value, p.Count})
		}
		return out
	}
	want := []row{
		{"c", metrictest.Counter, "a", 5, 0},
		{"c", metrictest.Counter, "b", 0, 0},
		{"f", metrictest.Gauge, "a", 1.25, 0},
		{"g", metrictest.Gauge, "a", 7, 0},
		{"h", metrictest.Histogram, "a", 2, 2},
	}
	if got := read(); !slices.Equal(got, want) {
		t.Fatalf("first collect = %v; want %v", got, want)
	}
	// A gauge is what the latest collect observed; counters stay cumulative.
	observe = false
	c.Add(ctx, 1, a)
	want = []row{{"c", metrictest.Counter, "a", 6, 0}, {"c", metrictest.Counter, "b", 0, 0}, {"f", metrictest.Gauge, "a", 1.25, 0}, {"h", metrictest.Histogram, "a", 2, 2}}
	if got := read(); !slices.Equal(got, want) {
		t.Fatalf("second collect = %v; want %v", got, want)
	}
	observe = true
	if err := reg.Unregister(); err != nil {
		t.Fatal(err)
	}
	if got := read(); !slices.Equal(got, want) {
		t.Fatalf("collect after Unregister = %v; want %v", got, want)
	}
}
