package relay

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// meterName is the instrumentation scope of the relay's instruments.
const meterName = "github.com/gorm-outbox/outbox/relay"

// Instrument names. Every instrument carries the attribute outbox.name
// (Options.MetricsName); MetricParked adds outbox.park.reason. Counters and histograms are recorded once per batch
// or cycle, never per message; gauges read state the relay cached and never
// query the store.
const (
	// MetricOwnedBuckets is a gauge of the buckets in the relay's local lease
	// set, updated on acquisition or invalidation.
	MetricOwnedBuckets = "outbox.owned_buckets"
	// MetricPublishAcknowledged counts the acknowledged prefix the publisher
	// reported, before lease validation and deletion: it counts attempts,
	// so a retried batch counts again.
	MetricPublishAcknowledged = "outbox.publish.acknowledged"
	// MetricPublishFailures counts Publish calls that returned an error,
	// once per call; cancellation by a stop and store errors are excluded.
	MetricPublishFailures = "outbox.publish.failures"
	// MetricLeaseExpirations counts observed losses of a nonempty lease set
	// (once per loss, not per bucket).
	MetricLeaseExpirations = "outbox.lease.expirations"
	// MetricFenced counts buckets the broker fenced: with
	// kafkapub.Config.Transactions, a publish refused because another relay
	// initialised the bucket's transactional id (the relay drops the
	// bucket). Nonzero means two relays believed they owned a bucket: a
	// relay that stalled past its lease, or a clock or configuration fault.
	MetricFenced = "outbox.fenced"
	// MetricPublishDuration is a histogram of whole Publish calls, failed
	// and cancelled ones included, in seconds.
	MetricPublishDuration = "outbox.publish.duration"
	// MetricCycleDuration is a histogram of relay cycles (acquisition,
	// discovery and one sweep), excluding idle waits and backoff, in seconds.
	// With buckets served concurrently a sweep goes on while hints keep
	// buckets ready, up to the next discovery or rebalance.
	MetricCycleDuration = "outbox.cycle.duration"
	// MetricPendingMessages is a gauge of the whole store's pending rows from
	// the latest backlog sample; absent while no sample is available.
	MetricPendingMessages = "outbox.pending.messages"
	// MetricPendingOldestAge is a gauge of the age of the oldest pending row
	// of the latest sample, in seconds, growing between samples; absent
	// while unknown.
	MetricPendingOldestAge = "outbox.pending.oldest_age"
	// MetricPendingAvailable is 1 when a backlog sample is available, and 0
	// without Options.MetricsBacklog, before the first sample, when the
	// store cannot sample, or after a failed, timed-out or nil sample.
	MetricPendingAvailable = "outbox.pending.available"
	// MetricHeadOldestAge is a gauge of how long the longest-failing head
	// row of the relay's owned buckets has been failing, in seconds: for
	// each bucket whose head row is being retried (its publish failed) or
	// that backs off from its own store error (its NextBatch or
	// MarkPublished failed), the time since the first of those consecutive
	// failures, and the maximum over the buckets; 0 when no head row is
	// failing. It resets when the bucket's next batch succeeds or the bucket
	// is no longer owned. Read from the relay's state, never a query; one
	// alert ("a bucket has been stuck for N minutes") is
	// max(outbox.head.oldest_age) > N*60.
	MetricHeadOldestAge = "outbox.head.oldest_age"
	// MetricPublishStalled is a gauge of how long publishing has made no
	// progress, in seconds on the relay's clock: since the start of the
	// oldest Publish call in flight or, while failed publishes are being
	// retried with none acknowledged since, since the start of the first
	// of them; 0 when no publish is in flight and none is being retried.
	// A hung or paused broker shows as this value growing through every
	// failed attempt and its backoff until a publish is acknowledged (an
	// in-flight age alone fell back at each failed attempt, so an alert's
	// "for" never held). One alert ("the broker does not answer") is
	// max(outbox.publish.stalled) > a bound, for a while. Read from the
	// relay's state, never blocking.
	MetricPublishStalled = "outbox.publish.stalled"
	// MetricParked counts the rows the relay parked (see Store.Park and
	// Options.ParkPolicy), with the attribute outbox.park.reason
	// (AttrParkReason): ParkReasonUnpublishable (a row that failed
	// Options.ParkAfter times with an error wrapping ErrUnpublishable),
	// ParkReasonFailure (any other failure, under ParkAnyFailure),
	// ParkReasonCorrupt (a row the store cannot decode) or ParkReasonHeld
	// (kept for dashboards: since the store holds a parked row's later rows
	// by its read, without marking them, it stays 0). Recorded once per
	// park call; all four series start at 0. An alert on a parked row is
	// increase(outbox.parked{outbox.park.reason!="held"}) > 0.
	MetricParked = "outbox.parked"
	// MetricParkedMessages is a gauge of the whole store's parked rows (not
	// the rows waiting behind them, which are pending) from the latest
	// backlog sample (Pending.Parked; see
	// Options.MetricsBacklog), 0 for a store that cannot park; absent while
	// no sample is available. Rows leave it when an operator requeues or
	// deletes them (ParkAdmin).
	MetricParkedMessages = "outbox.parked.messages"
	// MetricClockOffset is a gauge of the offset of the store's clock (the
	// database server's, for gormstore) to the relay host's wall clock, in
	// seconds, database minus host, as the store measured it at its latest
	// acquisition round or renewal (Store.ClockOffset); absent while the
	// store reports none. Leases do not depend on it (they run on the
	// store's clock); the backlog ages do, as they compare created_at,
	// stamped by the writers' hosts, with this host's clock. The relay logs
	// a warning when it exceeds ClockOffsetWarnThreshold.
	MetricClockOffset = "outbox.clock.offset"
)

// ClockOffsetWarnThreshold is the clock offset (MetricClockOffset) beyond
// which the relay logs a warning, once, when the offset minus its
// uncertainty exceeds it; it warns again only after the offset came back
// within it.
const ClockOffsetWarnThreshold = time.Second

// AttrParkReason is the attribute of MetricParked saying why rows were
// parked: one of the ParkReason values.
const AttrParkReason = "outbox.park.reason"

// Values of AttrParkReason.
const (
	ParkReasonUnpublishable = "unpublishable"
	ParkReasonFailure       = "failure"
	ParkReasonCorrupt       = "corrupt"
	ParkReasonHeld          = "held"
)

// instruments are a relay's OpenTelemetry instruments.
type instruments struct {
	attrs       metric.MeasurementOption
	meter       metric.Meter
	owned       metric.Int64ObservableGauge
	acked       metric.Int64Counter
	failures    metric.Int64Counter
	expirations metric.Int64Counter
	fenced      metric.Int64Counter
	publishDur  metric.Float64Histogram
	cycleDur    metric.Float64Histogram
	pendingMsgs metric.Int64ObservableGauge
	pendingAge  metric.Float64ObservableGauge
	pendingOK   metric.Int64ObservableGauge
	headAge     metric.Float64ObservableGauge
	stalled     metric.Float64ObservableGauge
	parked      metric.Int64Counter
	parkedMsgs  metric.Int64ObservableGauge
	clockOffset metric.Float64ObservableGauge
	parkAttrs   map[string]metric.MeasurementOption // AttrParkReason value → outbox.name and that reason
}

// pendingSample is a cached backlog sample.
type pendingSample struct {
	count  int64
	oldest time.Time // zero: unknown (or empty store)
	parked int64
	at     time.Time // when it was taken, on the relay's clock
}

func newInstruments(mp metric.MeterProvider, name string) (*instruments, error) {
	m := mp.Meter(meterName)
	in := &instruments{meter: m, attrs: metric.WithAttributeSet(attribute.NewSet(attribute.String("outbox.name", name))), parkAttrs: map[string]metric.MeasurementOption{}}
	for _, reason := range []string{ParkReasonUnpublishable, ParkReasonFailure, ParkReasonCorrupt, ParkReasonHeld} {
		in.parkAttrs[reason] = metric.WithAttributeSet(attribute.NewSet(attribute.String("outbox.name", name), attribute.String(AttrParkReason, reason)))
	}
	var err error
	seconds := []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}
	steps := []func() error{
		func() error {
			in.owned, err = m.Int64ObservableGauge(MetricOwnedBuckets, metric.WithUnit("{bucket}"), metric.WithDescription("Buckets in the relay's local lease set."))
			return err
		},
		func() error {
			in.acked, err = m.Int64Counter(MetricPublishAcknowledged, metric.WithUnit("{message}"), metric.WithDescription("Acknowledged prefix reported by the publisher, counting attempts."))
			return err
		},
		func() error {
			in.failures, err = m.Int64Counter(MetricPublishFailures, metric.WithUnit("{attempt}"), metric.WithDescription("Publish calls that returned an error."))
			return err
		},
		func() error {
			in.expirations, err = m.Int64Counter(MetricLeaseExpirations, metric.WithUnit("{event}"), metric.WithDescription("Observed losses of a nonempty lease set."))
			return err
		},
		func() error {
			in.fenced, err = m.Int64Counter(MetricFenced, metric.WithUnit("{bucket}"), metric.WithDescription("Buckets dropped because the broker fenced their transactional producer."))
			return err
		},
		func() error {
			in.publishDur, err = m.Float64Histogram(MetricPublishDuration, metric.WithUnit("s"), metric.WithDescription("Duration of whole Publish calls."), metric.WithExplicitBucketBoundaries(seconds...))
			return err
		},
		func() error {
			in.cycleDur, err = m.Float64Histogram(MetricCycleDuration, metric.WithUnit("s"), metric.WithDescription("Duration of relay cycles, excluding idle waits."), metric.WithExplicitBucketBoundaries(seconds...))
			return err
		},
		func() error {
			in.pendingMsgs, err = m.Int64ObservableGauge(MetricPendingMessages, metric.WithUnit("{message}"), metric.WithDescription("Pending rows in the whole store, from the latest sample."))
			return err
		},
		func() error {
			in.pendingAge, err = m.Float64ObservableGauge(MetricPendingOldestAge, metric.WithUnit("s"), metric.WithDescription("Age of the oldest pending row."))
			return err
		},
		func() error {
			in.pendingOK, err = m.Int64ObservableGauge(MetricPendingAvailable, metric.WithUnit("1"), metric.WithDescription("1 when a backlog sample is available, else 0."))
			return err
		},
	}
	steps = append(steps, func() error {
		in.headAge, err = m.Float64ObservableGauge(MetricHeadOldestAge, metric.WithUnit("s"), metric.WithDescription("How long the longest-failing head row of the owned buckets has been failing; 0 when none is."))
		return err
	})
	steps = append(steps, func() error {
		in.stalled, err = m.Float64ObservableGauge(MetricPublishStalled, metric.WithUnit("s"), metric.WithDescription("How long publishing has made no progress: since the start of the oldest publish in flight, or of the first of the failed publishes being retried since the last acknowledgement; 0 when none."))
		return err
	})
	steps = append(steps, func() error {
		in.parked, err = m.Int64Counter(MetricParked, metric.WithUnit("{message}"), metric.WithDescription("Rows parked by the relay, by reason (unpublishable, failure, corrupt, held)."))
		return err
	}, func() error {
		in.parkedMsgs, err = m.Int64ObservableGauge(MetricParkedMessages, metric.WithUnit("{message}"), metric.WithDescription("Parked rows in the whole store, from the latest sample."))
		return err
	}, func() error {
		in.clockOffset, err = m.Float64ObservableGauge(MetricClockOffset, metric.WithUnit("s"), metric.WithDescription("Offset of the store's (database's) clock to the relay host's clock, database minus host."))
		return err
	})
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, err
		}
	}
	return in, nil
}

// exportCounters adds 0 to every counter (and every park reason), so that
// each series exists from the start: increase() and rate() then see the
// first failure, fence or park, not only the second.
func (in *instruments) exportCounters(ctx context.Context) {
	for _, c := range []metric.Int64Counter{in.acked, in.failures, in.expirations, in.fenced} {
		c.Add(ctx, 0, in.attrs)
	}
	for _, attrs := range in.parkAttrs {
		in.parked.Add(ctx, 0, attrs)
	}
}

// countParked adds n rows to MetricParked with reason (a ParkReason value).
func (in *instruments) countParked(reason string, n int) {
	in.parked.Add(context.Background(), int64(n), in.parkAttrs[reason])
}

// register installs the gauge callback, which reads only cached state.
func (r *Relay) registerGauges() (metric.Registration, error) {
	in := r.m
	return in.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(in.owned, r.ownedCount.Load(), in.attrs)
		var headAge float64
		if since := r.stuckSince.Load(); since != 0 {
			headAge = max(0, r.clock.Now().Sub(time.Unix(0, since)).Seconds())
		}
		o.ObserveFloat64(in.headAge, headAge, in.attrs)
		var stalled float64
		if since := r.stalledSince(); !since.IsZero() {
			stalled = max(0, r.clock.Now().Sub(since).Seconds())
		}
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
	}, in.owned, in.pendingMsgs, in.pendingAge, in.pendingOK, in.headAge, in.stalled, in.parkedMsgs, in.clockOffset)
}

// stalledSince is when publishing stopped making progress (see
// MetricPublishStalled): the start of the oldest publish in flight, or of
// the first failed publish being retried since the last acknowledgement,
// whichever is earlier; zero when neither.
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

// sampleBacklog runs the backlog sampler until ctx is done: one query at a
// time, bounded by MetricsTimeout, then a wait of MetricsInterval.
//
// OpenTelemetry's Go API does not tell a callback whether a reader is
// attached, so the sampler cannot run "only while observed": it runs only
// when Options.MetricsBacklog asks for it, and only while Run is running.
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
				r.logFailure(ctx, "backlog", "backlog sample failed", err)
				r.pending.Store(nil)
			case p == nil || p.Count < 0:
				r.pending.Store(nil)
			case r.opts.MetricsBucketZeroOnly && !r.ownsBucketZero():
				r.pending.Store(nil) // ownership lost during the query
			default:
				r.pending.Store(&pendingSample{count: p.Count, oldest: p.Oldest, parked: max(p.Parked, 0), at: r.clock.Now()})
			}
			if err == nil {
				r.logRecovered(ctx, "backlog", "backlog sample succeeds again")
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

// backlogLooksDrained is called when a discovery found none of the owned
// buckets pending. If the cached sample still counts pending rows and is
// older than PollInterval, the sampler takes a new one now instead of at
// the end of MetricsInterval: the gauges never show a drained backlog for
// longer than about one poll interval (they showed 20,000 rows for a
// minute after a drain). While peers still drain their buckets this
// samples at most once per PollInterval.
func (r *Relay) backlogLooksDrained() {
	s := r.pending.Load()
	if !r.sample || s == nil || s.count == 0 || r.clock.Now().Sub(s.at) < r.opts.PollInterval {
		return
	}
	select {
	case r.resample <- struct{}{}:
	default:
	}
}

// ownsBucketZero reports whether the relay holds a locally valid lease on
// bucket 0.
func (r *Relay) ownsBucketZero() bool {
	until := r.zeroUntil.Load()
	return until != 0 && r.clock.Now().UnixNano() < until
}
