package spantest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/gorm-outbox/outbox/internal/spantest"
)

func TestRecorderKeepsWhatTheSpanAPIIsTold(t *testing.T) {
	r := spantest.NewRecorder()
	tr := r.TracerProvider().Tracer("scope")
	linked := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{15: 9}, SpanID: trace.SpanID{7: 9}, TraceFlags: trace.FlagsSampled, Remote: true})
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

	ctx, root := tr.Start(context.Background(), "root", trace.WithTimestamp(start))
	_, child := tr.Start(ctx, "first name", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("a", "1"), attribute.Int("b", 2)),
		trace.WithLinks(trace.Link{SpanContext: linked, Attributes: []attribute.KeyValue{attribute.String("l", "x")}}))
	if !child.IsRecording() || !child.SpanContext().IsSampled() || !child.SpanContext().IsValid() {
		t.Fatalf("started span: recording %v, context %+v; want a recording, sampled, valid span", child.IsRecording(), child.SpanContext())
	}
	if got := child.SpanContext().TraceID(); got != root.SpanContext().TraceID() {
		t.Errorf("child trace id %s; want the parent's %s", got, root.SpanContext().TraceID())
	}
	if child.SpanContext().SpanID() == root.SpanContext().SpanID() {
		t.Error("child and parent have the same span id")
	}
	child.SetName("send orders")
	child.SetAttributes(attribute.String("a", "updated"), attribute.Bool("c", true))
	child.AddLink(trace.Link{SpanContext: trace.SpanContext{}}) // invalid: dropped
	child.AddEvent("retry")
	child.RecordError(errors.New("broker unavailable"))
	child.SetStatus(codes.Error, "broker unavailable")
	child.SetStatus(codes.Unset, "ignored") // lower than Error
	if len(r.Ended()) != 0 {
		t.Fatalf("Ended before any End = %d spans; want none", len(r.Ended()))
	}
	child.End()
	child.SetAttributes(attribute.String("after", "end")) // ignored
	child.End()                                           // ignored
	if child.IsRecording() {
		t.Error("an ended span is recording")
	}
	root.SetStatus(codes.Ok, "dropped with Ok")
	root.SetStatus(codes.Error, "ignored after Ok")
	root.End(trace.WithTimestamp(start.Add(time.Second)))

	spans := r.Ended()
	if len(spans) != 2 {
		t.Fatalf("Ended = %d spans; want 2", len(spans))
	}
	c, p := spans[0], spans[1]
	if c.Scope != "scope" || c.Name != "send orders" || c.Kind != trace.SpanKindProducer {
		t.Errorf("child = %q %q %v; want scope, send orders, producer", c.Scope, c.Name, c.Kind)
	}
	if !c.Parent.Equal(p.SpanContext) || p.Parent.IsValid() {
		t.Errorf("child's parent %v, root's parent %v; want the root, none", c.Parent, p.Parent)
	}
	if p.Kind != trace.SpanKindInternal {
		t.Errorf("root kind %v; want internal (the default)", p.Kind)
	}
	want := []attribute.KeyValue{attribute.String("a", "updated"), attribute.Int("b", 2), attribute.Bool("c", true)}
	if got, ws := attribute.NewSet(c.Attributes...), attribute.NewSet(want...); !got.Equals(&ws) || len(c.Attributes) != len(want) {
		t.Errorf("attributes %v; want %v", c.Attributes, want)
	}
	if v, ok := c.Attr("a"); !ok || v.AsString() != "updated" {
		t.Errorf(`Attr("a") = %v, %v; want updated`, v, ok)
	}
	if _, ok := c.Attr("after"); ok {
		t.Error("an attribute set after End was recorded")
	}
	if len(c.Links) != 1 || !c.Links[0].SpanContext.Equal(linked) || len(c.Links[0].Attributes) != 1 || c.Links[0].Attributes[0] != attribute.String("l", "x") {
		t.Errorf("links %+v; want the one valid link with its attribute", c.Links)
	}
	if len(c.Events) != 2 || c.Events[0].Name != "retry" || c.Events[1].Name != "exception" {
		t.Fatalf("events %+v; want retry, exception", c.Events)
	}
	ex := attribute.NewSet(c.Events[1].Attributes...)
	if v, _ := ex.Value("exception.message"); v.AsString() != "broker unavailable" {
		t.Errorf("exception.message %q", v.AsString())
	}
	if v, _ := ex.Value("exception.type"); v.AsString() != "*errors.errorString" {
		t.Errorf("exception.type %q; want *errors.errorString", v.AsString())
	}
	if c.Status != (spantest.Status{Code: codes.Error, Description: "broker unavailable"}) {
		t.Errorf("child status %+v; want Error with its description", c.Status)
	}
	if p.Status != (spantest.Status{Code: codes.Ok}) {
		t.Errorf("root status %+v; want Ok without description, final", p.Status)
	}
	if !p.Start.Equal(start) || !p.End.Equal(start.Add(time.Second)) || c.Start.IsZero() || c.End.Before(c.Start) {
		t.Errorf("times: root %v–%v, child %v–%v", p.Start, p.End, c.Start, c.End)
	}
	r.Reset()
	if len(r.Ended()) != 0 {
		t.Error("Ended after Reset is not empty")
	}
}

// TestTraceContextCrossesAPropagator: a span started under a context
// extracted from a traceparent continues that trace, and what the
// recorder's spans inject is a sampled traceparent of their own ids.
func TestTraceContextCrossesAPropagator(t *testing.T) {
	r := spantest.NewRecorder()
	tr := r.TracerProvider().Tracer("scope")
	prop := propagation.TraceContext{}

	wctx, writer := tr.Start(context.Background(), "writer")
	headers := propagation.MapCarrier{}
	prop.Inject(wctx, headers)
	if want := "00-" + writer.SpanContext().TraceID().String() + "-" + writer.SpanContext().SpanID().String() + "-01"; headers["traceparent"] != want {
		t.Fatalf("injected traceparent %q; want %q", headers["traceparent"], want)
	}
	writer.End()

	_, consumer := tr.Start(prop.Extract(context.Background(), headers), "consume", trace.WithSpanKind(trace.SpanKindConsumer))
	consumer.End()
	_, root := tr.Start(wctx, "new root", trace.WithNewRoot())
	root.End()
	_, other := tr.Start(context.Background(), "other")
	other.End()

	spans := r.Ended()
	w, c, nr, o := spans[0], spans[1], spans[2], spans[3]
	if c.SpanContext.TraceID() != w.SpanContext.TraceID() || c.Parent.SpanID() != w.SpanContext.SpanID() || !c.Parent.IsRemote() {
		t.Errorf("consumer: trace %s, parent %v; want the writer's trace %s, the remote writer span %s as parent",
			c.SpanContext.TraceID(), c.Parent, w.SpanContext.TraceID(), w.SpanContext.SpanID())
	}
	for _, s := range []spantest.Span{nr, o} {
		if s.Parent.IsValid() || s.SpanContext.TraceID() == w.SpanContext.TraceID() {
			t.Errorf("%s: parent %v, trace %s; want a root span of a new trace", s.Name, s.Parent, s.SpanContext.TraceID())
		}
	}
	if trace.SpanFromContext(wctx).TracerProvider() == nil {
		t.Error("a span's TracerProvider is nil")
	}
}
