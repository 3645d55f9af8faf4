package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"

	"github.com/paydedup/paydedup/payment"
)

// New validates cfg and returns a gateway that reads the worker's records
// and keeps its intake and API keys in store.
func New(records Records, store Store, comp Completions, pub Publisher, cfg Config) (*Gateway, error) {
	if records == nil || store == nil || comp == nil || pub == nil {
		return nil, errors.New("gateway: records, store, completions and publisher are required")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("gateway configuration: %w", err)
	}
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	g := &Gateway{base: base{cfg: cfg, records: records, store: store, pub: pub, log: cfg.Logger, metrics: m}, comp: comp, drain: make(chan struct{})}
	if cfg.Propagator == nil {
		cfg.Propagator = propagation.TraceContext{}
	}
	g.prop = cfg.Propagator
	g.pauses.idle = cfg.Idle
	g.batch = newBatcher(&g.base, store, records)
	g.auths = newAuthThrottle(cfg.AuthFailures, cfg.AuthFailureWindow, cfg.Clock)
	if cfg.TracerProvider == nil {
		// Tracing off: otelhttp's span would be a no-op one that keeps the
		// client's span context, its attributes and wrapping computed for
		// nothing on every request. Only that context is kept, so that the
		// command still carries the client's trace (traceHeaders).
		g.handler = withClientTrace(g.routes(), cfg.Propagator)
		return g, nil
	}
	g.handler = otelhttp.NewHandler(g.routes(), "paydedup.gateway",
		otelhttp.WithTracerProvider(cfg.TracerProvider), otelhttp.WithPropagators(cfg.Propagator),
		otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()))
	return g, nil
}

// withClientTrace puts the trace context the client sent (as prop reads
// it) in each request's context.
func withClientTrace(next http.Handler, prop propagation.TextMapPropagator) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))))
	})
}

// routes builds the mux: every API route is authenticated (the webhook by
// its signature); anything else is a problem+json 404 or 405.
func (g *Gateway) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", g.instrument("post_payment", g.authenticate(http.HandlerFunc(g.postPayment), authCached)))
	mux.Handle("GET /v1/payments/{key}", g.instrument("get_payment", g.authenticate(http.HandlerFunc(g.getPayment), authLookup)))
	for _, op := range []struct{ kind, post, get string }{
		{payment.KindRefund, "/v1/payments/{key}/refunds", "/v1/refunds/{key}"},
		{payment.KindCapture, "/v1/payments/{key}/capture", "/v1/captures/{key}"},
		{payment.KindCancel, "/v1/payments/{key}/cancel", "/v1/cancels/{key}"},
	} {
		// The routes' metrics are the payment's: a refund, capture or
		// cancel is a POST on a payment, and its GET a payment's read.
		mux.Handle("POST "+op.post, g.instrument("post_payment", g.authenticate(g.postOperation(op.kind), authHashed)))
		mux.Handle("GET "+op.get, g.instrument("get_payment", g.authenticate(g.getOperation(op.kind), authLookup)))
	}
	mux.Handle("/v1/payments", g.instrument("other", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", http.MethodPost)
		writeProblem(w, Problem{Type: ProblemMethodNotAllowed, Status: http.StatusMethodNotAllowed, Detail: problemDetailMethodAllowed})
	})))
	mux.Handle("/v1/payments/{key}", g.instrument("other", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", http.MethodGet+", "+http.MethodHead)
		writeProblem(w, Problem{Type: ProblemMethodNotAllowed, Status: http.StatusMethodNotAllowed, Detail: problemDetailMethodAllowed})
	})))
	if g.cfg.Webhooks.Verifier != nil {
		mux.Handle("POST "+PathStripeWebhooks, g.instrument("stripe_webhook", http.HandlerFunc(g.postStripeWebhook)))
	}
	mux.Handle("/", g.instrument("other", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, Problem{Type: ProblemNotFound, Status: http.StatusNotFound})
	})))
	return g.refuseDeclaredTooLarge(mux)
}

func (g *Gateway) instrument(route string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		g.metrics.observe(route, rec.status, time.Since(start))
	})
}

// Server returns an http.Server for the handler with the configured limits.
func (g *Gateway) Server() *http.Server {
	return &http.Server{
		Handler:           g.handler,
		MaxHeaderBytes:    g.cfg.MaxHeaderBytes,
		ReadHeaderTimeout: g.cfg.ReadHeaderTimeout,
		ReadTimeout:       g.cfg.ReadTimeout,
		WriteTimeout:      g.cfg.RequestTimeout + g.cfg.MaxWait + 5*time.Second,
		IdleTimeout:       g.cfg.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelWarn),
	}
}

// Serve serves on ln, at most MaxConns connections at once, until ctx
// ends, and purges expired intake rows. Then it
// drains: readiness fails, waiting requests answer 202, in-flight requests
// finish within DrainTimeout, and remaining connections are closed. It
// returns nil after a drain.
func (g *Gateway) Serve(ctx context.Context, ln net.Listener) error {
	srv := g.Server()
	ln = &connLimitListener{Listener: ln, max: int64(g.cfg.MaxConns), refused: g.metrics.connsRefused, gauge: g.metrics.connsOpen}
	var wg sync.WaitGroup
	// The batched intake takes POSTs in from the first request served, and
	// outlives the drain: in-flight POSTs wait on it.
	batchCtx, stopBatch := context.WithCancel(context.WithoutCancel(ctx))
	g.batch.open()
	wg.Go(func() { g.batch.run(batchCtx) })
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	purgeCtx, stopPurge := context.WithCancel(ctx)
	wg.Go(func() { g.purgeLoop(purgeCtx) })
	defer func() {
		stopPurge()
		stopBatch()
		wg.Wait()
	}()
	g.log.Info("gateway listening", "addr", ln.Addr().String())

	select {
	case err := <-errc:
		return fmt.Errorf("gateway: %w", err)
	case <-ctx.Done():
	}
	g.log.Info("gateway draining", "timeout", g.cfg.DrainTimeout.String())
	g.beginDrain()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.DrainTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		g.log.Warn("drain deadline reached; closing connections", "error", err)
		_ = srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("gateway: %w", err)
	}
	g.log.Info("gateway stopped")
	return nil
}

// PurgeOnce deletes expired intake rows in batches and returns how many.
func (g *Gateway) PurgeOnce(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := g.store.PurgeIntakes(ctx, purgeBatch)
		total += n
		if err != nil || n < purgeBatch {
			return total, err
		}
	}
}

func (g *Gateway) purgeLoop(ctx context.Context) {
	t := time.NewTicker(g.cfg.PurgeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := g.PurgeOnce(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			g.log.Warn("purge of expired intake rows failed", "error", err)
		case n > 0:
			g.log.Info("purged expired intake rows", "rows", n)
		}
	}
}
