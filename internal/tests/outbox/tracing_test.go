package outbox_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// withSpan returns a context carrying the span context of trace id tid and
// span id sid (hex), sampled, with the tracestate ts (may be empty).
func withSpan(t testing.TB, tid, sid, ts string) context.Context {
	t.Helper()
	traceID, err := trace.TraceIDFromHex(tid)
	if err != nil {
		t.Fatal(err)
	}
	spanID, err := trace.SpanIDFromHex(sid)
	if err != nil {
		t.Fatal(err)
	}
	state, err := trace.ParseTraceState(ts)
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled, TraceState: state})
	return trace.ContextWithSpanContext(context.Background(), sc)
}

const (
	traceA  = "4bf92f3577b34da6a3ce929d0e0e4736"
	spanA   = "00f067aa0ba902b7"
	parentA = "00-" + traceA + "-" + spanA + "-01"
	traceB  = "0af7651916cd43dd8448eb211c80319c"
	spanB   = "b7ad6b7169203331"
	parentB = "00-" + traceB + "-" + spanB + "-01"
)

// openTraced opens a SQLite database with the plugin (propagator prop) and
// its tables.
func openTraced(t *testing.T, prop propagation.TextMapPropagator) *gorm.DB {
	t.Helper()
	db := testenv.Databases(t)[0].Open(t, nil)
	if err := db.Use(outbox.Plugin{Propagator: prop}); err != nil {
		t.Fatalf("db.Use(Plugin): %v", err)
	}
	if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
		t.Fatalf("AutoMigrate: %v", err)
	}
	return db
}

// headerList renders headers as key=value strings, for comparisons.
func headerList(hs outbox.Headers) []string {
	var out []string
	for _, h := range hs {
		out = append(out, h.Key+"="+string(h.Value))
	}
	return out
}

// storedHeaders reads back the headers of the row of message id.
func storedHeaders(t *testing.T, db *gorm.DB, id outbox.UUID) []string {
	t.Helper()
	var m outbox.Message
	if err := db.Where("message_id = ?", id).First(&m).Error; err != nil {
		t.Fatalf("read back message %s: %v", id, err)
	}
	return headerList(m.Headers)
}

// TestCreateInjectsTraceContext: a create whose context carries a span
// stamps the message with the propagator's headers, after the caller's,
// never replacing one the caller set; without a span nothing is added.
func TestCreateInjectsTraceContext(t *testing.T) {
	tcBaggage := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	member, err := baggage.NewMember("tenant", "acme")
	if err != nil {
		t.Fatal(err)
	}
	bag, err := baggage.New(member)
	if err != nil {
		t.Fatal(err)
	}
	spanWithState := withSpan(t, traceA, spanA, "vendor=x")
	for _, c := range []struct {
		name    string
		prop    propagation.TextMapPropagator
		ctx     context.Context
		headers outbox.Headers
		want    []string
	}{
		{"traceparent_after_the_callers_headers", propagation.TraceContext{}, withSpan(t, traceA, spanA, ""),
			outbox.Headers{{Key: "n", Value: []byte("1")}}, []string{"n=1", "traceparent=" + parentA}},
		{"tracestate_and_baggage", tcBaggage, baggage.ContextWithBaggage(spanWithState, bag),
			nil, []string{"tracestate=vendor=x", "traceparent=" + parentA, "baggage=tenant=acme"}},
		{"keeps_a_callers_traceparent_whole", tcBaggage, baggage.ContextWithBaggage(spanWithState, bag),
			outbox.Headers{{Key: "traceparent", Value: []byte(parentB)}}, []string{"traceparent=" + parentB, "baggage=tenant=acme"}},
		{"keeps_a_callers_header_of_another_case", propagation.TraceContext{}, withSpan(t, traceA, spanA, ""),
			outbox.Headers{{Key: "TraceParent", Value: []byte(parentB)}}, []string{"TraceParent=" + parentB}},
		{"no_span_adds_nothing", tcBaggage, baggage.ContextWithBaggage(context.Background(), bag),
			outbox.Headers{{Key: "n", Value: []byte("1")}}, []string{"n=1"}},
		{"no_span_no_headers", propagation.TraceContext{}, context.Background(), nil, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			db := openTraced(t, c.prop)
			m := outbox.NewStringMessage("orders", "k", "v", c.headers...)
			if err := db.WithContext(c.ctx).Create(m).Error; err != nil {
				t.Fatalf("Create: %v", err)
			}
			if got := headerList(m.Headers); !slices.Equal(got, c.want) {
				t.Errorf("Create: message headers = %q; want %q", got, c.want)
			}
			if got := storedHeaders(t, db, m.MessageID); !slices.Equal(got, c.want) {
				t.Errorf("Create: stored headers = %q; want %q", got, c.want)
			}
		})
	}
}

// TestEnqueueInjectsTraceContextIntoEveryMessage: Enqueue of several
// messages in a traced transaction stamps each of them.
func TestEnqueueInjectsTraceContextIntoEveryMessage(t *testing.T) {
	db := openTraced(t, propagation.TraceContext{})
	msgs := []*outbox.Message{
		outbox.NewStringMessage("orders", "a", "1"),
		outbox.NewStringMessage("orders", "b", "2", outbox.Header{Key: "n", Value: []byte("2")}),
		outbox.NewMessage("orders", nil, []byte("3")),
	}
	err := db.WithContext(withSpan(t, traceA, spanA, "")).Transaction(func(tx *gorm.DB) error {
		return outbox.Enqueue(tx, msgs...)
	})
	if err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	for i, m := range msgs {
		want := append(headerList(m.Headers[:len(m.Headers)-1]), "traceparent="+parentA)
		if got := storedHeaders(t, db, m.MessageID); !slices.Equal(got, want) {
			t.Errorf("message %d: stored headers = %q; want %q", i, got, want)
		}
	}
}

// TestCreateAgainCarriesTheNewTraceContext: a struct created again (reused
// for another record) carries the context of the create that writes it,
// and none when that create has no span; the caller's headers stay.
func TestCreateAgainCarriesTheNewTraceContext(t *testing.T) {
	db := openTraced(t, propagation.TraceContext{})
	m := outbox.NewStringMessage("orders", "k", "v", outbox.Header{Key: "n", Value: []byte("1")})
	for i, step := range []struct {
		ctx  context.Context
		want []string
	}{
		{withSpan(t, traceA, spanA, ""), []string{"n=1", "traceparent=" + parentA}},
		{withSpan(t, traceB, spanB, ""), []string{"n=1", "traceparent=" + parentB}},
		{context.Background(), []string{"n=1"}},
		{withSpan(t, traceA, spanA, ""), []string{"n=1", "traceparent=" + parentA}},
	} {
		if err := db.WithContext(step.ctx).Create(m).Error; err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		if got := storedHeaders(t, db, m.MessageID); !slices.Equal(got, step.want) {
			t.Errorf("create %d: stored headers = %q; want %q", i, got, step.want)
		}
	}
}

// TestCreateTraceContextLeavesSharedHeaderArrays: messages sharing one
// header slice with spare capacity each get their own trace context, and
// the shared array is never written.
func TestCreateTraceContextLeavesSharedHeaderArrays(t *testing.T) {
	db := openTraced(t, propagation.TraceContext{})
	shared := make(outbox.Headers, 1, 4)
	shared[0] = outbox.Header{Key: "n", Value: []byte("1")}
	m1 := outbox.NewStringMessage("orders", "k", "1", shared...)
	m2 := outbox.NewStringMessage("orders", "k", "2", shared...)
	if err := db.WithContext(withSpan(t, traceA, spanA, "")).Create(m1).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.WithContext(withSpan(t, traceB, spanB, "")).Create(m2).Error; err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		m    *outbox.Message
		want []string
	}{{m1, []string{"n=1", "traceparent=" + parentA}}, {m2, []string{"n=1", "traceparent=" + parentB}}} {
		if got := headerList(c.m.Headers); !slices.Equal(got, c.want) {
			t.Errorf("headers = %q; want %q", got, c.want)
		}
	}
	if spare := shared[1:cap(shared)]; slices.ContainsFunc(spare, func(h outbox.Header) bool { return h.Key != "" }) {
		t.Errorf("the shared array's spare capacity = %q; want untouched", headerList(spare))
	}
}

// TestNilPropagatorUsesTheGlobal: a Plugin without a Propagator (and a
// create without the Plugin) injects through otel.GetTextMapPropagator(),
// which injects nothing until the application sets one; an empty composite
// propagator turns injection off while a global one is set.
func TestNilPropagatorUsesTheGlobal(t *testing.T) {
	t.Cleanup(func() { otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator()) })
	ctx := withSpan(t, traceA, spanA, "")
	create := func(t *testing.T, db *gorm.DB) []string {
		t.Helper()
		m := outbox.NewStringMessage("orders", "k", "v")
		if err := db.WithContext(ctx).Create(m).Error; err != nil {
			t.Fatalf("Create: %v", err)
		}
		return storedHeaders(t, db, m.MessageID)
	}
	withPlugin := openTraced(t, nil)
	t.Run("global_default_injects_nothing", func(t *testing.T) {
		if got := create(t, withPlugin); got != nil {
			t.Errorf("stored headers = %q; want none", got)
		}
	})
	otel.SetTextMapPropagator(propagation.TraceContext{})
	want := []string{"traceparent=" + parentA}
	t.Run("global_set_injects", func(t *testing.T) {
		if got := create(t, withPlugin); !slices.Equal(got, want) {
			t.Errorf("stored headers = %q; want %q", got, want)
		}
	})
	t.Run("empty_composite_injects_nothing", func(t *testing.T) {
		if got := create(t, openTraced(t, propagation.NewCompositeTextMapPropagator())); got != nil {
			t.Errorf("stored headers = %q; want none", got)
		}
	})
	t.Run("without_the_plugin", func(t *testing.T) {
		db := testenv.Databases(t)[0].Open(t, nil)
		if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
			t.Fatal(err)
		}
		if got := create(t, db); !slices.Equal(got, want) {
			t.Errorf("stored headers = %q; want %q", got, want)
		}
	})
}

// BenchmarkCreateTraced is a one-row Create on SQLite without a span, with
// a span and a propagator that injects nothing, and with a span and
// propagation.TraceContext: what the injection adds to an enqueue.
func BenchmarkCreateTraced(b *testing.B) {
	for _, c := range []struct {
		name string
		prop propagation.TextMapPropagator
		ctx  context.Context
	}{
		{"no_span", propagation.TraceContext{}, context.Background()},
		{"span_empty_propagator", propagation.NewCompositeTextMapPropagator(), withSpan(b, traceA, spanA, "")},
		{"span_tracecontext", propagation.TraceContext{}, withSpan(b, traceA, spanA, "")},
	} {
		b.Run(c.name, func(b *testing.B) {
			db := testenv.Databases(b)[0].Open(b, nil)
			if err := db.Use(outbox.Plugin{Propagator: c.prop, SkipIDReadBack: true}); err != nil {
				b.Fatal(err)
			}
			if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
				b.Fatal(err)
			}
			tx := db.WithContext(c.ctx).Session(&gorm.Session{SkipDefaultTransaction: true})
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if err := tx.Create(outbox.NewStringMessage("orders", fmt.Sprint(i%64), "v")).Error; err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
