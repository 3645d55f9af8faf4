package main

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// tracerProvider returns an OTLP/HTTP tracer provider when
// OTEL_EXPORTER_OTLP_ENDPOINT (or the traces-specific variable) is set, and
// nil otherwise: tracing is off by default and costs nothing then. The
// exporter reads the standard OTEL_* variables itself.
func (a *app) tracerProvider(ctx context.Context, service string) (trace.TracerProvider, func(context.Context) error, error) {
	if a.getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && a.getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return nil, func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT: %w", err)
	}
	res := resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(service), semconv.ServiceVersion(version))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp, tp.Shutdown, nil
}
