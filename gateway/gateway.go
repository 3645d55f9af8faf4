// Package gateway owns paydedup's HTTP ingress: POST /v1/payments with an
// Idempotency-Key header (the IETF draft "The Idempotency-Key HTTP Header
// Field", and Stripe's semantics), GET /v1/payments/{idempotency_key}, and
// API-key authentication.
//
// The gateway does not charge. It validates a command, publishes it to the
// worker's stream, and answers from the worker's idempotency records:
//
//   - a completed key with the same fingerprint is replayed (Idempotent-
//     Replayed: true); another fingerprint is 422; a key in flight is 409
//     with Retry-After;
//   - a new key is published once and answered 202 Accepted, or, with
//     Prefer: wait=N, with its outcome once the worker completes it (woken by
//     Postgres LISTEN/NOTIFY, not polling), or 202 when N runs out;
//   - a key whose published command the worker dead-lettered answers the
//     dead letter's reason (400, 413 or 422) from then on.
//
// The message is built and decoded as the worker will decode it before
// anything is taken in (Publisher.Check), so the gateway accepts only what
// the worker accepts. A key whose record was purged is still checked
// against the payments ledger.
//
// The worker's claim happens later, when it consumes the message, so the
// gateway guards concurrent first requests with its own short-lived intake
// row (ledger.Intake): one INSERT … ON CONFLICT decides which request
// publishes; the others see it and answer 409 until the worker's record
// exists. The gateway never writes idempotency_keys: a pending claim there
// would be a lease the worker could not take until it expired.
package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// Defaults for Config.
const (
	DefaultMaxHeaderBytes    = 16 << 10
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 15 * time.Second
	DefaultRequestTimeout    = 10 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
	// DefaultMaxWait is the longest Prefer: wait honoured; longer asks are
	// cut to it (RFC 7240 lets a server apply less than preferred).
	DefaultMaxWait = 30 * time.Second
	// DefaultPublishLease is how long a request holds the intake while it
	// publishes; a request that died while publishing is taken over after it.
	DefaultPublishLease = 10 * time.Second
	// DefaultRepublishAfter is how long after a publish a retry that still
	// finds no idempotency record answers 409 without looking further. After
	// it, the retry asks the stream whether it still holds the published
	// copy, and publishes again (with a new Nats-Msg-Id) only when it does
	// not.
	DefaultRepublishAfter = 10 * time.Minute
	// DefaultIntakeRetention keeps intake rows as long as keys are kept.
	DefaultIntakeRetention = ledger.DefaultRetention
	// DefaultQueuedRetryAfter is the Retry-After of a key that is published
	// but not yet claimed by a worker.
	DefaultQueuedRetryAfter = time.Second
	DefaultDrainTimeout     = 20 * time.Second
	// DefaultPoolSize is the PostgreSQL pool "paydedup gateway" opens
	// unless DATABASE_URL sets pool_max_conns: a connection for each of
	// the Flushers batches, and as many again for what runs beside them
	// (GETs, API key look-ups on a cache miss, the purge, the Prefer: wait
	// reads).
	DefaultPoolSize      = 2*DefaultFlushers + 8
	DefaultPurgeInterval = time.Minute
	purgeBatch           = 1000
)

// Records is what the gateway reads of the worker's idempotency store
// (*dedup.Store): a key's record, and the ledger for a key whose record was
// purged, one key at a time or many at once. For a batch of POSTs the
// gateway's Store reads them itself, on the batch's one round trip
// (Store.ReadBatch). The gateway never writes them.
type Records interface {
	Get(ctx context.Context, merchantID, key string) (ledger.Record, error)
	GetPayment(ctx context.Context, merchantID, key string) (ledger.Payment, error)
	GetMany(ctx context.Context, refs []ledger.KeyRef) ([]ledger.Record, error)
}

// Store is the gateway's own store (*pgstore.Store): its intake guard rows,
// taken in a batch of POSTs at a time (see batch.go), and the API keys it
// authenticates.
type Store interface {
	GetIntake(ctx context.Context, merchantID, key string) (ledger.Intake, error)
	AcquireNewIntakes(ctx context.Context, reqs []ledger.ClaimRequest, apiKeys [][]byte, lease, retention time.Duration) ([]ledger.IntakeResult, error)
	AcquireIntakes(ctx context.Context, reqs []ledger.ClaimRequest, lease, retention time.Duration) ([]ledger.IntakeResult, error)
	ReadBatch(ctx context.Context, hashes [][]byte, refs []ledger.KeyRef) (ledger.BatchReads, error)
	IntakesPublished(ctx context.Context, pubs []ledger.Published, holdFor time.Duration) ([]bool, error)
	IntakePublished(ctx context.Context, in ledger.Intake, seq uint64, holdFor time.Duration) error
	AbandonIntake(ctx context.Context, in ledger.Intake) error
	ReleaseIntake(ctx context.Context, in ledger.Intake) error
	PurgeIntakes(ctx context.Context, limit int) (int, error)
	Authenticate(ctx context.Context, apiKey string) (merchantID string, err error)
	// WorkerPauses is the pause the workers report now, if any (see
	// consumer.PauseNoter).
	WorkerPauses(ctx context.Context) (ledger.WorkerPause, bool, error)
}

// Completions wakes a waiter when a key may have completed
// (*pgstore.Listener).
type Completions interface {
	Subscribe(merchantID, key string) *ledger.Subscription
}

// Publisher publishes a validated command to the worker's stream.
// stream.CommandPublisher implements it.
type Publisher interface {
	// Check builds the message Publish would publish and decodes it as the
	// worker will; a *payment.ValidationError is why the worker would
	// dead-letter it. extra holds headers to add (trace context).
	Check(cmd *payment.Command, extra map[string]string) error
	// Publish publishes the checked message and returns its stream
	// sequence after the PubAck. republish > 0 numbers a new copy of a
	// command whose first copy the stream no longer holds. An error that
	// wraps stream.ErrRefused is a refusal (nothing stored); any other is
	// an unknown outcome (the command may be stored).
	Publish(ctx context.Context, cmd *payment.Command, extra map[string]string, republish int) (uint64, error)
	// Stored reports whether the stream still holds the command of
	// (merchantID, key) at seq.
	Stored(ctx context.Context, merchantID, key string, seq uint64) (bool, error)
}

// Config configures a Gateway. Zero values take the defaults.
type Config struct {
	// Limits bound a command (body size, largest amount), as in the worker.
	Limits payment.Limits

	MaxHeaderBytes    int
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration // reading the whole request
	// RequestTimeout bounds the work of one request, not counting a
	// Prefer: wait; the write deadline is RequestTimeout + MaxWait + 5 s.
	RequestTimeout time.Duration
	IdleTimeout    time.Duration
	MaxWait        time.Duration

	PublishLease     time.Duration
	RepublishAfter   time.Duration
	IntakeRetention  time.Duration
	QueuedRetryAfter time.Duration

	// BatchSize bounds the POSTs one batch takes in; BatchWindow is how
	// long a batch waits for one more while another batch is being
	// settled (with none, a batch is cut at once: a lone POST is never
	// held for the window); Flushers is how many batches are settled at
	// once (each holds one database connection while it runs).
	BatchSize   int
	BatchWindow time.Duration
	Flushers    int
	// QueueSize bounds the POSTs waiting for a batch: beyond it they are
	// shed with 503. MerchantShare is the fraction of the queue one
	// merchant may fill: beyond it its POSTs are 429.
	QueueSize     int
	MerchantShare float64

	// AuthFailures is how many failed authentications a source address
	// (IPv4, or an IPv6 /64) may make at once, earned back over
	// AuthFailureWindow; beyond them its requests are 429 with Retry-After,
	// without an API key look-up. Negative turns the throttle off (behind
	// a proxy every client has the proxy's address).
	AuthFailures      int
	AuthFailureWindow time.Duration
	// MaxConns bounds the open connections; one more is answered 503 and
	// closed at once.
	MaxConns int

	// DrainTimeout bounds a graceful shutdown: in-flight requests finish
	// (waiters answer 202 at once), then connections are closed.
	DrainTimeout  time.Duration
	PurgeInterval time.Duration

	// Clock tells the time for Retry-After; the system clock when nil.
	Clock      clock.Clock
	Logger     *slog.Logger
	Registerer prometheus.Registerer // nil: metrics go to a private registry
	// TracerProvider makes a server span per request (otelhttp), whose
	// context the published command carries to the worker; nil makes none,
	// and the client's own trace context travels on unchanged.
	TracerProvider trace.TracerProvider
	// Webhooks, with a Verifier, serves POST /v1/stripe/webhooks.
	Webhooks Webhooks
	// Propagator reads a request's trace context and writes the command's
	// (OTEL_PROPAGATORS); W3C trace context when nil.
	Propagator propagation.TextMapPropagator
	// Idle, when set, says whether commands wait with no worker taking
	// them (stream.Idle), and since when the workers were last seen: GET
	// then says so in a waiting payment's delay (DelayNoWorker). Asked at
	// most once a second, and only when no worker reports a pause.
	Idle func(ctx context.Context) (idle bool, since time.Time, err error)
}

// WithDefaults returns c with every zero value replaced by its default.
func (c Config) WithDefaults() Config {
	c.MaxHeaderBytes = cmp.Or(c.MaxHeaderBytes, DefaultMaxHeaderBytes)
	c.ReadHeaderTimeout = cmp.Or(c.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	c.ReadTimeout = cmp.Or(c.ReadTimeout, DefaultReadTimeout)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, DefaultRequestTimeout)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, DefaultIdleTimeout)
	c.MaxWait = cmp.Or(c.MaxWait, DefaultMaxWait)
	c.PublishLease = cmp.Or(c.PublishLease, DefaultPublishLease)
	c.RepublishAfter = cmp.Or(c.RepublishAfter, DefaultRepublishAfter)
	c.IntakeRetention = cmp.Or(c.IntakeRetention, DefaultIntakeRetention)
	c.QueuedRetryAfter = cmp.Or(c.QueuedRetryAfter, DefaultQueuedRetryAfter)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, DefaultDrainTimeout)
	c.PurgeInterval = cmp.Or(c.PurgeInterval, DefaultPurgeInterval)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.BatchWindow = cmp.Or(c.BatchWindow, DefaultBatchWindow)
	c.Flushers = cmp.Or(c.Flushers, DefaultFlushers)
	c.QueueSize = cmp.Or(c.QueueSize, DefaultQueueSize)
	c.MerchantShare = cmp.Or(c.MerchantShare, DefaultMerchantShare)
	c.AuthFailures = cmp.Or(c.AuthFailures, DefaultAuthFailures)
	c.AuthFailureWindow = cmp.Or(c.AuthFailureWindow, DefaultAuthFailureWindow)
	c.MaxConns = cmp.Or(c.MaxConns, DefaultMaxConns)
	if c.Limits.MaxBodyBytes <= 0 {
		c.Limits.MaxBodyBytes = payment.DefaultMaxBodyBytes
	}
	if c.Limits.MaxAmount <= 0 {
		c.Limits.MaxAmount = payment.DefaultMaxAmount
	}
	if c.Clock == nil {
		c.Clock = clock.System{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports contradictions, naming the setting.
func (c Config) Validate() error {
	var errs []error
	for name, d := range map[string]time.Duration{
		"read header timeout": c.ReadHeaderTimeout, "read timeout": c.ReadTimeout, "request timeout": c.RequestTimeout,
		"idle timeout": c.IdleTimeout, "max wait": c.MaxWait, "publish lease": c.PublishLease,
		"republish after": c.RepublishAfter, "intake retention": c.IntakeRetention,
		"queued retry after": c.QueuedRetryAfter, "drain timeout": c.DrainTimeout, "purge interval": c.PurgeInterval,
	} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %v", name, d))
		}
	}
	if c.MaxHeaderBytes < 1<<10 {
		errs = append(errs, fmt.Errorf("max header bytes must be at least 1 KiB, got %d", c.MaxHeaderBytes))
	}
	if c.MaxWait > 5*time.Minute {
		errs = append(errs, fmt.Errorf("max wait %v is longer than any client or proxy waits", c.MaxWait))
	}
	if c.RepublishAfter < c.PublishLease {
		errs = append(errs, fmt.Errorf("republish after %v must be at least the publish lease %v", c.RepublishAfter, c.PublishLease))
	}
	if c.BatchSize < 1 || c.BatchSize > 10000 || c.Flushers < 1 || c.QueueSize < 1 {
		errs = append(errs, fmt.Errorf("batch size (1..10000, got %d), flushers (got %d) and queue size (got %d) must be at least 1",
			c.BatchSize, c.Flushers, c.QueueSize))
	}
	if c.BatchWindow < 0 || c.BatchWindow > time.Second {
		errs = append(errs, fmt.Errorf("batch window must be within 0..1s, got %v", c.BatchWindow))
	}
	if c.MerchantShare <= 0 || c.MerchantShare > 1 {
		errs = append(errs, fmt.Errorf("merchant share must be within (0, 1], got %v", c.MerchantShare))
	}
	if c.AuthFailures > 100000 {
		errs = append(errs, fmt.Errorf("auth failures must be at most 100000, got %d", c.AuthFailures))
	}
	if c.AuthFailureWindow < time.Second || c.AuthFailureWindow > 24*time.Hour {
		errs = append(errs, fmt.Errorf("auth failure window must be within 1s..24h, got %v", c.AuthFailureWindow))
	}
	if c.MaxConns < 1 || c.MaxConns > 1000000 {
		errs = append(errs, fmt.Errorf("max conns must be within 1..1000000, got %d", c.MaxConns))
	}
	if c.Webhooks.Verifier != nil && c.Webhooks.Ledger == nil {
		errs = append(errs, errors.New("webhooks need the ledger they settle"))
	}
	if c.IntakeRetention <= c.RepublishAfter {
		errs = append(errs, fmt.Errorf("intake retention %v must exceed republish after %v", c.IntakeRetention, c.RepublishAfter))
	}
	return errors.Join(errs...)
}

// Gateway is the HTTP ingress. Serve it: POSTs are taken in by the
// batched intake, which runs while Serve does (Handler mounted on a server
// of your own answers them 503 otherwise).
type Gateway struct {
	base
	comp    Completions
	prop    propagation.TextMapPropagator
	handler http.Handler
	batch   *batcher      // takes every POST in (batch.go)
	auths   *authThrottle // nil: off
	pauses  pauseCache

	draining  atomic.Bool
	drain     chan struct{} // closed when shutdown begins
	drainOnce sync.Once
}

// base is what the batched intake and the handlers share: the settings,
// the stores, the publisher, the logger and the metrics.
type base struct {
	cfg     Config
	records Records
	store   Store
	pub     Publisher
	log     *slog.Logger
	metrics *metrics
}

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

// Handler is the gateway's HTTP handler.
func (g *Gateway) Handler() http.Handler { return g.handler }

// Draining reports whether a shutdown has begun; readiness should fail.
func (g *Gateway) Draining() bool { return g.draining.Load() }

// beginDrain makes waiting requests answer 202 at once.
func (g *Gateway) beginDrain() {
	g.drainOnce.Do(func() {
		g.draining.Store(true)
		close(g.drain)
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
