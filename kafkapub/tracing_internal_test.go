package kafkapub

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/spantest"
	"github.com/gorm-outbox/outbox/kafkapub/internal/wire"
)

// tracedBatch returns n rows of one topic whose headers carry traceparent
// (one trace context per 10 rows, as from transactions of 10 rows).
func tracedBatch(n int) []*outbox.Message {
	batch := make([]*outbox.Message, n)
	for i := range batch {
		tp := fmt.Sprintf("00-4bf92f3577b34da6a3ce929d0e0e4736-%016x-01", i/10+1)
		batch[i] = &outbox.Message{MessageID: outbox.NewUUID(), Topic: "orders", Key: []byte("k"), Value: []byte("v"),
			Headers: outbox.Headers{{Key: "traceparent", Value: []byte(tp)}}}
	}
	return batch
}

// TestPublishSpanCostWithoutSDK: with the global TracerProvider (no SDK
// installed) or a no-op one, a publish span costs a fixed number of
// allocations per Publish call, whatever the batch size: no row's headers
// are read.
func TestPublishSpanCostWithoutSDK(t *testing.T) {
	for _, c := range []struct {
		name string
		pt   publishTracer
	}{
		{"global", newPublishTracer(nil, nil)},
		{"noop", newPublishTracer(noop.NewTracerProvider(), nil)},
	} {
		t.Run(c.name, func(t *testing.T) {
			var perBatch []float64
			for _, n := range []int{2, 500} {
				batch := tracedBatch(n)
				rows := make([]row, n)
				perBatch = append(perBatch, testing.AllocsPerRun(50, func() {
					_, span := c.pt.start(context.Background(), batch)
					c.pt.end(span, rows, nil)
				}))
			}
			if perBatch[0] != perBatch[1] || perBatch[1] > 10 {
				t.Errorf("allocations per Publish span = %v for 2 rows, %v for 500; want the same, at most 10", perBatch[0], perBatch[1])
			}
			t.Logf("%v allocations per Publish span", perBatch[1])
		})
	}
}

// BenchmarkPublishSpan is the span alone of a 500-row Publish call, rows
// of 50 transactions: not recording, and recorded (50 links) by a
// recording provider without exporter. The recording provider is
// internal/spantest's, not the SDK's, which the library module does not
// require (see scripts/importer-check.sh): both record every attribute and
// link in memory, so its figure stands for what a recording span costs the
// relay (the propagator's extraction of each row's traceparent and the 50
// links), not for the SDK's own overhead.
func BenchmarkPublishSpan(b *testing.B) {
	batch := tracedBatch(500)
	rows := make([]row, len(batch))
	rec := spantest.NewRecorder()
	for _, c := range []struct {
		name string
		pt   publishTracer
		rec  *spantest.Recorder
	}{
		{"global_no_sdk", newPublishTracer(nil, nil), nil},
		{"noop", newPublishTracer(noop.NewTracerProvider(), nil), nil},
		{"recording", newPublishTracer(rec.TracerProvider(), propagation.TraceContext{}), rec}, // 50 links
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, span := c.pt.start(context.Background(), batch)
				c.pt.end(span, rows, nil)
				if c.rec != nil {
					c.rec.Reset() // keep no ended span: an SDK without exporter keeps none either
				}
			}
		})
	}
}

// traceparentOf returns the traceparent header value of span context
// (trace id tid, span id sid as numbers) and the span context itself.
func traceparentOf(tid byte, sid uint64) (string, trace.SpanContext) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{15: tid}, SpanID: trace.SpanID(binary.BigEndian.AppendUint64(nil, sid)), TraceFlags: trace.FlagsSampled, Remote: true})
	return fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID()), sc
}

// TestTracingREADMEFigures pins the figures the README's Tracing section
// gives: the link cap, and what a traceparent header adds to a record's
// size as BatchBytes counts it.
func TestTracingREADMEFigures(t *testing.T) {
	if MaxPublishSpanLinks != 128 {
		t.Errorf("MaxPublishSpanLinks = %d; the README documents 128", MaxPublishSpanLinks)
	}
	tp, _ := traceparentOf(1, 1)
	plain := kafka.Message{Key: []byte("k"), Value: []byte("v"), Headers: []kafka.Header{{Key: DefaultMessageIDHeader, Value: []byte(outbox.NewUUID().String())}}}
	traced := plain
	traced.Headers = append([]kafka.Header{{Key: "traceparent", Value: []byte(tp)}}, plain.Headers...)
	if d := wire.RecordSize(&traced) - wire.RecordSize(&plain); d != 68 {
		t.Errorf("a traceparent header adds %d bytes to recordSize; the README documents 68", d)
	}
}
