package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/propagators/autoprop"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/paydedup/paydedup/internal/pg"
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
	tp, err := a.newTracerProvider(ctx, service, sdktrace.WithBatcher(exp))
	if err != nil {
		return nil, nil, err
	}
	return tp, tp.Shutdown, nil
}

// tracing starts the command's tracer provider (nil when tracing is off)
// and returns the options that make its statements spans and a stop that
// flushes the spans left (within 5 s).
func (a *app) tracing(ctx context.Context, service string) (trace.TracerProvider, []pg.ConnectOption, func(), error) {
	tp, shutdown, err := a.tracerProvider(ctx, service)
	if err != nil || tp == nil {
		return nil, nil, func() {}, err
	}
	return tp, []pg.ConnectOption{pg.WithTracerProvider(tp)}, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = shutdown(sctx)
	}, nil
}

// newTracerProvider returns an SDK tracer provider whose resource names the
// service OTEL_SERVICE_NAME, else service (the command's own name), with
// OTEL_RESOURCE_ATTRIBUTES added.
func (a *app) newTracerProvider(ctx context.Context, service string, opts ...sdktrace.TracerProviderOption) (*sdktrace.TracerProvider, error) {
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceVersion(version)),
		resource.WithFromEnv(),
		resource.WithAttributes(semconv.ServiceName(envOr(a.getenv, "OTEL_SERVICE_NAME", service))),
	)
	if err != nil {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	return sdktrace.NewTracerProvider(append([]sdktrace.TracerProviderOption{sdktrace.WithResource(res)}, opts...)...), nil
}

// defaultPropagators is what OpenTelemetry SDKs use when OTEL_PROPAGATORS
// is unset.
const defaultPropagators = "tracecontext,baggage"

// propagator returns the propagator OTEL_PROPAGATORS names (tracecontext,
// baggage, b3, b3multi, jaeger, xray, ottrace, none; comma-separated),
// tracecontext and baggage when it is unset.
func (a *app) propagator() (propagation.TextMapPropagator, error) {
	var names []string
	for _, n := range strings.Split(envOr(a.getenv, "OTEL_PROPAGATORS", defaultPropagators), ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	p, err := autoprop.TextMapPropagator(names...)
	if err != nil {
		return nil, fmt.Errorf("OTEL_PROPAGATORS: %w", err)
	}
	return p, nil
}
