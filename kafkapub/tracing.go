package kafkapub

import (
	"context"
	"errors"
	"strconv"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/gorm-outbox/outbox"
)

// MaxPublishSpanLinks bounds the links of one publish span: the span links
// the first MaxPublishSpanLinks distinct span contexts found in its rows'
// headers, in submission order (the OpenTelemetry SDK's default
// SpanLimits.LinkCountLimit is the same 128). Rows enqueued in one traced
// transaction share one context.
const MaxPublishSpanLinks = 128

// tracerName is the instrumentation scope of the publish spans, the same
// as the relay's instruments' (relay's import path), so that a relay's
// spans and metrics share one scope.
const tracerName = "github.com/gorm-outbox/outbox/relay"

// publishTracer records the Publisher's spans (see
// Config.TracerProvider).
type publishTracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator // nil: the global, looked up on use
}

func newPublishTracer(tp trace.TracerProvider, prop propagation.TextMapPropagator) publishTracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return publishTracer{
		tracer: tp.Tracer(tracerName, trace.WithSchemaURL(semconv.SchemaURL)),
		prop:   prop,
	}
}

// The messaging operation of a publish span: Kafka's producer "send".
const sendOperation = "send"

// start starts the span of a Publish call of batch (not empty; every
// batch's rows, in order), a PRODUCER span named after the OpenTelemetry
// messaging conventions: "send <topic>" when the rows share a topic, else
// "send". The attributes samplers may
// use are given at start; the links, whose extraction costs an allocation
// or more per row, only to a recording span.
func (t publishTracer) start(ctx context.Context, batch []*outbox.Message) (context.Context, trace.Span) {
	topic := batch[0].Topic
	for _, m := range batch[1:] {
		if m.Topic != topic {
			topic = ""
			break
		}
	}
	name := sendOperation
	attrs := make([]attribute.KeyValue, 0, 6)
	attrs = append(attrs,
		semconv.MessagingSystemKafka,
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName(sendOperation),
	)
	if topic != "" {
		name = sendOperation + " " + topic
		attrs = append(attrs, semconv.MessagingDestinationName(topic))
	}
	if len(batch) == 1 {
		attrs = append(attrs, semconv.MessagingMessageID(batch[0].MessageID.String()))
	} else {
		attrs = append(attrs, semconv.MessagingBatchMessageCount(len(batch)))
	}
	ctx, span := t.tracer.Start(ctx, name,
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	if span.IsRecording() {
		t.link(span, batch)
	}
	return ctx, span
}

// link adds to span a link to each distinct span context the propagator
// extracts from the rows' headers, at most MaxPublishSpanLinks.
func (t publishTracer) link(span trace.Span, batch []*outbox.Message) {
	prop := t.prop
	if prop == nil {
		prop = otel.GetTextMapPropagator()
	}
	type spanKey struct {
		trace trace.TraceID
		span  trace.SpanID
	}
	var seen map[spanKey]struct{}
	for _, m := range batch {
		if len(m.Headers) == 0 {
			continue
		}
		sc := trace.SpanContextFromContext(prop.Extract(context.Background(), headerCarrier(m.Headers)))
		if !sc.IsValid() {
			continue
		}
		k := spanKey{sc.TraceID(), sc.SpanID()}
		if _, dup := seen[k]; dup {
			continue
		}
		if seen == nil {
			seen = make(map[spanKey]struct{})
		}
		seen[k] = struct{}{}
		span.AddLink(trace.Link{SpanContext: sc})
		if len(seen) == MaxPublishSpanLinks {
			return
		}
	}
}

// end ends the span of a Publish call of rows with the partition when
// every row went to one, and err, the error of the first unacknowledged
// row (of the first batch that has one).
func (t publishTracer) end(span trace.Span, rows []row, err error) {
	if span.IsRecording() {
		part := rows[0].partition
		for _, r := range rows[1:] {
			if r.partition != part || r.msg.Topic != rows[0].msg.Topic {
				part = -1
				break
			}
		}
		if part >= 0 {
			span.SetAttributes(semconv.MessagingDestinationPartitionID(strconv.Itoa(part)))
		}
		if err != nil {
			span.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
}

// errorType is the error.type attribute of a failed publish: "timeout"
// (Config.PublishTimeout, or the caller's deadline), else the Kafka
// error's title (a closed set, "Message Size Too Large"), else "_OTHER".
func errorType(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	var ke kafka.Error
	if errors.As(err, &ke) {
		return ke.Title()
	}
	return semconv.ErrorTypeOther.Value.AsString()
}

// headerCarrier reads a row's stored headers for a propagator's Extract:
// Get returns the first header of the name (compared exactly, as Kafka
// does).
type headerCarrier outbox.Headers

var _ propagation.TextMapCarrier = headerCarrier(nil)

func (c headerCarrier) Get(key string) string {
	for _, h := range c {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// Set does nothing: the publisher never changes a row's headers.
func (headerCarrier) Set(string, string) {}

func (c headerCarrier) Keys() []string {
	keys := make([]string, len(c))
	for i, h := range c {
		keys[i] = h.Key
	}
	return keys
}
