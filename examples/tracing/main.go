// Command tracing shows one OpenTelemetry trace from the business
// transaction to the consumer. The writer's span context (and its baggage)
// travels in the record headers: the outbox plugin injects it at enqueue
// (traceparent, baggage) through the global propagator; the relay's publish
// span, of kind PRODUCER, links to it; and a consumer built on kafka-go's
// Reader extracts it from the record and starts its CONSUMER span as a
// child of the writer's span, in the writer's trace.
//
// It needs nothing but Go: a SQLite file in a temporary directory, an
// in-process Kafka broker (kfake) on loopback, and the OpenTelemetry SDK
// keeping the spans in memory to print them (a service would export them,
// e.g. with OTLP).
//
//	go run ./examples/tracing
//
// As in the quickstart, one environment variable swaps in a real broker:
//
//	KAFKA_BROKERS  comma-separated bootstrap addresses of a real Kafka cluster
//	               (the example creates a fresh topic orders-<random>)
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/examples/internal/infra"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// Order is the business row written with its record.
type Order struct {
	ID     string `gorm:"primaryKey"`
	Amount int
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "tracing:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// OpenTelemetry, installed globally as a service would: the plugin, the
	// publisher and the consumer below all use the globals.
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background())
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))

	db, _, closeDB, err := infra.SQLite("app.db")
	if err != nil {
		return err
	}
	defer closeDB()
	// The topic "orders" on the in-process broker, a fresh one on a real
	// cluster.
	brokers, kafkaDesc, stopBroker, err := infra.Kafka(kfake.SeedTopics(1, "orders"))
	if err != nil {
		return err
	}
	defer stopBroker()
	topic := "orders"
	if os.Getenv("KAFKA_BROKERS") != "" {
		topic += "-" + infra.RandomHex(4)
		if err := infra.CreateTopic(ctx, brokers, topic, 1); err != nil {
			return err
		}
	}
	kafkaDesc += ", topic " + topic

	// The outbox: the plugin (Propagator nil: the global one) and a relay
	// whose publisher records its spans with the global TracerProvider.
	cfg := outbox.Config{}
	notifier := relay.NewNotifier()
	if err := db.Use(outbox.Plugin{Config: cfg, Notifier: notifier}); err != nil {
		return err
	}
	if err := outbox.AutoMigrate(db, cfg); err != nil {
		return err
	}
	if err := db.AutoMigrate(&Order{}); err != nil {
		return err
	}
	store, err := gormstore.New(db, gormstore.Options{Config: cfg})
	if err != nil {
		return err
	}
	pub, err := kafkapub.New(kafkapub.Config{Brokers: brokers})
	if err != nil {
		return err
	}
	defer pub.Close()
	r, err := relay.New(store, pub, relay.Options{Notifier: notifier, Logger: slog.New(slog.DiscardHandler), SingleWriter: true})
	if err != nil {
		return err
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	relayDone := make(chan error, 1)
	go func() { relayDone <- r.Run(relayCtx) }()

	// The writer: a request handler's span, with baggage, around the
	// transaction that writes the order and its record.
	bag, err := baggage.Parse("tenant=acme")
	if err != nil {
		return err
	}
	wctx, writer := otel.Tracer("example/orders").Start(baggage.ContextWithBaggage(ctx, bag), "POST /orders")
	err = db.WithContext(wctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&Order{ID: "order-1", Amount: 42}).Error; err != nil {
			return err
		}
		return tx.Create(outbox.NewStringMessage(topic, "order-1", "created")).Error
	})
	writer.End()
	if err != nil {
		return err
	}

	// The consumer.
	reader := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0, MaxWait: 50 * time.Millisecond})
	defer reader.Close()
	rec, err := reader.ReadMessage(ctx)
	if err != nil {
		return fmt.Errorf("read the record: %w", err)
	}
	tenant := consume(ctx, rec)

	stopRelay()
	if err := <-relayDone; err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	return report(rec, kafkaDesc, tenant, writer.SpanContext(), spans.GetSpans())
}

// consume handles one record in a CONSUMER span that continues the trace
// the record's headers carry, and returns the tenant of its baggage.
func consume(ctx context.Context, rec kafka.Message) (tenant string) {
	headers := propagation.MapCarrier{} // the propagator reads the record's headers
	for _, h := range rec.Headers {
		headers[h.Key] = string(h.Value)
	}
	ctx = otel.GetTextMapPropagator().Extract(ctx, headers)
	ctx, span := otel.Tracer("example/shipping").Start(ctx, "process "+rec.Topic,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			semconv.MessagingSystemKafka,
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingOperationName("process"),
			semconv.MessagingDestinationName(rec.Topic),
			semconv.MessagingDestinationPartitionID(strconv.Itoa(rec.Partition)),
			semconv.MessagingKafkaOffset(int(rec.Offset)),
			semconv.MessagingMessageID(headers.Get(kafkapub.DefaultMessageIDHeader)),
		))
	defer span.End()
	// The handler's work runs under ctx: its spans, database calls and
	// outgoing requests join the writer's trace.
	return baggage.FromContext(ctx).Member("tenant").Value()
}

// report prints the record's headers and the spans, and checks that the
// consumer continued the writer's trace and that a publish span links to
// the writer's span.
func report(rec kafka.Message, kafkaDesc, tenant string, writer trace.SpanContext, spans tracetest.SpanStubs) error {
	fmt.Println("gorm-outbox tracing")
	fmt.Println("  kafka:", kafkaDesc)
	fmt.Println("  record headers:")
	for _, h := range rec.Headers {
		fmt.Printf("    %-20s %s\n", h.Key, h.Value)
	}
	fmt.Println("  spans, by start time:")
	slices.SortFunc(spans, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	var continued, linked bool
	for _, s := range spans {
		var rel []string
		if s.Parent.IsValid() {
			rel = append(rel, "parent "+s.Parent.SpanID().String())
		}
		for _, l := range s.Links {
			rel = append(rel, "link "+l.SpanContext.SpanID().String())
			linked = linked || (s.SpanKind == trace.SpanKindProducer && l.SpanContext.Equal(writer.WithRemote(true)))
		}
		line := fmt.Sprintf("    %-8s %-16q trace %s span %s %s", s.SpanKind, s.Name, s.SpanContext.TraceID(), s.SpanContext.SpanID(), strings.Join(rel, ", "))
		fmt.Println(strings.TrimRight(line, " "))
		if s.SpanKind == trace.SpanKindConsumer {
			continued = s.SpanContext.TraceID() == writer.TraceID() && s.Parent.SpanID() == writer.SpanID()
		}
	}
	fmt.Printf("  consumer's baggage: tenant=%s\n", tenant)
	switch {
	case !continued:
		return errors.New("the consumer span does not continue the writer's trace")
	case !linked:
		return errors.New("no publish span links to the writer's span")
	case tenant != "acme":
		return fmt.Errorf("the consumer's baggage has tenant %q; want acme", tenant)
	}
	fmt.Println("OK: the consumer continued the writer's trace; the publish span links to the writer's span.")
	return nil
}
