package inbox

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// meterName is the instrumentation scope of the inbox's instruments.
const meterName = "github.com/gorm-outbox/outbox/inbox"

// Instrument names. MetricPurged carries the attribute AttrTable, the others
// AttrHandler.
const (
	// MetricProcessed counts the messages Handle returned Processed for.
	MetricProcessed = "inbox.processed"
	// MetricDuplicates counts the messages Handle returned Duplicate for.
	MetricDuplicates = "inbox.duplicates"
	// MetricFailures counts the Handle calls that failed, but not by a stop.
	MetricFailures = "inbox.failures"
	// MetricHandleDuration is a histogram of Handle calls, in seconds.
	MetricHandleDuration = "inbox.handle.duration"
	// MetricDeadLettered counts the messages a Consumer dead-lettered.
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
	var errs []error
	counter := func(name, unit, description string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(description))
		errs = append(errs, err)
		return c
	}
	in := &instruments{
		tableAttrs:   metric.WithAttributeSet(attribute.NewSet(attribute.String(AttrTable, table))),
		processed:    counter(MetricProcessed, "{message}", "Messages handled and recorded in one committed transaction."),
		duplicates:   counter(MetricDuplicates, "{message}", "Messages skipped as already processed by the handler."),
		failures:     counter(MetricFailures, "{attempt}", "Handle calls that returned an error, retries included."),
		deadLettered: counter(MetricDeadLettered, "{message}", "Messages written to the dead-letter topic after the last attempt."),
		purged:       counter(MetricPurged, "{message}", "Processed ids deleted after the retention window."),
	}
	seconds := []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
	var err error
	in.duration, err = m.Float64Histogram(MetricHandleDuration, metric.WithUnit("s"), metric.WithDescription("Duration of whole Handle calls."), metric.WithExplicitBucketBoundaries(seconds...))
	if err := errors.Join(append(errs, err)...); err != nil {
		return nil, err
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
