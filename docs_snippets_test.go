package outbox_test

import (
	"context"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
)

// The code blocks of docs/writing.md, compiled here: each function's body
// is a block of the guide, verbatim (TestDocsGoBlocksAreCompiledCode checks
// it); the Setup block is Example_setup's.

func tracingProducer(ctx context.Context, db *gorm.DB, tp trace.TracerProvider, tracer trace.Tracer, msg *outbox.Message) error {
	otel.SetTracerProvider(tp) // your SDK's TracerProvider
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(
		propagation.TraceContext{}, propagation.Baggage{}))

	ctx, span := tracer.Start(ctx, "POST /orders")
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return tx.Create(msg).Error }) // msg gets traceparent
	span.End()
	return err
}

// carrier reads a Kafka record's headers for a propagator.
type carrier []kafka.Header

func (c carrier) Get(key string) string {
	for _, h := range c {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
func (c carrier) Set(string, string) {}
func (c carrier) Keys() []string {
	keys := make([]string, len(c))
	for i, h := range c {
		keys[i] = h.Key
	}
	return keys
}

func tracingConsumer(ctx context.Context, tracer trace.Tracer, m kafka.Message) {
	ctx = otel.GetTextMapPropagator().Extract(ctx, carrier(m.Headers)) // Get(key): the header's value
	ctx, span := tracer.Start(ctx, "process "+m.Topic, trace.WithSpanKind(trace.SpanKindConsumer))
	defer span.End()
}

// OrderPlaced is the guide's event.
type OrderPlaced struct{ ID string }

func enqueueing(db *gorm.DB, order Order) error {
	err := db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&order).Error; err != nil {
			return err
		}
		msg, err := outbox.NewJSONMessage("orders", order.ID, OrderPlaced{ID: order.ID})
		if err != nil {
			return err
		}
		return tx.Create(msg).Error
	})
	return err
}

var (
	_ = tracingProducer
	_ = tracingConsumer
	_ = enqueueing
)
