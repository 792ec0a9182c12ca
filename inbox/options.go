package inbox

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// Defaults of Options. A zero Options field takes the matching default.
const (
	// DefaultRetention keeps a processed id for 7 days, Kafka's default
	// topic retention (log.retention.hours = 168). The outbox's own
	// duplicates arrive within minutes of the original (a retried publish,
	// a lease takeover: LeaseDuration, 30 s by default) — except a parked
	// row requeued by an operator, which arrives when it is requeued — but
	// a consumer group that re-reads its topic (an offset reset, lost
	// group offsets) is redelivered everything the topic still holds. Set
	// Retention to at least the topics' retention.ms (plus segment.ms, as
	// Kafka deletes whole segments) if that must be deduplicated too.
	DefaultRetention = 7 * 24 * time.Hour
	// DefaultPurgeBatchSize bounds one purge statement to 1,000 rows: a
	// short transaction and short row locks however large the backlog.
	DefaultPurgeBatchSize = 1000
	// DefaultPurgeInterval is the wait between two purges of RunPurge.
	DefaultPurgeInterval = time.Hour
)

// Options configures an Inbox. A zero Options consists entirely of default
// values; New rejects invalid values with an error naming the field.
type Options struct {
	// Config names the processed-messages table. The zero Config means
	// DefaultTable in the connection's default schema.
	Config Config

	// MessageIDHeader is the record header holding the message id. Empty
	// means kafkapub.DefaultMessageIDHeader ("x-outbox-message-id"), the
	// header the relay stamps; set it to the relay's
	// kafkapub.Config.MessageIDHeader when that is changed. When a record has
	// the header more than once, the last one counts.
	MessageIDHeader string

	// IDFromOffset makes a record without the header (or with an empty one)
	// take an id derived from its position, "<topic>/<partition>/<offset>",
	// instead of failing with ErrNoMessageID. Such an id deduplicates
	// redeliveries of the same record (a consumer restart before the
	// offset commit, a rebalance), not a record a producer wrote twice,
	// which has two offsets. The default is false: a record without an id
	// is an error.
	IDFromOffset bool

	// Retention is how long a processed id is kept: Purge deletes the ids
	// recorded more than Retention ago, after which a redelivery of the
	// message is processed again. Zero means DefaultRetention (7 days, see
	// there); a negative value fails New.
	Retention time.Duration

	// PurgeBatchSize is the most rows one purge statement deletes; Purge
	// runs statements until no expired row is left. Zero means
	// DefaultPurgeBatchSize (1,000); a negative value fails New.
	PurgeBatchSize int

	// PurgeInterval is the wait between two purges of RunPurge. Zero means
	// DefaultPurgeInterval (1h); a negative value fails New.
	PurgeInterval time.Duration

	// Clock stamps processed ids (processed_at_ms) and times purges,
	// handle durations and a Consumer's backoff. Nil means
	// relay.SystemClock; tests pass relaytest.ManualClock.
	Clock relay.Clock

	// Logger receives the inbox's and its consumers' logs. Nil means
	// slog.Default().
	Logger *slog.Logger

	// MeterProvider provides the inbox's instruments (see MetricProcessed).
	// Nil means the OpenTelemetry global, otel.GetMeterProvider(), which
	// records nothing until the application installs an SDK
	// (otel.SetMeterProvider).
	MeterProvider metric.MeterProvider
}

// Validate reports every invalid field of o, each error naming its field.
func (o Options) Validate() error {
	_, err := o.withDefaults()
	return err
}

// withDefaults validates o and returns it with every default filled in. It
// is the only place that checks options.
func (o Options) withDefaults() (Options, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("inbox: "+format, args...))
	}
	if err := o.Config.Validate(); err != nil {
		errs = append(errs, err) // names Config's field

	}
	o.Config = o.Config.WithDefaults()
	if o.MessageIDHeader == "" {
		o.MessageIDHeader = kafkapub.DefaultMessageIDHeader
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"Retention", &o.Retention, DefaultRetention},
		{"PurgeInterval", &o.PurgeInterval, DefaultPurgeInterval},
	} {
		switch {
		case *d.v < 0:
			bad("Options.%s %v is negative", d.name, *d.v)
		case *d.v == 0:
			*d.v = d.def
		}
	}
	switch {
	case o.PurgeBatchSize < 0:
		bad("Options.PurgeBatchSize %d is negative", o.PurgeBatchSize)
	case o.PurgeBatchSize == 0:
		o.PurgeBatchSize = DefaultPurgeBatchSize
	}
	if o.Clock == nil {
		o.Clock = relay.SystemClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
	return o, errors.Join(errs...)
}
