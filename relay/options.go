package relay

import (
	"cmp"
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
	DefaultMaxConcurrentBuckets = 4       // two or three relays on 8 buckets serve all at once
	DefaultMaxBatchBytes        = 4 << 20 // rarely cuts small rows; 1 MiB rows go a few at a time
)

// MaxRelayIDLength is the longest RelayID, the width of the owner column.
const MaxRelayIDLength = 128

const maxMetricsNameLength = 64

// Options configures a Relay. A zero Options consists entirely of default
// values; New rejects an invalid value with an error naming the field.
// docs/configuration.md explains each field and which matter in which
// setup; most can stay zero.
type Options struct {
	// BucketCount is the number of ordering buckets, the writers'. Zero
	// means the store's count, else DefaultBucketCount; a count disagreeing
	// with the store's fails New with an error wrapping ErrMisconfigured.
	BucketCount int
	BatchSize   int // rows per batch (default 500)
	// MaxBatchBytes bounds a batch, of at least one row (default 4 MiB).
	MaxBatchBytes int64
	// MaxConcurrentBuckets is how many batches (of up to 64 buckets) one
	// relay serves at once (default 4); left at the default, no more than
	// it would owning the same share of 8 buckets, ⌈8 × owned ÷ BucketCount⌉.
	MaxConcurrentBuckets int
	// SingleWriter says that the store's writes serialise (SQLite): the
	// relay serves one batch at a time and reads a group of waiting buckets
	// (up to 1,024) in one request, in id order across them.
	SingleWriter bool
	PollInterval time.Duration // how often the relay looks for rows without hints (default 1s)
	// ErrorBackoff is the wait after a failed acquisition or discovery, and
	// the first backoff of a failing bucket, doubling and jittered up to
	// LeaseRenewInterval (default 1s).
	ErrorBackoff  time.Duration
	LeaseDuration time.Duration // how long an acquired or renewed lease lasts (default 30s)
	// LeaseRenewInterval is the rebalance and renewal cadence; it must be
	// shorter than LeaseDuration (default 10s).
	LeaseRenewInterval time.Duration
	// MaxPublishDuration, when set, makes a longer Publish call fail Run
	// with an error wrapping ErrMisconfigured. MaxPublishDuration +
	// LeaseRenewInterval must be shorter than LeaseDuration.
	MaxPublishDuration time.Duration
	// RelayID is unique among live relays; empty: host name, random suffix.
	RelayID string
	// MetricsName is the outbox.name attribute of every instrument, the
	// same for relays sharing a store; 1 to 64 characters (default "outbox").
	MetricsName     string
	MetricsInterval time.Duration // the wait between backlog queries (default 30s)
	MetricsTimeout  time.Duration // bounds one backlog query (default 5s)
	// MetricsBacklog turns on the backlog sampler for the outbox.pending.*
	// gauges; off by default, as each sample reads the whole table.
	MetricsBacklog bool
	// MetricsBucketZeroOnly: only bucket 0's owner samples the backlog.
	MetricsBucketZeroOnly bool
	Clock                 Clock                // the source of time; nil: SystemClock
	Logger                *slog.Logger         // nil: slog.Default()
	MeterProvider         metric.MeterProvider // nil: otel.GetMeterProvider()
	// Notifier wakes the relay after commits; pass the one given to
	// outbox.Plugin. Nil means a new one, which Relay.Notifier returns.
	Notifier *Notifier
	// HintTransport carries hints between processes; nil: local ones only.
	HintTransport HintTransport
	// StopTimeout is the budget of a stop, from Run's ctx done to Run's
	// return; publishes and deletes are cancelled at 3/4 (default 10s).
	StopTimeout time.Duration
	// PublishFailureWindow: every Publish failing this long is unhealthy (default 5m).
	PublishFailureWindow time.Duration
	// ParkPolicy says which failures of a row retried alone are strikes
	// (any other outcome resets them): at ParkAfter the row is parked,
	// holding its key's later rows until requeued.
	ParkPolicy ParkPolicy
	ParkAfter  int // strikes that park a row (default 3)
}

func (o Options) withDefaults(store Store) (Options, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("relay: "+format, args...))
	}
	o.defaultNumbers(bad)
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
	o.Clock = cmp.Or(o.Clock, Clock(SystemClock{}))
	o.Logger = cmp.Or(o.Logger, slog.Default())
	o.MeterProvider = cmp.Or(o.MeterProvider, otel.GetMeterProvider())
	return o, errors.Join(errs...)
}

// defaultNumbers fills in the default durations and counts, reporting negative ones.
func (o *Options) defaultNumbers(bad func(format string, args ...any)) {
	orDefault(bad, "PollInterval", &o.PollInterval, DefaultPollInterval)
	orDefault(bad, "ErrorBackoff", &o.ErrorBackoff, DefaultErrorBackoff)
	orDefault(bad, "LeaseDuration", &o.LeaseDuration, DefaultLeaseDuration)
	orDefault(bad, "LeaseRenewInterval", &o.LeaseRenewInterval, DefaultLeaseRenewInterval)
	orDefault(bad, "MaxPublishDuration", &o.MaxPublishDuration, 0)
	orDefault(bad, "MetricsInterval", &o.MetricsInterval, DefaultMetricsInterval)
	orDefault(bad, "MetricsTimeout", &o.MetricsTimeout, DefaultMetricsTimeout)
	orDefault(bad, "StopTimeout", &o.StopTimeout, DefaultStopTimeout)
	orDefault(bad, "PublishFailureWindow", &o.PublishFailureWindow, DefaultPublishFailureWindow)
	orDefault(bad, "BatchSize", &o.BatchSize, DefaultBatchSize)
	orDefault(bad, "MaxConcurrentBuckets", &o.MaxConcurrentBuckets, DefaultMaxConcurrentBuckets)
	orDefault(bad, "ParkAfter", &o.ParkAfter, DefaultParkAfter)
	switch o.ParkPolicy {
	case ParkUnpublishable, ParkNever, ParkAnyFailure:
	default:
		bad("Options.ParkPolicy %v is not one of ParkUnpublishable, ParkNever, ParkAnyFailure", o.ParkPolicy)
	}
	orDefault(bad, "MaxBatchBytes", &o.MaxBatchBytes, DefaultMaxBatchBytes)
}

// orDefault sets *v to def when zero, and reports it to bad when negative.
func orDefault[T ~int | ~int64](bad func(format string, args ...any), name string, v *T, def T) {
	switch {
	case *v < 0:
		bad("Options.%s %v is negative", name, *v)
	case *v == 0:
		*v = def
	}
}

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
