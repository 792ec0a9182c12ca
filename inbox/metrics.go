package inbox

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// meterName is the instrumentation scope of the inbox's instruments.
const meterName = "github.com/gorm-outbox/outbox/inbox"

// Instrument names. The handle and consumer instruments carry the attribute
// inbox.handler (AttrHandler), the handler name; MetricPurged carries
// inbox.table (AttrTable). Counters are recorded once per message (once per
// purge statement for MetricPurged).
const (
	// MetricProcessed counts the messages whose handler ran and whose
	// transaction committed with the message id recorded (Handle returned
	// Processed).
	MetricProcessed = "inbox.processed"
	// MetricDuplicates counts the messages skipped because their id was
	// already recorded for the handler (Handle returned Duplicate).
	MetricDuplicates = "inbox.duplicates"
	// MetricFailures counts the Handle calls that returned an error: the
	// handler's, the database's, or a record without a usable message id.
	// A Consumer's retries count again; calls whose context was done are
	// excluded.
	MetricFailures = "inbox.failures"
	// MetricHandleDuration is a histogram of whole Handle calls (every
	// outcome, failures included), in seconds: the transaction, the id's
	// record and the handler.
	MetricHandleDuration = "inbox.handle.duration"
	// MetricDeadLettered counts the messages a Consumer wrote to its
	// dead-letter topic (ConsumerOptions.DeadLetter) after
	// ConsumerOptions.MaxAttempts failed attempts.
	MetricDeadLettered = "inbox.dead_lettered"
	// MetricPurged counts the processed ids Purge deleted.
	MetricPurged = "inbox.purged"
)

// Attributes of the inbox's instruments.
const (
	// AttrHandler is the handler name passed to Handle or NewConsumer.
	AttrHandler = "inbox.handler"
	// AttrTable is the processed-messages table (Config.TableName).
	AttrTable = "inbox.table"
)

// instruments are an inbox's OpenTelemetry instruments.
type instruments struct {
	processed    metric.Int64Counter
	duplicates   metric.Int64Counter
	failures     metric.Int64Counter
	duration     metric.Float64Histogram
	deadLettered metric.Int64Counter
	purged       metric.Int64Counter
	tableAttrs   metric.MeasurementOption

	handlers sync.Map // handler name → metric.MeasurementOption
}

func newInstruments(mp metric.MeterProvider, table string) (*instruments, error) {
	m := mp.Meter(meterName)
	in := &instruments{tableAttrs: metric.WithAttributeSet(attribute.NewSet(attribute.String(AttrTable, table)))}
	seconds := []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
	var err error
	for _, step := range []func() error{
		func() error {
			in.processed, err = m.Int64Counter(MetricProcessed, metric.WithUnit("{message}"), metric.WithDescription("Messages handled and recorded in one committed transaction."))
			return err
		},
		func() error {
			in.duplicates, err = m.Int64Counter(MetricDuplicates, metric.WithUnit("{message}"), metric.WithDescription("Messages skipped as already processed by the handler."))
			return err
		},
		func() error {
			in.failures, err = m.Int64Counter(MetricFailures, metric.WithUnit("{attempt}"), metric.WithDescription("Handle calls that returned an error, retries included."))
			return err
		},
		func() error {
			in.duration, err = m.Float64Histogram(MetricHandleDuration, metric.WithUnit("s"), metric.WithDescription("Duration of whole Handle calls."), metric.WithExplicitBucketBoundaries(seconds...))
			return err
		},
		func() error {
			in.deadLettered, err = m.Int64Counter(MetricDeadLettered, metric.WithUnit("{message}"), metric.WithDescription("Messages written to the dead-letter topic after the last attempt."))
			return err
		},
		func() error {
			in.purged, err = m.Int64Counter(MetricPurged, metric.WithUnit("{message}"), metric.WithDescription("Processed ids deleted after the retention window."))
			return err
		},
	} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	return in, nil
}

// attrs returns the measurement option of handler, built once per name.
func (in *instruments) attrs(handler string) metric.MeasurementOption {
	if a, ok := in.handlers.Load(handler); ok {
		return a.(metric.MeasurementOption)
	}
	a, _ := in.handlers.LoadOrStore(handler, metric.WithAttributeSet(attribute.NewSet(attribute.String(AttrHandler, handler))))
	return a.(metric.MeasurementOption)
}

// handled records one Handle call of handler that took d.
func (in *instruments) handled(ctx context.Context, handler string, out Outcome, err error, d time.Duration) {
	a := in.attrs(handler)
	stopped := ctx.Err() != nil
	ctx = context.WithoutCancel(ctx) // recorded even after a stop
	in.duration.Record(ctx, d.Seconds(), a)
	switch {
	case err != nil:
		if !stopped {
			in.failures.Add(ctx, 1, a)
		}
	case out == Processed:
		in.processed.Add(ctx, 1, a)
	case out == Duplicate:
		in.duplicates.Add(ctx, 1, a)
	}
}
