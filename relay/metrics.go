package relay

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

const meterName = "github.com/gorm-outbox/outbox/relay"

// Instrument names. Every instrument carries the attribute outbox.name
// (Options.MetricsName); MetricParked adds outbox.park.reason. Gauges read
// state the relay cached and never query the store. docs/operating.md
// lists them with their alerts.
const (
	MetricOwnedBuckets        = "outbox.owned_buckets"        // gauge: buckets the relay owns
	MetricUnownedBuckets      = "outbox.buckets.unowned"      // gauge: buckets without a live owner at the latest round (the fleet's: alert on its max)
	MetricPublishAcknowledged = "outbox.publish.acknowledged" // counter: acknowledged rows, counting attempts
	MetricPublishFailures     = "outbox.publish.failures"     // counter: batches whose publish failed, a stop's cancellation aside
	MetricLeaseExpirations    = "outbox.lease.expirations"    // counter: losses of a nonempty lease set
	MetricFenced              = "outbox.fenced"               // counter: buckets the broker fenced (ErrFenced): two relays believed they owned them
	MetricPublishDuration     = "outbox.publish.duration"     // histogram: Publish calls, in seconds
	MetricCycleDuration       = "outbox.cycle.duration"       // histogram: relay cycles excluding idle waits, in seconds
	MetricPendingMessages     = "outbox.pending.messages"     // gauge: the store's pending rows at the latest backlog sample
	MetricPendingOldestAge    = "outbox.pending.oldest_age"   // gauge: age of the oldest pending row of the latest sample, in seconds
	MetricPendingAvailable    = "outbox.pending.available"    // gauge: 1 when a backlog sample is available, else 0
	MetricHeadOldestAge       = "outbox.head.oldest_age"      // gauge: how long the longest-failing head row has failed, in seconds; 0: none
	MetricParked              = "outbox.parked"               // counter: rows parked, by AttrParkReason, every series from 0
	MetricParkedMessages      = "outbox.parked.messages"      // gauge: the store's parked rows at the latest backlog sample
	MetricClockOffset         = "outbox.clock.offset"         // gauge: the store's clock minus the host's, in seconds
	// MetricPublishStalled is a gauge of how long publishing has made no
	// progress, in seconds: since the start of the oldest Publish in flight
	// or of the first failed publish retried since an acknowledgement.
	MetricPublishStalled = "outbox.publish.stalled"
)

// ClockOffsetWarnThreshold is the clock offset beyond which the relay warns.
const ClockOffsetWarnThreshold = time.Second

// AttrParkReason is MetricParked's attribute: why rows were parked.
const AttrParkReason = "outbox.park.reason"

// Values of AttrParkReason.
const (
	ParkReasonUnpublishable = "unpublishable"
	ParkReasonFailure       = "failure"
	ParkReasonCorrupt       = "corrupt"
	ParkReasonHeld          = "held"
)

type instruments struct {
	attrs                                        metric.MeasurementOption
	meter                                        metric.Meter
	owned, unowned, pendingMsgs, pendingOK       metric.Int64ObservableGauge
	parkedMsgs                                   metric.Int64ObservableGauge
	acked, failures, expirations, fenced, parked metric.Int64Counter
	publishDur, cycleDur                         metric.Float64Histogram
	pendingAge, headAge, stalled, clockOffset    metric.Float64ObservableGauge
	parkAttrs                                    map[string]metric.MeasurementOption // AttrParkReason value → outbox.name and that reason
}

// pendingSample is a cached backlog sample, taken at at.
type pendingSample struct {
	count, parked int64
	oldest, at    time.Time // oldest zero: unknown
}

func newInstruments(mp metric.MeterProvider, name string) (*instruments, error) {
	m := mp.Meter(meterName)
	in := &instruments{meter: m, attrs: metric.WithAttributeSet(attribute.NewSet(attribute.String("outbox.name", name))), parkAttrs: map[string]metric.MeasurementOption{}}
	for _, reason := range []string{ParkReasonUnpublishable, ParkReasonFailure, ParkReasonCorrupt, ParkReasonHeld} {
		in.parkAttrs[reason] = metric.WithAttributeSet(attribute.NewSet(attribute.String("outbox.name", name), attribute.String(AttrParkReason, reason)))
	}
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		return noting[metric.Int64Counter](&errs)(m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc)))
	}
	intGauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		return noting[metric.Int64ObservableGauge](&errs)(m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc)))
	}
	floatGauge := func(name, desc string) metric.Float64ObservableGauge {
		return noting[metric.Float64ObservableGauge](&errs)(m.Float64ObservableGauge(name, metric.WithUnit("s"), metric.WithDescription(desc)))
	}
	seconds := metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
	histogram := func(name, desc string) metric.Float64Histogram {
		return noting[metric.Float64Histogram](&errs)(m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), seconds))
	}
	in.owned = intGauge(MetricOwnedBuckets, "{bucket}", "Buckets in the relay's local lease set.")
	in.unowned = intGauge(MetricUnownedBuckets, "{bucket}", "Buckets without a live owner in the lease table, at the relay's latest acquisition round.")
	in.acked = counter(MetricPublishAcknowledged, "{message}", "Acknowledged prefix reported by the publisher, counting attempts.")
	in.failures = counter(MetricPublishFailures, "{attempt}", "Batches whose publish returned an error.")
	in.expirations = counter(MetricLeaseExpirations, "{event}", "Observed losses of a nonempty lease set.")
	in.fenced = counter(MetricFenced, "{bucket}", "Buckets dropped because the broker fenced their transactional producer.")
	in.publishDur = histogram(MetricPublishDuration, "Duration of whole publish calls.")
	in.cycleDur = histogram(MetricCycleDuration, "Duration of relay cycles, excluding idle waits.")
	in.pendingMsgs = intGauge(MetricPendingMessages, "{message}", "Pending rows in the whole store, from the latest sample.")
	in.pendingAge = floatGauge(MetricPendingOldestAge, "Age of the oldest pending row.")
	in.pendingOK = intGauge(MetricPendingAvailable, "1", "1 when a backlog sample is available, else 0.")
	in.headAge = floatGauge(MetricHeadOldestAge, "How long the longest-failing head row of the owned buckets has been failing; 0 when none is.")
	in.stalled = floatGauge(MetricPublishStalled, "How long publishing has made no progress: since the start of the oldest publish in flight, or of the first of the failed publishes being retried since the last acknowledgement; 0 when none.")
	in.parked = counter(MetricParked, "{message}", "Rows parked by the relay, by reason (unpublishable, failure, corrupt, held).")
	in.parkedMsgs = intGauge(MetricParkedMessages, "{message}", "Parked rows in the whole store, from the latest sample.")
	in.clockOffset = floatGauge(MetricClockOffset, "Offset of the store's (database's) clock to the relay host's clock, database minus host.")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return in, nil
}

func noting[T any](errs *[]error) func(v T, err error) T {
	return func(v T, err error) T {
		*errs = append(*errs, err)
		return v
	}
}

// exportCounters adds 0 to every counter, so that increase() sees the first event.
func (in *instruments) exportCounters(ctx context.Context) {
	for _, c := range []metric.Int64Counter{in.acked, in.failures, in.expirations, in.fenced} {
		c.Add(ctx, 0, in.attrs)
	}
	for _, attrs := range in.parkAttrs {
		in.parked.Add(ctx, 0, attrs)
	}
}

func (in *instruments) countParked(reason string, n int) {
	in.parked.Add(context.Background(), int64(n), in.parkAttrs[reason])
}

func (r *Relay) registerGauges() (metric.Registration, error) {
	in := r.m
	return in.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(in.owned, r.ownedCount.Load(), in.attrs)
		if n := r.unowned.Load(); n >= 0 {
			o.ObserveInt64(in.unowned, n, in.attrs)
		}
		var headAge, stalled float64 // seconds; 0: none
		if since := r.stuckSince.Load(); since != 0 {
			headAge = max(0, r.clock.Now().Sub(time.Unix(0, since)).Seconds())
		}
		if since := r.stalledSince(); !since.IsZero() {
			stalled = max(0, r.clock.Now().Sub(since).Seconds())
		}
		o.ObserveFloat64(in.headAge, headAge, in.attrs)
		o.ObserveFloat64(in.stalled, stalled, in.attrs)
		if off, _, ok := r.store.ClockOffset(); ok {
			o.ObserveFloat64(in.clockOffset, off.Seconds(), in.attrs)
		}
		s := r.pending.Load()
		if s == nil {
			o.ObserveInt64(in.pendingOK, 0, in.attrs)
			return nil
		}
		o.ObserveInt64(in.pendingOK, 1, in.attrs)
		o.ObserveInt64(in.pendingMsgs, s.count, in.attrs)
		o.ObserveInt64(in.parkedMsgs, s.parked, in.attrs)
		switch {
		case s.count == 0:
			o.ObserveFloat64(in.pendingAge, 0, in.attrs)
		case !s.oldest.IsZero():
			o.ObserveFloat64(in.pendingAge, max(0, r.clock.Now().Sub(s.oldest).Seconds()), in.attrs)
		}
		return nil
	}, in.owned, in.unowned, in.pendingMsgs, in.pendingAge, in.pendingOK, in.headAge, in.stalled, in.parkedMsgs, in.clockOffset)
}

// stalledSince is when publishing stopped making progress; zero when it did not.
func (r *Relay) stalledSince() time.Time {
	var since time.Time
	if p := r.pubFail.Load(); p != nil {
		since = p.since
	}
	if ns := r.publishSince.Load(); ns != 0 {
		if t := time.Unix(0, ns); since.IsZero() || t.Before(since) {
			since = t
		}
	}
	return since
}

func (r *Relay) sampleBacklog(ctx context.Context) {
	for {
		if r.opts.MetricsBucketZeroOnly && !r.ownsBucketZero() {
			r.pending.Store(nil)
		} else {
			qctx, cancel := context.WithTimeout(ctx, r.opts.MetricsTimeout)
			p, err := r.store.PendingMetrics(qctx)
			cancel()
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				r.repeats.Log(ctx, r.log, r.clock.Now(), "backlog", "backlog sample failed", err)
				r.pending.Store(nil)
			case p == nil || p.Count < 0:
				r.pending.Store(nil)
			case r.opts.MetricsBucketZeroOnly && !r.ownsBucketZero():
				r.pending.Store(nil) // ownership lost during the query
			default:
				r.pending.Store(&pendingSample{count: p.Count, oldest: p.Oldest, parked: max(p.Parked, 0), at: r.clock.Now()})
			}
			if err == nil {
				r.repeats.LogRecovered(ctx, r.log, r.clock.Now(), "backlog", "backlog sample succeeds again")
			}
		}
		tc, stop := r.clock.NewTimer(r.opts.MetricsInterval)
		select {
		case <-ctx.Done():
			stop()
			return
		case <-tc:
		case <-r.resample:
			stop()
		}
	}
}

// backlogLooksDrained resamples a stale sample still counting rows after an empty discovery.
func (r *Relay) backlogLooksDrained() {
	s := r.pending.Load()
	if !r.opts.MetricsBacklog || s == nil || s.count == 0 || r.clock.Now().Sub(s.at) < r.opts.PollInterval {
		return
	}
	nudge(r.resample)
}

func (r *Relay) ownsBucketZero() bool {
	until := r.zeroUntil.Load()
	return until != 0 && r.clock.Now().UnixNano() < until
}

// inflightPublishes keeps publishSince at the start of the oldest Publish in flight.
type inflightPublishes struct {
	mu     sync.Mutex
	starts []time.Time
}

// track records a publish started at start, or its end, and the oldest start.
func (p *inflightPublishes) track(r *Relay, start time.Time, done bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if done {
		i := slices.Index(p.starts, start)
		p.starts = slices.Delete(p.starts, i, i+1)
	} else {
		p.starts = append(p.starts, start)
	}
	var oldest int64 // UnixNano; 0: none
	if len(p.starts) > 0 {
		oldest = slices.MinFunc(p.starts, time.Time.Compare).UnixNano()
	}
	r.publishSince.Store(oldest)
}
