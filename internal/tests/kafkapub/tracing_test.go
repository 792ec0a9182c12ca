package kafkapub_test

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

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/spantest"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
)

// The publish span as an exporter sees it, on the in-process broker (the
// span's unit tests are kafkapub's tracing_internal_test.go, whose
// helpers recordingTracer, traceparentOf and withTraceparent are copied
// here).

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
	for i := range kafkapub.MaxPublishSpanLinks + 10 {
		many = append(many, withTraceparent(msg(topic, "k", "v"), 3, uint64(i+1)))
		if i < kafkapub.MaxPublishSpanLinks {
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
			p := newPublisher(t, b, kafkapub.Config{TracerProvider: tp, Propagator: propagation.TraceContext{}})
			res := p.Publish(context.Background(), [][]*outbox.Message{c.batch})[0]
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
