package consumer

import (
	"context"
	"net/textproto"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// MetadataTraceID is the provider metadata key carrying the trace id.
const MetadataTraceID = "trace_id"

// headerCarrier adapts nats.Header to OpenTelemetry's propagation. NATS
// headers are case-sensitive: W3C names are lower-case (traceparent,
// tracestate), but a publisher copying from net/http may have sent the
// canonical form, so Get tries both.
type headerCarrier nats.Header

func (c headerCarrier) Get(key string) string {
	if v := nats.Header(c).Get(key); v != "" {
		return v
	}
	canon, ok := canonicalNames[key]
	if !ok {
		canon = textproto.CanonicalMIMEHeaderKey(key)
	}
	return nats.Header(c).Get(canon)
}

// canonicalNames holds the canonical form of the names the W3C propagators
// ask for, made once: Get is asked for them on every message, and most
// messages carry neither form.
var canonicalNames = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"traceparent", "tracestate", "baggage"} {
		m[k] = textproto.CanonicalMIMEHeaderKey(k)
	}
	return m
}()

func (c headerCarrier) Set(key, value string) { nats.Header(c).Set(key, value) }

func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

var traceContext = propagation.TraceContext{}

// extractTrace returns ctx carrying the message's remote span context (and
// baggage, when p reads it), and its trace id ("" when the message carries
// no valid one).
func extractTrace(ctx context.Context, p propagation.TextMapPropagator, h nats.Header) (context.Context, string) {
	if len(h) == 0 {
		return ctx, ""
	}
	ctx = p.Extract(ctx, headerCarrier(h))
	sc := trace.SpanContextFromContext(ctx)
	if !sc.TraceID().IsValid() {
		return ctx, ""
	}
	return ctx, sc.TraceID().String()
}
