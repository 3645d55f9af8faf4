package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/paydedup/paydedup/provider"
)

func TestPropagatorFromEnv(t *testing.T) {
	t.Parallel()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	carrier := propagation.MapCarrier{"traceparent": tp, "baggage": "tenant=t1", "x-b3-traceid": "80f198ee56343ba864fe8b2a57d3eff7",
		"x-b3-spanid": "e457b5a2e4d86bd1", "x-b3-sampled": "1"}
	tests := []struct {
		env       string
		traceID   string
		baggage   bool
		wantError bool
	}{
		{env: "", traceID: "4bf92f3577b34da6a3ce929d0e0e4736", baggage: true}, // the OpenTelemetry default
		{env: "tracecontext", traceID: "4bf92f3577b34da6a3ce929d0e0e4736"},
		{env: "b3multi", traceID: "80f198ee56343ba864fe8b2a57d3eff7"},
		{env: "none"},
		{env: "tracecontext,w3c-typo", wantError: true},
	}
	for _, tt := range tests {
		a := &app{getenv: func(k string) string {
			if k == "OTEL_PROPAGATORS" {
				return tt.env
			}
			return ""
		}}
		p, err := a.propagator()
		if tt.wantError {
			if err == nil || !strings.Contains(err.Error(), "OTEL_PROPAGATORS") {
				t.Errorf("OTEL_PROPAGATORS=%q: %v, want an error naming the variable", tt.env, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("OTEL_PROPAGATORS=%q: %v", tt.env, err)
		}
		ctx := p.Extract(context.Background(), carrier)
		got := ""
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			got = sc.TraceID().String()
		}
		if got != tt.traceID {
			t.Errorf("OTEL_PROPAGATORS=%q: trace id %q, want %q", tt.env, got, tt.traceID)
		}
		if has := baggage.FromContext(ctx).Member("tenant").Value() == "t1"; has != tt.baggage {
			t.Errorf("OTEL_PROPAGATORS=%q: baggage read %v, want %v", tt.env, has, tt.baggage)
		}
	}
}

func TestServiceNameFromEnv(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ env, want string }{
		{"", "paydedup-worker"},
		{"payments-eu", "payments-eu"},
	} {
		exp := tracetest.NewInMemoryExporter()
		a := &app{getenv: func(k string) string {
			if k == "OTEL_SERVICE_NAME" {
				return tt.env
			}
			return ""
		}}
		tp, err := a.newTracerProvider(context.Background(), "paydedup-worker", sdktrace.WithSyncer(exp))
		if err != nil {
			t.Fatal(err)
		}
		_, span := tp.Tracer("test").Start(context.Background(), "s")
		span.End()
		spans := exp.GetSpans()
		if len(spans) != 1 {
			t.Fatalf("%d spans", len(spans))
		}
		var got string
		for _, kv := range spans[0].Resource.Attributes() {
			if kv.Key == "service.name" {
				got = kv.Value.AsString()
			}
		}
		if got != tt.want {
			t.Errorf("OTEL_SERVICE_NAME=%q: service.name %q, want %q", tt.env, got, tt.want)
		}
	}
}

// TestStripeCallsTraced: with a tracer provider, each Stripe call the
// worker's adapter makes is a client span, a child of the caller's span,
// whose traceparent Stripe receives; without one no header is added.
func TestStripeCallsTraced(t *testing.T) {
	t.Parallel()
	for _, traced := range []bool{true, false} {
		var got atomic.Value
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got.Store(r.Header.Get("traceparent"))
			http.Error(w, `{"error":{"type":"api_error","message":"test"}}`, http.StatusInternalServerError)
		}))
		defer srv.Close()
		rec := tracetest.NewSpanRecorder()
		var tp trace.TracerProvider
		if traced {
			tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		}
		p := providerFlags{kind: "stripe", secretKey: "sk_test_trace", apiBase: srv.URL, timeout: 5 * time.Second}
		prov, stop, err := p.buildTraced(context.Background(), tp, propagation.TraceContext{})
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		defer prov.CloseIdleConnections()
		ctx, parent := sdktrace.NewTracerProvider().Tracer("test").Start(context.Background(), "message")
		_, _ = prov.Charge(ctx, provider.ChargeRequest{ProviderKey: "pdk_trace", MerchantID: "m", IdempotencyKey: "k",
			Amount: 100, Currency: "usd", PaymentMethod: "pm_card_visa"})
		parent.End()
		header, _ := got.Load().(string)
		if !traced {
			if header != "" {
				t.Errorf("untraced: Stripe saw traceparent %q, want none", header)
			}
			continue
		}
		spans := rec.Ended()
		if len(spans) != 1 || spans[0].SpanKind() != trace.SpanKindClient || spans[0].Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Fatalf("got %d spans, want one client span under the caller's", len(spans))
		}
		if want := "00-" + spans[0].SpanContext().TraceID().String() + "-" + spans[0].SpanContext().SpanID().String() + "-01"; header != want {
			t.Errorf("Stripe saw traceparent %q, want %q", header, want)
		}
	}
}
