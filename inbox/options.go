package inbox

import (
	"cmp"
	"errors"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// Defaults of Options' zero fields.
const (
	// DefaultRetention keeps a processed id for 7 days, Kafka's default
	// topic retention: a group that re-reads its topic is redelivered all it
	// holds, so Retention should cover the topics' retention.ms plus segment.ms.
	DefaultRetention = 7 * 24 * time.Hour
	// DefaultPurgeBatchSize bounds one purge statement, keeping it short.
	DefaultPurgeBatchSize = 1000
	// DefaultPurgeInterval is the wait between two purges of RunPurge.
	DefaultPurgeInterval = time.Hour
)

// Options configures an Inbox; zero fields mean the defaults.
type Options struct {
	// Config names the processed-messages table.
	Config Config
	// MessageIDHeader is the record header holding the message id (the
	// last one counts). Empty means kafkapub.DefaultMessageIDHeader; set it
	// to the relay's kafkapub.Config.MessageIDHeader when that is changed.
	MessageIDHeader string
	// IDFromOffset gives a record without the header the id
	// "<topic>/<partition>/<offset>" instead of failing with ErrNoMessageID.
	IDFromOffset bool
	// Retention is how long a processed id is kept before Purge deletes it.
	// Zero means DefaultRetention; a negative value fails New.
	Retention time.Duration
	// PurgeBatchSize is the most rows one purge statement deletes. Zero
	// means DefaultPurgeBatchSize; a negative value fails New.
	PurgeBatchSize int
	// PurgeInterval is the wait between two purges of RunPurge. Zero means
	// DefaultPurgeInterval; a negative value fails New.
	PurgeInterval time.Duration
	// Clock stamps processed ids and times purges, handle durations and
	// backoffs. Nil means relay.SystemClock.
	Clock relay.Clock
	// Logger receives the inbox's and its consumers' logs; nil: slog.Default().
	Logger *slog.Logger
	// MeterProvider provides the inbox's instruments (see MetricProcessed).
	// Nil means otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

// Validate reports every invalid field of o, each error naming its field.
func (o Options) Validate() error {
	_, err := o.withDefaults()
	return err
}

// withDefaults validates o and returns it with every default filled in.
func (o Options) withDefaults() (Options, error) {
	var errs problems
	if err := o.Config.Validate(); err != nil {
		errs = append(errs, err)
	}
	o.Config = o.Config.WithDefaults()
	o.MessageIDHeader = cmp.Or(o.MessageIDHeader, kafkapub.DefaultMessageIDHeader)
	errs.durations("Options", []duration{
		{"Retention", &o.Retention, DefaultRetention},
		{"PurgeInterval", &o.PurgeInterval, DefaultPurgeInterval},
	})
	switch {
	case o.PurgeBatchSize < 0:
		errs.add("Options.PurgeBatchSize %d is negative", o.PurgeBatchSize)
	case o.PurgeBatchSize == 0:
		o.PurgeBatchSize = DefaultPurgeBatchSize
	}
	o.Clock = cmp.Or[relay.Clock](o.Clock, relay.SystemClock{})
	o.Logger = cmp.Or(o.Logger, slog.Default())
	o.MeterProvider = cmp.Or(o.MeterProvider, otel.GetMeterProvider())
	return o, errors.Join(errs...)
}
