// Package metrictest is an in-memory OpenTelemetry MeterProvider for the
// library's tests: it keeps what the instruments report and hands it out on
// Collect, as the SDK's ManualReader does with cumulative temporality.
//
// It keeps the OpenTelemetry SDK out of the library's module graph (see
// scripts/importer-check.sh). Recorded: int64 counters and float64
// histograms (cumulative per attribute set, from their first measurement)
// and observable gauges (what the callbacks observed during the latest
// Collect); instruments of other kinds record nothing.
package metrictest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/embedded"
	"go.opentelemetry.io/otel/metric/noop"
)

// Kind is an instrument's kind as an exporter tells it apart.
type Kind string

// Instrument kinds.
const (
	Counter   Kind = "counter"
	Histogram Kind = "histogram"
	Gauge     Kind = "gauge"
)

// Point is one instrument's data for one attribute set.
type Point struct {
	Scope       string // the Meter's name
	Name        string
	Kind        Kind
	Unit        string
	Description string
	Attrs       attribute.Set
	// Value is a counter's cumulative sum, a gauge's observed value or a
	// histogram's sum of recordings.
	Value float64
	// Count is the number of a histogram's recordings (0 for the others).
	Count uint64
}

// Attr returns the point's attribute key as a string ("" when absent).
func (p Point) Attr(key string) string {
	v, _ := p.Attrs.Value(attribute.Key(key))
	return v.AsString()
}

// Reader records the measurements of the instruments of its MeterProvider.
type Reader struct {
	mu        sync.Mutex
	instr     map[string]*desc // by name
	sync      map[seriesKey]*Point
	callbacks map[int]func(context.Context, metric.Observer) error
	next      int
}

type desc struct {
	scope, name, unit, description string
	kind                           Kind
}

type seriesKey struct {
	name  string
	attrs attribute.Distinct
}

// NewReader returns an empty Reader.
func NewReader() *Reader {
	return &Reader{instr: map[string]*desc{}, sync: map[seriesKey]*Point{}, callbacks: map[int]func(context.Context, metric.Observer) error{}}
}

// MeterProvider returns the provider whose instruments r records.
func (r *Reader) MeterProvider() metric.MeterProvider { return provider{r: r} }

// Collect runs the registered callbacks and returns every series, sorted by
// instrument name and attributes.
func (r *Reader) Collect(ctx context.Context) ([]Point, error) {
	r.mu.Lock()
	cbs := make([]func(context.Context, metric.Observer) error, 0, len(r.callbacks))
	for _, id := range slices.Sorted(maps.Keys(r.callbacks)) {
		cbs = append(cbs, r.callbacks[id])
	}
	r.mu.Unlock()

	obs := &observer{points: map[seriesKey]*Point{}}
	var errs []string
	for _, cb := range cbs {
		if err := cb(ctx, obs); err != nil {
			errs = append(errs, err.Error())
		}
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Point, 0, len(r.sync)+len(obs.points))
	for _, p := range r.sync {
		out = append(out, *p)
	}
	obs.mu.Lock()
	for _, p := range obs.points {
		out = append(out, *p)
	}
	obs.mu.Unlock()
	enc := attribute.DefaultEncoder()
	slices.SortFunc(out, func(a, b Point) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.Attrs.Encoded(enc), b.Attrs.Encoded(enc)))
	})
	if errs != nil {
		return out, fmt.Errorf("metrictest: callbacks failed: %s", strings.Join(errs, "; "))
	}
	return out, nil
}

// define registers an instrument; a second instrument of one name keeps the
// first one's description, as the SDK aggregates them into one stream.
func (r *Reader) define(scope, name string, kind Kind, unit, description string) *desc {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d, ok := r.instr[name]; ok {
		return d
	}
	d := &desc{scope: scope, name: name, kind: kind, unit: unit, description: description}
	r.instr[name] = d
	return d
}

// record adds a synchronous measurement.
func (r *Reader) record(d *desc, v float64, attrs attribute.Set) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := seriesKey{name: d.name, attrs: attrs.Equivalent()}
	p := r.sync[k]
	if p == nil {
		p = &Point{Scope: d.scope, Name: d.name, Kind: d.kind, Unit: d.unit, Description: d.description, Attrs: attrs}
		r.sync[k] = p
	}
	p.Value += v
	if d.kind == Histogram {
		p.Count++
	}
}

func (r *Reader) register(cb func(context.Context, metric.Observer) error) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next++
	r.callbacks[r.next] = cb
	return r.next
}

type provider struct {
	embedded.MeterProvider
	r *Reader
}

func (p provider) Meter(name string, _ ...metric.MeterOption) metric.Meter {
	return &meter{r: p.r, scope: name}
}

type meter struct {
	noop.Meter
	r     *Reader
	scope string
}

func (m *meter) Int64Counter(name string, opts ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	c := metric.NewInt64CounterConfig(opts...)
	return int64Counter{d: m.r.define(m.scope, name, Counter, c.Unit(), c.Description()), r: m.r}, nil
}

func (m *meter) Float64Histogram(name string, opts ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	c := metric.NewFloat64HistogramConfig(opts...)
	return float64Histogram{d: m.r.define(m.scope, name, Histogram, c.Unit(), c.Description()), r: m.r}, nil
}

func (m *meter) Int64ObservableGauge(name string, opts ...metric.Int64ObservableGaugeOption) (metric.Int64ObservableGauge, error) {
	c := metric.NewInt64ObservableGaugeConfig(opts...)
	if len(c.Callbacks()) > 0 {
		return nil, errors.New("metrictest: Int64ObservableGauge: observe it with RegisterCallback")
	}
	return &int64Gauge{d: m.r.define(m.scope, name, Gauge, c.Unit(), c.Description())}, nil
}

func (m *meter) Float64ObservableGauge(name string, opts ...metric.Float64ObservableGaugeOption) (metric.Float64ObservableGauge, error) {
	c := metric.NewFloat64ObservableGaugeConfig(opts...)
	g := &float64Gauge{d: m.r.define(m.scope, name, Gauge, c.Unit(), c.Description())}
	for _, cb := range c.Callbacks() {
		m.r.register(func(ctx context.Context, o metric.Observer) error {
			return cb(ctx, float64Observer{o: o, g: g})
		})
	}
	return g, nil
}

func (m *meter) RegisterCallback(cb metric.Callback, instruments ...metric.Observable) (metric.Registration, error) {
	for _, in := range instruments {
		switch in.(type) {
		case *int64Gauge, *float64Gauge:
		default:
			return nil, fmt.Errorf("metrictest: RegisterCallback: %T is not an observable instrument of this provider", in)
		}
	}
	id := m.r.register(func(ctx context.Context, o metric.Observer) error { return cb(ctx, o) })
	return &registration{r: m.r, id: id}, nil
}

type registration struct {
	embedded.Registration
	r  *Reader
	id int
}

func (g *registration) Unregister() error {
	g.r.mu.Lock()
	defer g.r.mu.Unlock()
	delete(g.r.callbacks, g.id)
	return nil
}

type int64Counter struct {
	noop.Int64Counter
	d *desc
	r *Reader
}

func (c int64Counter) Enabled(context.Context) bool { return true }
func (c int64Counter) Add(_ context.Context, v int64, opts ...metric.AddOption) {
	c.r.record(c.d, float64(v), metric.NewAddConfig(opts).Attributes())
}

type float64Histogram struct {
	noop.Float64Histogram
	d *desc
	r *Reader
}

func (h float64Histogram) Enabled(context.Context) bool { return true }
func (h float64Histogram) Record(_ context.Context, v float64, opts ...metric.RecordOption) {
	h.r.record(h.d, v, metric.NewRecordConfig(opts).Attributes())
}

type int64Gauge struct {
	noop.Int64ObservableGauge
	d *desc
}

type float64Gauge struct {
	noop.Float64ObservableGauge
	d *desc
}

// observer keeps one Collect's observations; the latest one of a series wins.
type observer struct {
	embedded.Observer
	mu     sync.Mutex
	points map[seriesKey]*Point
}

func (o *observer) observe(d *desc, v float64, attrs attribute.Set) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.points[seriesKey{name: d.name, attrs: attrs.Equivalent()}] = &Point{Scope: d.scope, Name: d.name, Kind: d.kind, Unit: d.unit, Description: d.description, Attrs: attrs, Value: v}
}

func (o *observer) ObserveFloat64(obsrv metric.Float64Observable, v float64, opts ...metric.ObserveOption) {
	if g, ok := obsrv.(*float64Gauge); ok {
		o.observe(g.d, v, metric.NewObserveConfig(opts).Attributes())
	}
}

func (o *observer) ObserveInt64(obsrv metric.Int64Observable, v int64, opts ...metric.ObserveOption) {
	if g, ok := obsrv.(*int64Gauge); ok {
		o.observe(g.d, float64(v), metric.NewObserveConfig(opts).Attributes())
	}
}

// float64Observer serves a gauge's own callbacks (metric.WithFloat64Callback).
type float64Observer struct {
	embedded.Float64Observer
	o metric.Observer
	g *float64Gauge
}

func (o float64Observer) Observe(v float64, opts ...metric.ObserveOption) {
	o.o.ObserveFloat64(o.g, v, opts...)
}

// Readings are a Reader's values at one Collect, by instrument name.
type Readings struct {
	// Values holds counters (summed over their attribute sets) and gauges;
	// an instrument that reported nothing is absent.
	Values map[string]float64
	// Counts holds histograms' counts of measurements.
	Counts map[string]uint64
	// Names holds each counter's outbox.name attribute.
	Names map[string]string
}

// Read collects r's current values, failing t when Collect fails.
func (r *Reader) Read(t testing.TB) Readings {
	t.Helper()
	out := Readings{Values: map[string]float64{}, Counts: map[string]uint64{}, Names: map[string]string{}}
	for _, p := range r.points(t) {
		switch p.Kind {
		case Counter:
			out.Values[p.Name] += p.Value
			out.Names[p.Name] = p.Attr("outbox.name")
		case Gauge:
			out.Values[p.Name] = p.Value
		case Histogram:
			out.Counts[p.Name] += p.Count
		}
	}
	return out
}

// SumBy collects the points of instrument name and sums their values by
// their attribute key, failing t when Collect fails.
func (r *Reader) SumBy(t testing.TB, name, key string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, p := range r.points(t) {
		if p.Name == name {
			out[p.Attr(key)] += int64(p.Value)
		}
	}
	return out
}

func (r *Reader) points(t testing.TB) []Point {
	t.Helper()
	points, err := r.Collect(context.Background())
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	return points
}
