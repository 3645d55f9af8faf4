package gateway_test

import (
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/paydedup/paydedup/gateway"
)

const clientTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// publishedTrace returns the trace context the command of key carries.
func publishedTrace(t *testing.T, w *world) trace.SpanContext {
	t.Helper()
	s, err := w.js.Stream(w.ctx, w.cfg.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := s.GetLastMsgForSubject(w.ctx, w.cfg.Stream.SubjectPrefix+".m_a")
	if err != nil {
		t.Fatal(err)
	}
	// NATS headers keep their case: read the W3C lower-case names as sent.
	carrier := propagation.MapCarrier{}
	for k, v := range msg.Header {
		carrier[k] = v[0]
	}
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(w.ctx, carrier))
}

// TestGatewayServerSpan: with a tracer the gateway makes a server span per
// request, a child of the client's traceparent, and the published command
// carries that span's context, so the worker's span is its child; without
// one the client's context travels on unchanged.
func TestGatewayServerSpan(t *testing.T) {
	t.Parallel()
	t.Run("traced", func(t *testing.T) {
		t.Parallel()
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		w := setup(t, gateway.Config{TracerProvider: tp,
			Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})})
		r := w.post("trace-1", payBody(100, "pm_card_visa"), "traceparent", clientTraceparent, "baggage", "tenant=t1")
		wantStatus(t, r, http.StatusAccepted)
		var server sdktrace.ReadOnlySpan
		for _, s := range rec.Ended() {
			if s.SpanKind() == trace.SpanKindServer {
				server = s
			}
		}
		if server == nil {
			t.Fatalf("no server span among %d", len(rec.Ended()))
		}
		if got := server.Parent().SpanID().String(); got != "00f067aa0ba902b7" || server.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Errorf("server span %s, parent %s: want a child of the client's traceparent", server.SpanContext().TraceID(), got)
		}
		pub := publishedTrace(t, w)
		if pub.TraceID() != server.SpanContext().TraceID() || pub.SpanID() != server.SpanContext().SpanID() {
			t.Errorf("the command carries %s/%s, want the server span %s/%s", pub.TraceID(), pub.SpanID(),
				server.SpanContext().TraceID(), server.SpanContext().SpanID())
		}
	})
	t.Run("untraced", func(t *testing.T) {
		t.Parallel()
		w := setup(t, gateway.Config{})
		r := w.post("trace-2", payBody(100, "pm_card_visa"), "traceparent", clientTraceparent)
		wantStatus(t, r, http.StatusAccepted)
		pub := publishedTrace(t, w)
		if pub.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || pub.SpanID().String() != "00f067aa0ba902b7" {
			t.Errorf("without a tracer the command carries %s/%s, want the client's traceparent", pub.TraceID(), pub.SpanID())
		}
	})
}
