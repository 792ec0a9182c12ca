package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/spantest"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// recordCarrier reads a consumed record's headers for a propagator.
type recordCarrier []kafka.Header

func (c recordCarrier) Get(key string) string {
	for _, h := range c {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func (recordCarrier) Set(string, string) {}

func (c recordCarrier) Keys() []string {
	keys := make([]string, len(c))
	for i, h := range c {
		keys[i] = h.Key
	}
	return keys
}

// TestTraceFromWriterToConsumer follows one trace through the outbox: the
// writer's span context reaches the record headers (traceparent, injected
// by the plugin through the global propagator), the relay's PRODUCER span
// links to it, and a consumer that extracts it from the record starts a
// CONSUMER span in the writer's trace, as the writer span's child.
func TestTraceFromWriterToConsumer(t *testing.T) {
	prop := propagation.TraceContext{}
	otel.SetTextMapPropagator(prop) // the plugin of e2eStore has no Propagator of its own
	t.Cleanup(func() { otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator()) })
	forEachDBAndBroker(t, func(t *testing.T, dbo testenv.Opener, b testenv.Broker) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		topic := testenv.Unique("trace-")
		b.CreateTopic(t, topic, 2, nil)
		rec := spantest.NewRecorder()
		tp := rec.TracerProvider()
		tracer := tp.Tracer("test")

		db := dbo.Open(t, nil)
		n := relay.NewNotifier()
		store := e2eStore(t, db, n)
		_, done := startKafkaRelay(ctx, t, db, store, n, kafkapub.Config{Brokers: b.Addrs, TracerProvider: tp, Propagator: prop})

		// Three traced transactions of two rows each, and one untraced.
		writerOf := map[string]trace.SpanContext{} // message id → the writer's span
		for i := range 4 {
			wctx, span := ctx, trace.SpanFromContext(ctx)
			if i < 3 {
				wctx, span = tracer.Start(ctx, "place order")
			}
			msgs := []*outbox.Message{
				outbox.NewStringMessage(topic, fmt.Sprint("order-", i), "created"),
				outbox.NewStringMessage(topic, fmt.Sprint("order-", i), "paid"),
			}
			if err := db.WithContext(wctx).Transaction(func(tx *gorm.DB) error { return outbox.Enqueue(tx, msgs...) }); err != nil {
				t.Fatalf("transaction %d: %v", i, err)
			}
			span.End()
			for _, m := range msgs {
				writerOf[m.MessageID.String()] = span.SpanContext()
			}
		}
		recs := b.ReadAll(t, topic, len(writerOf), time.Minute)
		waitOutboxEmpty(ctx, t, db)
		stopRelay(t, cancel, done) // every publish span has ended

		// The consumer: continue the trace of each record.
		consumerOf := map[trace.SpanID]trace.SpanContext{} // consumer span → its record's writer
		for _, rec := range recs {
			id := recordCarrier(rec.Headers).Get(kafkapub.DefaultMessageIDHeader)
			writer, ok := writerOf[id]
			if !ok {
				t.Fatalf("record %q matches no enqueued message", id)
			}
			parent := recordCarrier(rec.Headers).Get("traceparent")
			if want := fmt.Sprintf("00-%s-%s-01", writer.TraceID(), writer.SpanID()); writer.IsValid() && parent != want {
				t.Errorf("record %s: traceparent = %q; want the writer's %q", id, parent, want)
			} else if !writer.IsValid() && parent != "" {
				t.Errorf("record %s of the untraced transaction: traceparent = %q; want none", id, parent)
			}
			cctx := prop.Extract(context.Background(), recordCarrier(rec.Headers))
			_, span := tracer.Start(cctx, "process "+topic, trace.WithSpanKind(trace.SpanKindConsumer))
			span.End()
			consumerOf[span.SpanContext().SpanID()] = writer
		}
		if len(consumerOf) != len(writerOf) {
			t.Fatalf("consumed %d records; want %d", len(consumerOf), len(writerOf))
		}

		linked := map[trace.SpanID]bool{}
		var producers, consumers int
		for _, s := range rec.Ended() {
			switch s.Kind {
			case trace.SpanKindProducer:
				producers++
				if s.Name != "send "+topic {
					t.Errorf("producer span named %q; want %q", s.Name, "send "+topic)
				}
				for _, l := range s.Links {
					linked[l.SpanContext.SpanID()] = true
				}
			case trace.SpanKindConsumer:
				consumers++
				writer := consumerOf[s.SpanContext.SpanID()]
				if !writer.IsValid() {
					if s.Parent.IsValid() {
						t.Errorf("consumer span of an untraced record has parent %s; want none", s.Parent.SpanID())
					}
					continue
				}
				if s.SpanContext.TraceID() != writer.TraceID() || s.Parent.SpanID() != writer.SpanID() {
					t.Errorf("consumer span: trace %s, parent %s; want the writer's trace %s, parent %s",
						s.SpanContext.TraceID(), s.Parent.SpanID(), writer.TraceID(), writer.SpanID())
				}
			}
		}
		if producers == 0 || consumers != len(recs) {
			t.Fatalf("recorded %d producer and %d consumer spans; want at least 1 and %d", producers, consumers, len(recs))
		}
		for id, writer := range writerOf {
			if writer.IsValid() && !linked[writer.SpanID()] {
				t.Errorf("no publish span links the writer span %s of message %s", writer.SpanID(), id)
			}
		}
	})
}
