// Package spantest is an in-memory recording OpenTelemetry TracerProvider
// for the library's tests: every span its tracers start records what the
// span API is told, and ended spans are handed out by Recorder.Ended, as the
// SDK's tracetest.SpanRecorder does.
//
// It keeps the OpenTelemetry SDK out of the library's module graph (see
// scripts/importer-check.sh). Each span is sampled and recording until it
// ends, with a random span id and its parent's trace id (a random one for a
// root). Recorded as the SDK records them, without its limits: the name,
// kind, attributes, links, status, events (RecordError's "exception"
// included), the parent span context and the start and end times.
package spantest

import (
	"cmp"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// Span is what one span recorded.
type Span struct {
	Scope       string // the Tracer's name
	Name        string
	Kind        trace.SpanKind
	SpanContext trace.SpanContext
	// Parent is the span context the span was started under (invalid for a
	// root span).
	Parent     trace.SpanContext
	Attributes []attribute.KeyValue
	Links      []trace.Link
	Status     Status
	Events     []Event
	Start, End time.Time // End is zero while the span has not ended
}

// Attr returns the value of the span's attribute key and whether it is set.
func (s Span) Attr(key attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// Status is a span's status.
type Status struct {
	Code        codes.Code
	Description string // set only with codes.Error
}

// Event is an event added to a span (AddEvent, RecordError).
type Event struct {
	Name       string
	Attributes []attribute.KeyValue
	Time       time.Time
}

// Recorder records the spans of its TracerProvider.
type Recorder struct {
	mu    sync.Mutex
	ended []Span
}

// NewRecorder returns a Recorder that has recorded nothing.
func NewRecorder() *Recorder { return &Recorder{} }

// TracerProvider returns the provider whose spans r records.
func (r *Recorder) TracerProvider() trace.TracerProvider { return provider{r: r} }

// Ended returns the spans ended so far, in the order they ended.
func (r *Recorder) Ended() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ended)
}

// Reset forgets the spans ended so far.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended = nil
}

type provider struct {
	embedded.TracerProvider
	r *Recorder
}

func (p provider) Tracer(name string, _ ...trace.TracerOption) trace.Tracer {
	return tracer{r: p.r, scope: name}
}

type tracer struct {
	embedded.Tracer
	r     *Recorder
	scope string
}

// Start starts a recording span; the returned context holds it.
func (t tracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	cfg := trace.NewSpanStartConfig(opts...)
	var parent trace.SpanContext
	if !cfg.NewRoot() {
		parent = trace.SpanContextFromContext(ctx)
	}
	sc := trace.SpanContextConfig{SpanID: newSpanID(), TraceFlags: trace.FlagsSampled}
	if parent.IsValid() {
		sc.TraceID, sc.TraceState = parent.TraceID(), parent.TraceState()
	} else {
		parent = trace.SpanContext{}
		sc.TraceID = newTraceID()
	}
	s := &span{r: t.r, data: Span{
		Scope:       t.scope,
		Name:        name,
		Kind:        trace.ValidateSpanKind(cfg.SpanKind()),
		SpanContext: trace.NewSpanContext(sc),
		Parent:      parent,
		Start:       cmp.Or(cfg.Timestamp(), time.Now()),
	}}
	s.SetAttributes(cfg.Attributes()...)
	for _, l := range cfg.Links() {
		s.AddLink(l)
	}
	return trace.ContextWithSpan(ctx, s), s
}

func newTraceID() (id trace.TraceID) {
	for !id.IsValid() {
		binary.BigEndian.PutUint64(id[:8], rand.Uint64())
		binary.BigEndian.PutUint64(id[8:], rand.Uint64())
	}
	return id
}

func newSpanID() (id trace.SpanID) {
	for !id.IsValid() {
		binary.BigEndian.PutUint64(id[:], rand.Uint64())
	}
	return id
}

// span is a live span; its methods do nothing once it has ended, so the
// copy End records never changes.
type span struct {
	embedded.Span
	r    *Recorder
	mu   sync.Mutex
	data Span
}

func (s *span) recording() bool { return s.data.End.IsZero() }

func (s *span) SpanContext() trace.SpanContext { return s.data.SpanContext } // immutable

func (s *span) IsRecording() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.recording()
}

func (s *span) End(opts ...trace.SpanEndOption) {
	cfg := trace.NewSpanEndConfig(opts...)
	end := cmp.Or(cfg.Timestamp(), time.Now())
	s.mu.Lock()
	if !s.recording() {
		s.mu.Unlock()
		return
	}
	s.data.End = end
	snap := s.data
	s.mu.Unlock()
	s.r.mu.Lock()
	s.r.ended = append(s.r.ended, snap)
	s.r.mu.Unlock()
}

func (s *span) AddEvent(name string, opts ...trace.EventOption) {
	cfg := trace.NewEventConfig(opts...)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.recording() {
		return
	}
	s.data.Events = append(s.data.Events, Event{Name: name, Attributes: cfg.Attributes(), Time: cfg.Timestamp()})
}

func (s *span) AddLink(l trace.Link) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.recording() || !l.SpanContext.IsValid() { // the SDK drops invalid links too
		return
	}
	s.data.Links = append(s.data.Links, l)
}

// RecordError adds an "exception" event, as the SDK does.
func (s *span) RecordError(err error, opts ...trace.EventOption) {
	if err == nil {
		return
	}
	s.AddEvent("exception", append(opts, trace.WithAttributes(
		attribute.String("exception.type", typeName(err)),
		attribute.String("exception.message", err.Error()),
	))...)
}

func typeName(v any) string {
	t := reflect.TypeOf(v)
	if t.PkgPath() == "" && t.Name() == "" {
		return t.String() // a pointer or other unnamed type
	}
	return t.PkgPath() + "." + t.Name()
}

// SetStatus follows the SDK: Unset < Error < Ok, a lower code is ignored,
// and the description is kept only with Error.
func (s *span) SetStatus(code codes.Code, description string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.recording() || code < s.data.Status.Code {
		return
	}
	if code != codes.Error {
		description = ""
	}
	s.data.Status = Status{Code: code, Description: description}
}

func (s *span) SetName(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.recording() {
		s.data.Name = name
	}
}

// SetAttributes adds kvs; a key already set takes its new value in place.
func (s *span) SetAttributes(kvs ...attribute.KeyValue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.recording() {
		return
	}
	attrs := s.data.Attributes
	for _, kv := range kvs {
		if !kv.Valid() {
			continue
		}
		if i := slices.IndexFunc(attrs, func(a attribute.KeyValue) bool { return a.Key == kv.Key }); i >= 0 {
			attrs[i] = kv
		} else {
			attrs = append(attrs, kv)
		}
	}
	s.data.Attributes = attrs
}

func (s *span) TracerProvider() trace.TracerProvider { return provider{r: s.r} }
