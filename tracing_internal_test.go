package outbox

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TestTraceInjectionAllocatesNothingWhenNothingIsInjected: the per-statement
// and per-message steps of the injection allocate nothing when the context
// has no span, or when the propagator injects nothing (an empty composite;
// a nil one means the global, which injects nothing until set).
func TestTraceInjectionAllocatesNothingWhenNothingIsInjected(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled})
	traced := trace.ContextWithSpanContext(context.Background(), sc)
	m := &Message{Topic: "t", Headers: Headers{{Key: "n", Value: []byte("1")}}}
	for _, c := range []struct {
		name string
		ctx  context.Context
		prop propagation.TextMapPropagator
	}{
		{"no_span", context.Background(), propagation.TraceContext{}},
		{"span_empty_propagator", traced, propagation.NewCompositeTextMapPropagator()},
	} {
		t.Run(c.name, func(t *testing.T) {
			allocs := testing.AllocsPerRun(100, func() {
				newTraceInjector(c.ctx, c.prop).inject(c.ctx, m)
			})
			if allocs != 0 {
				t.Errorf("inject = %v allocations; want 0", allocs)
			}
			if len(m.Headers) != 1 {
				t.Errorf("inject: %d headers; want the caller's 1", len(m.Headers))
			}
		})
	}
}

// BenchmarkTraceInjection is the injection alone, per message.
func BenchmarkTraceInjection(b *testing.B) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled})
	traced := trace.ContextWithSpanContext(context.Background(), sc)
	for _, c := range []struct {
		name string
		ctx  context.Context
		prop propagation.TextMapPropagator
	}{
		{"no_span", context.Background(), propagation.TraceContext{}},
		{"span_empty_propagator", traced, propagation.NewCompositeTextMapPropagator()},
		{"span_tracecontext", traced, propagation.TraceContext{}},
	} {
		b.Run(c.name, func(b *testing.B) {
			m := &Message{Topic: "t", Headers: Headers{{Key: "n", Value: []byte("1")}}}
			b.ReportAllocs()
			for b.Loop() {
				newTraceInjector(c.ctx, c.prop).inject(c.ctx, m)
			}
		})
	}
}
