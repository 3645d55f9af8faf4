package main

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
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
