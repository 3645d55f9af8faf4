// Package ops owns what an operator scrapes and probes: the admin HTTP
// listener (/metrics, /livez, /readyz) and the Prometheus metrics the worker
// and the reconciler report into. Registries are injected; nothing is global.
package ops

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
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/reconciler"
)

// Metrics are paydedup's Prometheus metrics. Labels are low-cardinality:
// never a key or a merchant id.
type Metrics struct {
	messages      *prometheus.CounterVec
	deadLettered  *prometheus.CounterVec
	inFlight      prometheus.Gauge
	reconRuns     *prometheus.CounterVec
	reconRows     *prometheus.CounterVec
	lookupErrs    prometheus.Counter
	purged        prometheus.Counter
	lastReconPass prometheus.Gauge
	claimDur      prometheus.Histogram
	commitDur     prometheus.Histogram
	commitSize    prometheus.Histogram
	providerDur   *prometheus.HistogramVec
	providerErrs  *prometheus.CounterVec
}

// NewMetrics registers the metrics on reg.
func NewMetrics(reg prometheus.Registerer, version string) *Metrics {
	f := promauto.With(reg)
	m := &Metrics{
		messages: f.NewCounterVec(prometheus.CounterOpts{
			Name: "paydedup_messages_total",
			Help: "Payment command messages settled, by result (processed, declined, duplicate, in_flight_nak, retry_nak, dead_lettered, requeued).",
		}, []string{"result"}),
		deadLettered: f.NewCounterVec(prometheus.CounterOpts{
			Name: "paydedup_dead_lettered_total",
			Help: "Messages filed in the dead-letter stream, by reason.",
		}, []string{"reason"}),
		inFlight: f.NewGauge(prometheus.GaugeOpts{
			Name: "paydedup_in_flight",
			Help: "Claimed payments whose provider call and commit are in progress.",
		}),
		reconRuns: f.NewCounterVec(prometheus.CounterOpts{
			Name: "paydedup_reconciler_runs_total",
			Help: "Reconciler passes, by result: ok; lookup_errors (it ran, and provider lookups failed); error (it could not run).",
		}, []string{"result"}),
		lookupErrs: f.NewCounter(prometheus.CounterOpts{
			Name: "paydedup_reconciler_lookup_errors_total",
			Help: "Provider lookups of stuck rows that failed; each row's next lookup is backed off.",
		}),
		reconRows: f.NewCounterVec(prometheus.CounterOpts{
			Name: "paydedup_reconciler_rows_total",
			Help: "Stuck rows handled by the reconciler, by result (completed, declined, failed, left, lease_lost).",
		}, []string{"result"}),
		purged: f.NewCounter(prometheus.CounterOpts{
			Name: "paydedup_purged_rows_total",
			Help: "Expired finished idempotency rows purged.",
		}),
		lastReconPass: f.NewGauge(prometheus.GaugeOpts{
			Name: "paydedup_reconciler_last_pass_timestamp_seconds",
			Help: "Unix time of the last reconciler pass that ran and was not stopped by failing lookups (some lookup answered, or none failed).",
		}),
	}
	m.claimDur = f.NewHistogram(prometheus.HistogramOpts{
		Name: "paydedup_claim_duration_seconds", Help: "Duration of one batch claim (one round trip to Postgres).",
		Buckets: dbBuckets,
	})
	m.commitDur = f.NewHistogram(prometheus.HistogramOpts{
		Name: "paydedup_complete_duration_seconds", Help: "Duration of one group commit of completions (key and ledger).",
		Buckets: dbBuckets,
	})
	m.commitSize = f.NewHistogram(prometheus.HistogramOpts{
		Name: "paydedup_complete_batch_size", Help: "Completions per group commit.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 9),
	})
	m.providerDur = f.NewHistogramVec(prometheus.HistogramOpts{
		Name: "paydedup_provider_call_duration_seconds", Help: "Duration of one provider charge, retries included, by result.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
	}, []string{"result"})
	m.providerErrs = f.NewCounterVec(prometheus.CounterOpts{
		Name: "paydedup_provider_errors_total",
		Help: "Provider charges that ended without a definitive outcome, by class (unknown_outcome, retryable, idempotency_mismatch, rejected, unauthorized).",
	}, []string{"class"})
	build := f.NewGauge(prometheus.GaugeOpts{
		Name: "paydedup_build_info", Help: "Build information.", ConstLabels: prometheus.Labels{"version": version},
	})
	build.Set(1)
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Settled implements consumer.Observer.
func (m *Metrics) Settled(kind consumer.Kind, act consumer.Action) {
	switch {
	case act.Kind == consumer.DeadLetterTerm:
		m.messages.WithLabelValues("dead_lettered").Inc()
		m.deadLettered.WithLabelValues(act.Reason).Inc()
	case act.Kind == consumer.Requeue:
		m.messages.WithLabelValues("requeued").Inc()
	case kind == consumer.Completed:
		m.messages.WithLabelValues("processed").Inc()
	case kind == consumer.Declined:
		m.messages.WithLabelValues("declined").Inc()
	case kind == consumer.Duplicate:
		m.messages.WithLabelValues("duplicate").Inc()
	case kind == consumer.InFlight:
		m.messages.WithLabelValues("in_flight_nak").Inc()
	default:
		m.messages.WithLabelValues("retry_nak").Inc()
	}
}

// dbBuckets suit single Postgres round trips: 0.5 ms to 4 s.
var dbBuckets = prometheus.ExponentialBuckets(0.0005, 2, 14)

// Claimed implements consumer.Observer.
func (m *Metrics) Claimed(d time.Duration, _ int) { m.claimDur.Observe(d.Seconds()) }

// Committed implements consumer.Observer.
func (m *Metrics) Committed(d time.Duration, n int) {
	m.commitDur.Observe(d.Seconds())
	m.commitSize.Observe(float64(n))
}

// ProviderCalled implements consumer.Observer.
func (m *Metrics) ProviderCalled(d time.Duration, result string) {
	m.providerDur.WithLabelValues(result).Observe(d.Seconds())
	if result != "charged" && result != "declined" && result != "processing" {
		m.providerErrs.WithLabelValues(result).Inc()
	}
}

// InFlight implements consumer.Observer.
func (m *Metrics) InFlight(delta int) { m.inFlight.Add(float64(delta)) }

// ObserveRun implements reconciler.Metrics.
func (m *Metrics) ObserveRun(res reconciler.RunResult, err error) {
	if err != nil {
		m.reconRuns.WithLabelValues("error").Inc()
		return
	}
	// A pass whose lookups failed is not a success: it resolved nothing it
	// looked up. It counts as one only when some lookup answered.
	switch {
	case res.LookupErrors == 0:
		m.reconRuns.WithLabelValues("ok").Inc()
		m.lastReconPass.SetToCurrentTime()
	default:
		m.reconRuns.WithLabelValues("lookup_errors").Inc()
		m.lookupErrs.Add(float64(res.LookupErrors))
		if res.Completed+res.Declined+res.Failed > 0 {
			m.lastReconPass.SetToCurrentTime()
		}
	}
	for label, n := range map[string]int{
		"completed": res.Completed, "declined": res.Declined, "failed": res.Failed,
		"left": res.Left, "lease_lost": res.LeaseLost, "foreign_intent": res.ForeignIntents,
		"settled_succeeded": res.SettledSucceeded, "settled_failed": res.SettledFailed,
	} {
		if n > 0 {
			m.reconRows.WithLabelValues(label).Add(float64(n))
		}
	}
	if res.Purged > 0 {
		m.purged.Add(float64(res.Purged))
	}
}

// Check is one readiness check; it returns nil when ready.
type Check func(ctx context.Context) error

// Admin is the admin listener.
type Admin struct {
	srv    *http.Server
	ln     net.Listener
	logger *slog.Logger

	mu     sync.Mutex
	checks map[string]Check
}

// NewAdmin listens on addr and serves /metrics from gatherer, /livez, and
// /readyz running the checks.
func NewAdmin(addr string, gatherer prometheus.Gatherer, logger *slog.Logger) (*Admin, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin listener on %s (PAYDEDUP_ADMIN_ADDR): %w", addr, err)
	}
	a := &Admin{ln: ln, logger: logger, checks: map[string]Check{}}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", a.readyz)
	a.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return a, nil
}

// Addr is the address the listener is bound to.
func (a *Admin) Addr() string { return a.ln.Addr().String() }

// AddCheck adds a readiness check.
func (a *Admin) AddCheck(name string, c Check) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.checks[name] = c
}

func (a *Admin) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	a.mu.Lock()
	checks := make(map[string]Check, len(a.checks))
	for k, v := range a.checks {
		checks[k] = v
	}
	a.mu.Unlock()
	var failed []string
	for name, c := range checks {
		if err := c(ctx); err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", name, err))
		}
	}
	if len(failed) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		for _, f := range failed {
			fmt.Fprintln(w, f)
		}
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}

// Serve serves until ctx ends, then shuts down.
func (a *Admin) Serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- a.srv.Serve(a.ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = a.srv.Shutdown(sctx)
		if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}
