package kafkapub

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/spantest"
	"github.com/gorm-outbox/outbox/internal/testenv"
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

// recordingTracer returns a TracerProvider that records every span, and
// its recorder.
func recordingTracer(t *testing.T) (trace.TracerProvider, *spantest.Recorder) {
	t.Helper()
	rec := spantest.NewRecorder()
	return rec.TracerProvider(), rec
}

// traceparentOf returns the traceparent header value of span context
// (trace id tid, span id sid as numbers) and the span context itself.
func traceparentOf(tid byte, sid uint64) (string, trace.SpanContext) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{15: tid}, SpanID: trace.SpanID(binary.BigEndian.AppendUint64(nil, sid)), TraceFlags: trace.FlagsSampled, Remote: true})
	return fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID()), sc
}

// withTraceparent returns m with a traceparent header of the span context
// (tid, sid) after its other headers.
func withTraceparent(m *outbox.Message, tid byte, sid uint64) *outbox.Message {
	tp, _ := traceparentOf(tid, sid)
	m.Headers = append(m.Headers, outbox.Header{Key: "traceparent", Value: []byte(tp)})
	return m
}

// TestPublishSpan: one PRODUCER span per Publish call, named and
// attributed after the messaging conventions, linked to each distinct
// trace context of the rows (at most MaxPublishSpanLinks), with the error
// of a failed row.
func TestPublishSpan(t *testing.T) {
	b := testenv.NewFake(t)
	topic := newTopic(t, b, 4, nil)
	other := newTopic(t, b, 1, nil)
	// The partition of key "k" among 4.
	kPart := kafka.Murmur2Balancer{}.Balance(kafka.Message{Key: []byte("k")}, 0, 1, 2, 3)
	type want struct {
		name      string
		attrs     map[attribute.Key]string // "" = absent
		links     []trace.SpanContext
		status    codes.Code
		errorType string
	}
	base := func(attrs map[attribute.Key]string) map[attribute.Key]string {
		m := map[attribute.Key]string{"messaging.system": "kafka", "messaging.operation.type": "send", "messaging.operation.name": "send"}
		maps.Copy(m, attrs)
		return m
	}
	_, sc1 := traceparentOf(1, 1)
	_, sc2 := traceparentOf(2, 2)
	var many []*outbox.Message
	var manyLinks []trace.SpanContext
	for i := range MaxPublishSpanLinks + 10 {
		many = append(many, withTraceparent(msg(topic, "k", "v"), 3, uint64(i+1)))
		if i < MaxPublishSpanLinks {
			_, sc := traceparentOf(3, uint64(i+1))
			manyLinks = append(manyLinks, sc)
		}
	}
	for _, c := range []struct {
		name  string
		batch []*outbox.Message
		want  want
	}{
		{"one_partition_links_distinct_contexts", []*outbox.Message{
			withTraceparent(msg(topic, "k", "a"), 1, 1), withTraceparent(msg(topic, "k", "b"), 1, 1),
			msg(topic, "k", "untraced"), withTraceparent(msg(topic, "k", "c"), 2, 2),
		}, want{name: "send " + topic, attrs: base(map[attribute.Key]string{
			"messaging.destination.name": topic, "messaging.destination.partition.id": fmt.Sprint(kPart),
			"messaging.batch.message_count": "4", "messaging.message.id": "",
		}), links: []trace.SpanContext{sc1, sc2}}},
		{"one_row", []*outbox.Message{withTraceparent(msg(topic, "k", "a"), 1, 1)},
			want{name: "send " + topic, attrs: base(map[attribute.Key]string{
				"messaging.destination.name": topic, "messaging.destination.partition.id": fmt.Sprint(kPart),
				"messaging.batch.message_count": "",
			}), links: []trace.SpanContext{sc1}}},
		{"several_topics", []*outbox.Message{msg(topic, "k", "a"), msg(other, "k", "b")},
			want{name: "send", attrs: base(map[attribute.Key]string{
				"messaging.destination.name": "", "messaging.destination.partition.id": "", "messaging.batch.message_count": "2",
			})}},
		{"links_capped", many, want{name: "send " + topic, attrs: base(nil), links: manyLinks}},
		{"failed_row", []*outbox.Message{msg(topic, "k", "a"), msg(topic, "k", "b", 9)},
			want{name: "send " + topic, attrs: base(map[attribute.Key]string{"messaging.destination.partition.id": ""}),
				status: codes.Error, errorType: "Unknown Topic Or Partition"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tp, rec := recordingTracer(t)
			p := newPublisher(t, b, Config{TracerProvider: tp, Propagator: propagation.TraceContext{}})
			res := p.Publish(context.Background(), c.batch)
			if (res.Err != nil) != (c.want.status == codes.Error) {
				t.Fatalf("Publish = %+v; want failure %v", res, c.want.status == codes.Error)
			}
			spans := rec.Ended()
			if len(spans) != 1 {
				t.Fatalf("Publish recorded %d spans; want 1", len(spans))
			}
			s := spans[0]
			if s.Name != c.want.name || s.Kind != trace.SpanKindProducer {
				t.Errorf("span = %q (%v); want %q (producer)", s.Name, s.Kind, c.want.name)
			}
			got := map[attribute.Key]string{}
			for _, kv := range s.Attributes {
				got[kv.Key] = kv.Value.Emit()
			}
			for k, v := range c.want.attrs {
				if got[k] != v {
					t.Errorf("attribute %s = %q; want %q", k, got[k], v)
				}
			}
			if len(c.batch) == 1 && got["messaging.message.id"] != c.batch[0].MessageID.String() {
				t.Errorf("attribute messaging.message.id = %q; want %s", got["messaging.message.id"], c.batch[0].MessageID)
			}
			var links []trace.SpanContext
			for _, l := range s.Links {
				links = append(links, l.SpanContext)
			}
			if !slices.EqualFunc(links, c.want.links, trace.SpanContext.Equal) {
				t.Errorf("span links = %d %v; want %d %v", len(links), links, len(c.want.links), c.want.links)
			}
			if s.Status.Code != c.want.status || got["error.type"] != c.want.errorType {
				t.Errorf("span status = %v %q, error.type %q; want %v, %q", s.Status.Code, s.Status.Description, got["error.type"], c.want.status, c.want.errorType)
			}
			// A failure is also recorded as the span's exception event.
			var exceptions []string
			for _, e := range s.Events {
				if e.Name == "exception" {
					for _, kv := range e.Attributes {
						if kv.Key == "exception.message" {
							exceptions = append(exceptions, kv.Value.AsString())
						}
					}
				}
			}
			if wantEx := c.want.status == codes.Error; wantEx && (len(exceptions) != 1 || exceptions[0] != s.Status.Description) || !wantEx && len(exceptions) != 0 {
				t.Errorf("span exception events = %q; want %v one with the status description %q", exceptions, wantEx, s.Status.Description)
			}
		})
	}
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
