package relay

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
)

// Defaults of Options. A zero Options field takes the matching default.
const (
	DefaultBucketCount          = 8
	DefaultBatchSize            = 500
	DefaultPollInterval         = time.Second
	DefaultErrorBackoff         = time.Second
	DefaultLeaseDuration        = 30 * time.Second
	DefaultLeaseRenewInterval   = 10 * time.Second
	DefaultMetricsName          = "outbox"
	DefaultMetricsInterval      = 30 * time.Second
	DefaultMetricsTimeout       = 5 * time.Second
	DefaultStopTimeout          = 10 * time.Second
	DefaultPublishFailureWindow = 5 * time.Minute
	DefaultParkAfter            = 3
	// DefaultMaxConcurrentBuckets serves up to four buckets at once: with
	// the default 8 buckets shared by two or three relays, each serves all
	// of its ready buckets together, overlapping database and broker round
	// trips, while holding at most four store connections (plus one for
	// renewal) and four batches in memory.
	DefaultMaxConcurrentBuckets = 4
	// DefaultMaxBatchBytes bounds a batch at 4 MiB: four produce requests
	// of kafkapub.Publisher's default 1 MiB, well above a batch of 500 typical
	// rows of a few KiB (so it rarely cuts one), while a bucket of 1 MiB
	// rows is published a few rows at a time instead of 500 MiB at once;
	// with DefaultMaxConcurrentBuckets it bounds a relay's batches in
	// memory to about 16 MiB.
	DefaultMaxBatchBytes = 4 << 20
)

// MaxRelayIDLength is the longest RelayID, the width of the owner column.
const MaxRelayIDLength = 128

// maxMetricsNameLength is the longest MetricsName.
const maxMetricsNameLength = 64

// Options configures a Relay. A zero Options consists entirely of default
// values; New rejects invalid values with an error naming the field.
//
// Which fields matter depends on the setup; the others can stay zero:
//   - Every relay: nothing. BucketCount comes from the store (gormstore:
//     its Config), and RelayID defaults to a unique one.
//   - Writers in the relay's process: pass Relay.Notifier (or Notifier) to
//     outbox.Plugin, so that a commit wakes the relay at once.
//   - Several relays or pods: HintTransport (a commit in one pod wakes the
//     relay owning its bucket in another; without it PollInterval bounds
//     the delay), LeaseDuration and LeaseRenewInterval (how soon a peer
//     takes over a dead relay's buckets, against the pause a live one
//     survives), MaxConcurrentBuckets (relays × it batches run against the
//     database at once).
//   - Large or uneven rows: BatchSize and MaxBatchBytes.
//   - Poison rows: ParkPolicy and ParkAfter.
//   - Monitoring: MeterProvider and MetricsName (one name per outbox);
//     MetricsBacklog (with MetricsInterval, MetricsTimeout, and
//     MetricsBucketZeroOnly for a fleet) for the backlog gauges;
//     PublishFailureWindow for Relay.Health; Logger.
//   - Shutdown: StopTimeout, within the orchestrator's grace period.
//   - Tests: Clock.
//   - Assertions an operator may add: MaxPublishDuration; ErrorBackoff
//     tunes the retry pace.
type Options struct {
	// BucketCount is the number of ordering buckets; it must equal the
	// writers' outbox.Config.BucketCount. Zero means the store's count
	// (Store.BucketCount), else, when the store does not know,
	// DefaultBucketCount (8); a value that disagrees with the store's fails
	// New with an error wrapping ErrMisconfigured; a negative value fails
	// New.
	BucketCount int

	// BatchSize is the number of rows fetched and published per batch. Zero
	// means DefaultBatchSize (500); a negative value fails New.
	BatchSize int

	// MaxBatchBytes bounds a batch in bytes as well (MessageSize: key, value
	// and headers): the relay publishes the longest prefix of each fetched
	// batch within the bound, and always at least one row, so a row larger
	// than the bound is published alone. Rows left out come first in the
	// bucket's next batch, in order. The store is asked for the bound at
	// fetch time (Store.NextBatch), so the rows are not even read.
	// Zero means DefaultMaxBatchBytes (4 MiB); a negative value fails New.
	MaxBatchBytes int64

	// MaxConcurrentBuckets is how many of its buckets one relay serves at
	// once, when the store gains from it (Store.ConcurrentBuckets: gormstore
	// on PostgreSQL and MySQL/MariaDB, not on SQLite): the fetch, publish
	// and delete of different buckets overlap, each bucket still having at
	// most one batch in flight, in order, under the same lease checks. A
	// bucket's slot goes to the next ready bucket as soon as its batch is
	// done, and buckets take turns (one still ready after its batch waits
	// behind the others). With 1, or on SQLite, buckets are served one
	// after the other (a bucket's delete still runs beside the next
	// bucket's fetch and publish). Zero means DefaultMaxConcurrentBuckets (4); a negative value
	// fails New.
	MaxConcurrentBuckets int

	// PollInterval is how often the relay looks for pending rows when no
	// hint arrives. Zero means DefaultPollInterval (1s); a negative value
	// fails New. A discovery that takes longer than a quarter of it (one
	// index probe per owned bucket: tens of thousands of buckets) waits
	// three times its own duration before the next, so discovery never
	// takes more than a quarter of the relay's time.
	PollInterval time.Duration

	// ErrorBackoff is the wait after a store error of the relay as a whole
	// (lease acquisition, discovery), and the first backoff of a failing
	// head row and of a bucket whose own store call (NextBatch,
	// MarkPublished) failed (doubling, jittered, up to LeaseRenewInterval).
	// Such a bucket backs off alone: the other buckets go on, and Health
	// does not count it (see Relay.Health). Zero means DefaultErrorBackoff
	// (1s); a negative value fails New.
	ErrorBackoff time.Duration

	// LeaseDuration is how long an acquired or renewed lease lasts: the time
	// until a peer takes over after the relay's last successful renewal.
	// Zero means DefaultLeaseDuration (30s); a negative value fails New.
	LeaseDuration time.Duration

	// LeaseRenewInterval is the rebalance cadence (one acquisition round per
	// interval) and the renewal cadence: the relay renews its leases on its own timer whenever
	// they have gone min(LeaseRenewInterval, half the remaining lease)
	// without being extended while it works (sweeps, publishes), so no
	// amount of work lets them lapse; an idle relay's acquisition rounds
	// extend them, with no extra call. It must be shorter than
	// LeaseDuration; the difference is the margin a renewal has before the
	// lease expires (a slow statement, a paused process) and, for a store
	// on the relay hosts' clocks (not gormstore, which uses the database's),
	// the tolerated clock skew between hosts. Zero means
	// DefaultLeaseRenewInterval (10s); a negative value fails New.
	LeaseRenewInterval time.Duration

	// MaxPublishDuration bounds a whole Publish call: a publish that takes
	// longer makes Run fail with an error wrapping ErrMisconfigured (the
	// leases are renewed during a publish whatever its length; this is an
	// operator's assertion that the broker answers within it).
	// MaxPublishDuration + LeaseRenewInterval must be shorter than
	// LeaseDuration. Zero means unset (no bound); a negative value fails
	// New.
	MaxPublishDuration time.Duration

	// RelayID identifies this relay in the lease table; it must be unique
	// among live relays. Empty means the host name plus a random suffix; a
	// value longer than MaxRelayIDLength (128) fails New.
	RelayID string

	// MetricsName is the value of the outbox.name attribute on every
	// instrument: the same for relays sharing a store, distinct for
	// independent stores. Empty means DefaultMetricsName ("outbox"); a blank
	// value or one longer than 64 characters fails New.
	MetricsName string

	// MetricsInterval is the wait after each backlog query before the next
	// one (see MetricsBacklog). Zero means DefaultMetricsInterval (30s); a
	// negative value fails New.
	MetricsInterval time.Duration

	// MetricsTimeout bounds one backlog query (see MetricsBacklog). Zero
	// means DefaultMetricsTimeout (5s); a negative value fails New.
	MetricsTimeout time.Duration

	// MetricsBacklog turns on the backlog sampler: while Run runs, the relay
	// asks the store for its pending rows (Store.PendingMetrics)
	// every MetricsInterval, and reports them in the outbox.pending.*
	// gauges. Each sample is a query on the whole messages table, so it is
	// opt-in whatever the MeterProvider. The default is false: no backlog
	// queries, and outbox.pending.available reports 0.
	MetricsBacklog bool

	// MetricsBucketZeroOnly makes only the owner of bucket 0 sample the
	// backlog; other relays report it unavailable. Enable it on every relay
	// sharing a store to query the backlog once instead of once per relay.
	// It needs MetricsBacklog (New fails without it). The default is false:
	// every relay with MetricsBacklog samples.
	MetricsBucketZeroOnly bool

	// Clock is the source of time for leases, polling and backoff. Nil means
	// SystemClock.
	Clock Clock

	// Logger receives the relay's logs. Nil means slog.Default().
	Logger *slog.Logger

	// MeterProvider provides the relay's instruments. Nil means the
	// OpenTelemetry global, otel.GetMeterProvider(), which records nothing
	// until the application installs an SDK (otel.SetMeterProvider). The
	// provider never turns on backlog queries: see MetricsBacklog.
	MeterProvider metric.MeterProvider

	// Notifier wakes the relay after commits; pass the one given to
	// outbox.Plugin (see NewNotifier). A Notifier serves one relay: New fails
	// if it is already attached to another. Nil means a new Notifier, which
	// Relay.Notifier returns. When Notifier is nil, HintTransport is nil and
	// Relay.Notifier was not called before Run, no commit can wake the
	// relay: it finds them by polling every PollInterval, and Run says so
	// once at INFO.
	Notifier *Notifier

	// HintTransport, when non-nil, carries bucket hints to and from the relays
	// of other processes (see HintTransport and package pgnotify): commits
	// notified here are sent to peers by one background sender, and hints
	// received by one listener wake this relay for the buckets it owns. Nil
	// means local notifications only; polling stays on either way.
	HintTransport HintTransport

	// StopTimeout is the budget of a whole stop, counted on Clock from the
	// moment Run's ctx is done (or a fatal error ends its loop). Three steps
	// share it: waiting for the in-flight publish, marking its acknowledged
	// prefix, and releasing the leases. The publish and the marking are
	// cancelled once three quarters of the budget are spent, so that the
	// release keeps at least the last quarter; the release is cancelled at
	// the end of the budget. Run thus returns within StopTimeout of the
	// stop, plus the time the publisher, the store and HintTransport take to
	// return once their context is cancelled. A cancelled marking leaves
	// its rows to be published again by the next owner; a cancelled release
	// leaves peers waiting up to LeaseDuration. Closing the publisher after
	// Run is not part of the budget.
	//
	// Give the process a shutdown grace period longer than StopTimeout plus
	// the rest of its shutdown: the default, a third of Kubernetes' default
	// terminationGracePeriodSeconds (30s), leaves the other two thirds to
	// the rest. Zero means DefaultStopTimeout (10s); a negative value fails
	// New.
	StopTimeout time.Duration

	// PublishFailureWindow is how long the publisher may fail every call
	// before Health reports the relay unhealthy: once the first failure of
	// an unbroken run of failed Publish calls (no row acknowledged since)
	// is older than the window, Health returns an error with the latest
	// publish error, so that a relay whose every publish fails (revoked
	// credentials, a lost network route) does not hold its buckets healthy
	// forever. The rows are kept and retried as usual. The next
	// acknowledged publish, or the relay no longer retrying any failed
	// publish (the failing buckets drained or were taken over), makes it
	// healthy again. Publish calls cancelled by a stop do not count. Zero
	// means DefaultPublishFailureWindow (5m); a negative value fails New.
	PublishFailureWindow time.Duration

	// ParkPolicy says which publish failures park a row (see Store.Park;
	// a store that cannot park retries every failing row forever, whatever
	// the policy). A failing row is first
	// retried alone with the usual backoff (head-row isolation); each such
	// single-row publish that fails with an error the policy counts is one
	// strike, any other outcome resets the count, and at ParkAfter strikes
	// the row is parked: it stays in the store, marked, and every later row
	// of its key in the bucket is parked behind it (held), so that the rest
	// of the bucket flows on at full speed and the key's order is kept. The
	// key's rows flow again, in id order, once an operator requeues them
	// (ParkAdmin.RequeueParked). A row is parked only while every live relay
	// supports parking (Store.FleetCanPark): until then it is retried, and
	// the relay logs so once per row at WARN. Parking a row logs one WARN
	// line and counts in outbox.parked; it does not make the relay
	// unhealthy. A row the store cannot decode (a *CorruptRowError from
	// NextBatch) is parked alone, at once, under every policy. The zero
	// value is ParkUnpublishable: only errors wrapping ErrUnpublishable
	// (which kafkapub.Publisher returns for a record the broker can never
	// accept) count, so a broker outage parks nothing. ParkNever counts no
	// error (the reference behaviour: a row the broker never accepts stops
	// its bucket); ParkAnyFailure counts every failure but a stop's
	// cancellation. Another value fails New.
	ParkPolicy ParkPolicy

	// ParkAfter is the number of consecutive failed single-row publishes of
	// a row, counted by ParkPolicy, after which the relay parks it. With the
	// defaults (ErrorBackoff 1s doubling per attempt, jittered to [d/2, d],
	// and ParkAfter 3) a row whose batch failed is parked 3.5 to 7 s after
	// that failure, and the rows behind it in its bucket wait that long. Zero
	// means DefaultParkAfter (3); a negative value fails New.
	ParkAfter int
}

// withDefaults validates o against the store's capabilities and returns it
// with every default filled in. It is the only place that checks options.
func (o Options) withDefaults(store Store) (Options, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("relay: "+format, args...))
	}
	durations := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"PollInterval", &o.PollInterval, DefaultPollInterval},
		{"ErrorBackoff", &o.ErrorBackoff, DefaultErrorBackoff},
		{"LeaseDuration", &o.LeaseDuration, DefaultLeaseDuration},
		{"LeaseRenewInterval", &o.LeaseRenewInterval, DefaultLeaseRenewInterval},
		{"MaxPublishDuration", &o.MaxPublishDuration, 0},
		{"MetricsInterval", &o.MetricsInterval, DefaultMetricsInterval},
		{"MetricsTimeout", &o.MetricsTimeout, DefaultMetricsTimeout},
		{"StopTimeout", &o.StopTimeout, DefaultStopTimeout},
		{"PublishFailureWindow", &o.PublishFailureWindow, DefaultPublishFailureWindow},
	}
	for _, d := range durations {
		switch {
		case *d.v < 0:
			bad("Options.%s %v is negative", d.name, *d.v)
		case *d.v == 0:
			*d.v = d.def
		}
	}
	switch {
	case o.ParkAfter < 0:
		bad("Options.ParkAfter %d is negative", o.ParkAfter)
	case o.ParkAfter == 0:
		o.ParkAfter = DefaultParkAfter
	}
	switch o.ParkPolicy {
	case ParkUnpublishable, ParkNever, ParkAnyFailure:
	default:
		bad("Options.ParkPolicy %v is not one of ParkUnpublishable, ParkNever, ParkAnyFailure", o.ParkPolicy)
	}
	switch {
	case o.MaxBatchBytes < 0:
		bad("Options.MaxBatchBytes %d is negative", o.MaxBatchBytes)
	case o.MaxBatchBytes == 0:
		o.MaxBatchBytes = DefaultMaxBatchBytes
	}
	switch {
	case o.MaxConcurrentBuckets < 0:
		bad("Options.MaxConcurrentBuckets %d is negative", o.MaxConcurrentBuckets)
	case o.MaxConcurrentBuckets == 0:
		o.MaxConcurrentBuckets = DefaultMaxConcurrentBuckets
	}
	if o.BatchSize < 0 {
		bad("Options.BatchSize %d is negative", o.BatchSize)
	} else if o.BatchSize == 0 {
		o.BatchSize = DefaultBatchSize
	}
	storeCount := store.BucketCount()
	switch {
	case o.BucketCount < 0:
		bad("Options.BucketCount %d is negative", o.BucketCount)
	case o.BucketCount == 0 && storeCount > 0:
		o.BucketCount = storeCount
	case o.BucketCount == 0:
		o.BucketCount = DefaultBucketCount
	case storeCount > 0 && o.BucketCount != storeCount:
		errs = append(errs, fmt.Errorf("relay: Options.BucketCount %d disagrees with the store's bucket count %d: %w", o.BucketCount, storeCount, ErrMisconfigured))
	}
	if o.LeaseRenewInterval >= o.LeaseDuration && o.LeaseRenewInterval > 0 && o.LeaseDuration > 0 {
		bad("Options.LeaseRenewInterval %v must be shorter than Options.LeaseDuration %v", o.LeaseRenewInterval, o.LeaseDuration)
	}
	if o.MaxPublishDuration > 0 && o.MaxPublishDuration+o.LeaseRenewInterval >= o.LeaseDuration {
		bad("Options.MaxPublishDuration %v plus Options.LeaseRenewInterval %v must be shorter than Options.LeaseDuration %v", o.MaxPublishDuration, o.LeaseRenewInterval, o.LeaseDuration)
	}
	if o.RelayID == "" {
		o.RelayID = defaultRelayID()
	} else if len(o.RelayID) > MaxRelayIDLength {
		bad("Options.RelayID is %d bytes long; the limit is %d", len(o.RelayID), MaxRelayIDLength)
	}
	if o.MetricsName == "" {
		o.MetricsName = DefaultMetricsName
	} else if strings.TrimSpace(o.MetricsName) == "" || len([]rune(o.MetricsName)) > maxMetricsNameLength {
		bad("Options.MetricsName %q must be 1 to %d non-blank characters", o.MetricsName, maxMetricsNameLength)
	}
	if o.MetricsBucketZeroOnly && !o.MetricsBacklog {
		bad("Options.MetricsBucketZeroOnly needs Options.MetricsBacklog: without it no relay samples the backlog")
	}
	if o.Clock == nil {
		o.Clock = SystemClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
	return o, errors.Join(errs...)
}

// defaultRelayID returns the host name plus a random suffix.
func defaultRelayID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "relay"
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	suffix := "-" + hex.EncodeToString(b[:])
	if len(host)+len(suffix) > MaxRelayIDLength {
		host = host[:MaxRelayIDLength-len(suffix)]
	}
	return host + suffix
}
