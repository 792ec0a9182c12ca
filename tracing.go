package outbox

import (
	"context"
	"slices"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The W3C trace context headers propagation.TraceContext writes.
const (
	traceparentHeader = "traceparent"
	tracestateHeader  = "tracestate"
)

// traceInjector injects the trace context of one create statement into its
// new messages. Its zero value (no span in the statement's context) only
// drops what an earlier injection left on a reused struct.
type traceInjector struct {
	prop propagation.TextMapPropagator // nil: the global, looked up on use
	on   bool                          // the statement's context carries a valid span context
}

// newTraceInjector returns the injector of a statement whose context is
// ctx; prop nil means otel.GetTextMapPropagator().
func newTraceInjector(ctx context.Context, prop propagation.TextMapPropagator) traceInjector {
	if ctx == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return traceInjector{}
	}
	return traceInjector{prop: prop, on: true}
}

// inject adds the trace context of ctx to m's headers (see
// Plugin.Propagator), first dropping what an earlier injection left there.
func (t traceInjector) inject(ctx context.Context, m *Message) {
	if m.traced != nil {
		if n := len(m.traced); len(m.Headers) == n && &m.Headers[0] == &m.traced[0] {
			m.Headers = m.Headers[:m.tracedFrom:m.tracedFrom]
			if m.tracedFrom == 0 {
				m.Headers = nil
			}
		}
		m.traced, m.tracedFrom = nil, 0
	}
	if !t.on {
		return
	}
	prop := t.prop
	if prop == nil {
		prop = otel.GetTextMapPropagator()
	}
	m.tracedFrom = len(m.Headers)
	prop.Inject(ctx, (*headerCarrier)(m)) // a pointer: no allocation
	if len(m.Headers) == m.tracedFrom {
		m.tracedFrom = 0
		return
	}
	m.traced = m.Headers
}

// headerCarrier is the propagation.TextMapCarrier of an injection into a
// message's headers; the first tracedFrom are the caller's, never replaced.
type headerCarrier Message

var _ propagation.TextMapCarrier = (*headerCarrier)(nil)

// Get returns the value of the first header named key, or "".
func (c *headerCarrier) Get(key string) string {
	for _, h := range c.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// Set appends the header key, or replaces the value this injection gave it,
// unless the caller set that header (or traceparent, for tracestate).
func (c *headerCarrier) Set(key, value string) {
	for _, h := range c.Headers[:c.tracedFrom] {
		if strings.EqualFold(h.Key, key) || (key == tracestateHeader && strings.EqualFold(h.Key, traceparentHeader)) {
			return
		}
	}
	for i := c.tracedFrom; i < len(c.Headers); i++ {
		if c.Headers[i].Key == key {
			c.Headers[i].Value = []byte(value)
			return
		}
	}
	if len(c.Headers) == c.tracedFrom {
		c.Headers = slices.Clip(c.Headers) // append copies into a new array
	}
	c.Headers = append(c.Headers, Header{Key: key, Value: []byte(value)})
}

// Keys returns the header names, in order.
func (c *headerCarrier) Keys() []string {
	keys := make([]string, len(c.Headers))
	for i, h := range c.Headers {
		keys[i] = h.Key
	}
	return keys
}
