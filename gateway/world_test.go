package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
	stripeadapter "github.com/paydedup/paydedup/provider/stripe"
	"github.com/paydedup/paydedup/stream"
)

// world is one test's world: its own schema, streams, simulator, gateway
// (served on a real listener) and, once started, a real worker.
type world struct {
	t       *testing.T
	ctx     context.Context
	pool    *pgxpool.Pool
	store   *dedup.Store   // the worker's records
	gwStore *pgstore.Store // the gateway's intake and API keys
	nc      *nats.Conn
	js      jetstream.JetStream
	sim     *stripesim.Simulator
	gate    *gatedCharger
	cfg     consumer.Config
	gw      *gateway.Gateway
	base    string
	client  *http.Client

	hooks     *hookRecorder        // the simulator's webhook deliveries
	reg       *prometheus.Registry // the gateway's metrics, unless the test brought its own registerer
	stopServe func() error
	tp        trace.TracerProvider          // the gateway's, the worker's, the pool's and the adapter's; nil: untraced
	prop      propagation.TextMapPropagator // the gateway's and the worker's
	stripeSaw *traceparents                 // the traceparent of each request the simulator served, when traced
	opt       options
	keyA      string // API key of merchant m_a
	keyB      string // API key of merchant m_b
}

// gatedCharger holds the provider call of chosen keys until released.
type gatedCharger struct {
	next consumer.Charger
	mu   sync.Mutex
	held map[string]chan struct{}
}

func (g *gatedCharger) hold(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held[key] = make(chan struct{})
}

func (g *gatedCharger) release(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ch, ok := g.held[key]; ok {
		close(ch)
		delete(g.held, key)
	}
}

func (g *gatedCharger) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	g.mu.Lock()
	ch := g.held[req.IdempotencyKey]
	g.mu.Unlock()
	if ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.next.Charge(ctx, req)
}

// options change one test's world: wrappers around the gateway's store and
// publisher (to inject failures or races), and the worker's configuration.
type options struct {
	store  func(gateway.Store) gateway.Store
	pub    func(gateway.Publisher) gateway.Publisher
	worker func(*consumer.Config)
	// charger, when set, wraps the worker's charger (to fail its calls).
	charger func(consumer.Charger) consumer.Charger
	// webhookSecret, when set, turns the gateway's Stripe webhooks on and
	// has the simulator post its events, through w.hooks, to them.
	webhookSecret string
	// webhookVerifier, when set, verifies the webhooks instead of one built
	// from webhookSecret (which the simulator still signs with).
	webhookVerifier gateway.EventVerifier
	// ledger, when set, wraps the webhooks' ledger (to lose its answers).
	ledger          func(gateway.Ledger) gateway.Ledger
	processingDelay time.Duration
	// captureWindow, when set, is the simulator's capture window.
	captureWindow time.Duration
	// roundTrips, when set, counts the round trips of the gateway's stores
	// (a pool of their own on the world's schema; the world's pool, the
	// listener and the worker are not counted).
	roundTrips *atomic.Int64
	// pubConn, when set, is the NATS connection of the gateway's publisher
	// (e.g. through a proxy to url), and pubTimeout its publish timeout.
	pubConn    func(t *testing.T, url string) *nats.Conn
	pubTimeout time.Duration
}

func setup(t *testing.T, gcfg gateway.Config) *world {
	t.Helper()
	return setupWith(t, gcfg, options{})
}

func setupWith(t *testing.T, gcfg gateway.Config, opt options) *world {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Pool(t)
	if gcfg.TracerProvider != nil {
		pool = tracedPool(t, gcfg.TracerProvider)
	}
	store, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	gwStore, err := pgstore.New(pool, pgstore.Config{Records: store})
	if err != nil {
		t.Fatal(err)
	}
	records, gwOwn := store, gwStore // the gateway's
	if opt.roundTrips != nil {
		cfg := pool.Config().Copy()
		pg.WithRoundTripCounter(opt.roundTrips)(cfg)
		counted, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(counted.Close)
		if records, err = dedup.New(counted, dedup.Config{}); err != nil {
			t.Fatal(err)
		}
		if gwOwn, err = pgstore.New(counted, pgstore.Config{Records: records}); err != nil {
			t.Fatal(err)
		}
	}
	nc := testenv.NATSConn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// The listener comes first, so that the simulator knows where to post
	// its webhooks.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	simCfg := stripesim.Config{Seed: 9, ProcessingDelay: opt.processingDelay, CaptureWindow: opt.captureWindow}
	hooks := &hookRecorder{target: base + gateway.PathStripeWebhooks}
	if opt.webhookSecret != "" {
		rec := httptest.NewServer(hooks)
		t.Cleanup(rec.Close)
		simCfg.WebhookURL, simCfg.WebhookSecret = rec.URL, opt.webhookSecret
		v, err := stripeadapter.NewWebhookVerifier(opt.webhookSecret, 0)
		if err != nil {
			t.Fatal(err)
		}
		var verifier gateway.EventVerifier = v
		if opt.webhookVerifier != nil {
			verifier = opt.webhookVerifier
		}
		var ledger gateway.Ledger = store
		if opt.ledger != nil {
			ledger = opt.ledger(ledger)
		}
		gcfg.Webhooks = gateway.Webhooks{Verifier: verifier, Ledger: ledger}
	}
	sim, stripe := testenv.ProviderWith(t, simCfg, 4*time.Second)
	var seen traceparents
	if gcfg.TracerProvider != nil {
		sim, stripe = tracedProvider(t, gcfg.TracerProvider, gcfg.Propagator, &seen)
	}
	cfg := consumer.Config{Stream: testenv.Streams(t, js)}
	cfg.Lease, cfg.Stream.AckWait, cfg.Stream.MaxDeliver = 10*time.Second, 15*time.Second, 6
	cfg.ProviderTry = provider.RetryPolicy{MaxTries: 2, AttemptTimeout: 4 * time.Second, InitialInterval: 50 * time.Millisecond, MaxInterval: 100 * time.Millisecond}
	cfg.RetryBase, cfg.RetryMax = 50*time.Millisecond, 500*time.Millisecond
	cfg.DrainTimeout, cfg.Concurrency, cfg.FetchBatch = 2*time.Second, 8, 20
	// The streams exist before the gateway publishes (the worker would
	// create them too when it starts).
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, _, err := stream.EnsureStreams(sctx, js, cfg.Stream); err != nil {
		t.Fatal(err)
	}

	comp, err := pgstore.NewListener(pool, pgstore.ListenerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	compCtx, stopComp := context.WithCancel(ctx)
	compDone := make(chan struct{})
	go func() { defer close(compDone); _ = comp.Run(compCtx) }()
	t.Cleanup(func() { stopComp(); <-compDone })

	pubNC := nc
	if opt.pubConn != nil {
		pubNC = opt.pubConn(t, testenv.NATSURL(t))
	}
	pub, err := stream.NewCommandPublisher(pubNC, cfg.Stream, opt.pubTimeout)
	if err != nil {
		t.Fatal(err)
	}
	var gstore gateway.Store = gwOwn
	if opt.store != nil {
		gstore = opt.store(gwOwn)
	}
	var gpub gateway.Publisher = pub
	if opt.pub != nil {
		gpub = opt.pub(pub)
	}
	reg, ok := gcfg.Registerer.(*prometheus.Registry)
	if !ok && gcfg.Registerer == nil {
		reg = prometheus.NewRegistry()
		gcfg.Registerer = reg
	}
	gw, err := gateway.New(records, gstore, comp, gpub, gcfg)
	if err != nil {
		t.Fatal(err)
	}
	serveCtx, stopServe := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- gw.Serve(serveCtx, ln) }()
	var stopOnce sync.Once
	var serveErr error
	stop := func() error {
		stopOnce.Do(func() { stopServe(); serveErr = <-served })
		return serveErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	t.Cleanup(client.CloseIdleConnections)

	w := &world{t: t, ctx: ctx, pool: pool, store: store, gwStore: gwStore, nc: nc, js: js, sim: sim,
		gate: &gatedCharger{next: stripe, held: map[string]chan struct{}{}},
		cfg:  cfg, gw: gw, base: base, client: client, stopServe: stop, opt: opt, hooks: hooks, reg: reg,
		tp: gcfg.TracerProvider, prop: gcfg.Propagator, stripeSaw: &seen}
	w.keyA = w.apiKey("m_a")
	w.keyB = w.apiKey("m_b")
	w.eventually("completion listener up", comp.Listening)
	return w
}

func (w *world) apiKey(merchant string) string {
	w.t.Helper()
	key, _, err := w.gwStore.CreateAPIKey(w.ctx, merchant, "test")
	if err != nil {
		w.t.Fatal(err)
	}
	return key
}

// startWorker runs a real worker (charging through the gate) until the test
// ends.
func (w *world) startWorker() {
	w.t.Helper()
	cfg := w.cfg
	cfg.Holder = "w1"
	if w.opt.worker != nil {
		w.opt.worker(&cfg)
	}
	var charger consumer.Charger = w.gate
	if w.opt.charger != nil {
		charger = w.opt.charger(charger)
	}
	proc := consumer.NewProcessor(w.store, charger, cfg, nil)
	// The worker marks the intake of a command it dead-letters through the
	// gateway's store it is given, as "paydedup worker" is wired; without it
	// TestDeadLetterIsTerminalAtTheGateway fails.
	wk, err := consumer.NewWorker(w.nc, proc, cfg, nil, nil, w.gwStore)
	if err != nil {
		w.t.Fatal(err)
	}
	if w.tp != nil {
		wk.SetTracer(w.tp)
		wk.SetPropagator(w.prop)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- wk.Run(ctx) }()
	w.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			w.t.Errorf("worker: %v", err)
		}
	})
}

// tracedPool is a pool on the test's schema whose statements are spans
// from tp, as `paydedup worker` and `paydedup gateway` connect when tracing.
func tracedPool(t *testing.T, tp trace.TracerProvider) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pg.Connect(ctx, testenv.PostgresURL(t), pg.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// tracedProvider is the Stripe adapter, its calls client spans from tp
// (otelhttp, as `paydedup worker` builds it when tracing), in front of a
// simulator served over HTTP.
func tracedProvider(t *testing.T, tp trace.TracerProvider, prop propagation.TextMapPropagator, seen *traceparents) (*stripesim.Simulator, *stripeadapter.Client) {
	t.Helper()
	sim := stripesim.New(stripesim.Config{Seed: 9})
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		seen.add(r.Header.Get("traceparent"))
		sim.ServeHTTP(rw, r)
	}))
	t.Cleanup(srv.Close)
	hc := &http.Client{Transport: otelhttp.NewTransport(stripeadapter.NewTransport(), otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(prop))}
	adapter, err := stripeadapter.New(stripeadapter.Config{SecretKey: "sk_test_paydedup", APIBase: srv.URL, Timeout: 4 * time.Second, HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(adapter.CloseIdleConnections)
	return sim, adapter
}

// traceparents records the traceparent header of each request served.
type traceparents struct {
	mu   sync.Mutex
	seen []string
}

func (p *traceparents) add(h string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = append(p.seen, h)
}

func (p *traceparents) all() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.seen...)
}

// response is one HTTP answer, read whole.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) problem(t *testing.T) gateway.Problem {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("status %d: Content-Type %q, want application/problem+json (body %s)", r.status, ct, r.body)
	}
	var p gateway.Problem
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("problem body %s: %v", r.body, err)
	}
	if p.Status != r.status || p.Type == "" || p.Title == "" {
		t.Fatalf("problem %+v does not match status %d", p, r.status)
	}
	return p
}

func (r response) payment(t *testing.T) gateway.Payment {
	t.Helper()
	var p gateway.Payment
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("payment body %s: %v", r.body, err)
	}
	return p
}

// req sends one request. apiKey "" sends no Authorization; hdr may hold
// Idempotency-Key, Prefer, Content-Type...
func (w *world) req(ctx context.Context, method, path, apiKey, body string, hdr map[string]string) (response, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r, err := http.NewRequestWithContext(ctx, method, w.base+path, rd)
	if err != nil {
		return response{}, err
	}
	if apiKey != "" {
		r.Header.Set("Authorization", "Bearer "+apiKey)
	}
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	resp, err := w.client.Do(r)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: b}, err
}

func (w *world) do(method, path, apiKey, body string, hdr map[string]string) response {
	w.t.Helper()
	r, err := w.req(w.ctx, method, path, apiKey, body, hdr)
	if err != nil {
		w.t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

// post sends POST /v1/payments as merchant A with an Idempotency-Key.
func (w *world) post(key, body string, hdr ...string) response {
	w.t.Helper()
	h := map[string]string{"Idempotency-Key": key}
	for i := 0; i+1 < len(hdr); i += 2 {
		h[hdr[i]] = hdr[i+1]
	}
	return w.do(http.MethodPost, "/v1/payments", w.keyA, body, h)
}

func payBody(amount int64, method string) string {
	return fmt.Sprintf(`{"amount":%d,"currency":"usd","payment_method":%q,"description":"order","metadata":{"order_id":"42"}}`, amount, method)
}

func (w *world) eventually(what string, cond func() bool) {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			w.t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (w *world) record(merchant, key string) (ledger.Record, bool) {
	rec, err := w.store.Get(w.ctx, merchant, key)
	if errors.Is(err, ledger.ErrNotFound) {
		return rec, false
	}
	if err != nil {
		w.t.Fatal(err)
	}
	return rec, true
}

func (w *world) waitStatus(merchant, key string, st ledger.Status) {
	w.t.Helper()
	w.eventually(fmt.Sprintf("%s/%s %s", merchant, key, st), func() bool {
		rec, ok := w.record(merchant, key)
		return ok && rec.Status == st
	})
}

func (w *world) streamMsgs() uint64 {
	w.t.Helper()
	s, err := w.js.Stream(w.ctx, w.cfg.Stream.Name)
	if err != nil {
		w.t.Fatal(err)
	}
	info, err := s.Info(w.ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	return info.State.Msgs
}

func (w *world) count(sql string, args ...any) int {
	w.t.Helper()
	var n int
	if err := w.pool.QueryRow(w.ctx, sql, args...).Scan(&n); err != nil {
		w.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (w *world) charges(merchant, key string) int { return w.sim.ChargesByKey()[merchant+":"+key] }

func wantStatus(t *testing.T, r response, want int) {
	t.Helper()
	if r.status != want {
		t.Fatalf("status %d, want %d; body %s", r.status, want, bytes.TrimSpace(r.body))
	}
}
