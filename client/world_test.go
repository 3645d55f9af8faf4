package client_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/stream"
)

// world is one test's real gateway: its own schema and streams, served on
// a real listener, with its publisher's NATS link (link) that a test may
// cut, and a real worker charging the simulator once started.
type world struct {
	t      *testing.T
	ctx    context.Context
	store  *dedup.Store
	gw     *pgstore.Store
	nc     *nats.Conn
	js     jetstream.JetStream
	sim    *stripesim.Simulator
	charge consumer.Charger
	cfg    consumer.Config
	base   string
	link   *testenv.Link // the gateway publisher's link to NATS
	pubNC  *nats.Conn
	apiKey string // merchant m_a's
}

func setup(t *testing.T) *world {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Pool(t)
	store, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	gwStore, err := pgstore.New(pool, pgstore.Config{Records: store})
	if err != nil {
		t.Fatal(err)
	}
	nc := testenv.NATSConn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	sim, adapter := testenv.Provider(t, 7, 4*time.Second)
	cfg := consumer.Config{Stream: testenv.Streams(t, js)}
	cfg.Lease, cfg.Stream.AckWait, cfg.Stream.MaxDeliver = 10*time.Second, 15*time.Second, 6
	cfg.ProviderTry = provider.RetryPolicy{MaxTries: 2, AttemptTimeout: 4 * time.Second, InitialInterval: 50 * time.Millisecond, MaxInterval: 100 * time.Millisecond}
	cfg.RetryBase, cfg.RetryMax = 50*time.Millisecond, 500*time.Millisecond
	cfg.DrainTimeout, cfg.Concurrency, cfg.FetchBatch = 2*time.Second, 4, 20
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

	// The gateway publishes through a link a test may cut (a lost PubAck).
	u, err := url.Parse(testenv.NATSURL(t))
	if err != nil {
		t.Fatal(err)
	}
	link := testenv.NewLink(t, "gateway-nats", u.Host)
	pubNC, err := nats.Connect(link.URL("nats"), nats.Timeout(5*time.Second), nats.ReconnectWait(50*time.Millisecond), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pubNC.Close)
	pub, err := stream.NewCommandPublisher(pubNC, cfg.Stream, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(store, gwStore, comp, pub, gateway.Config{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveCtx, stopServe := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- gw.Serve(serveCtx, ln) }()
	t.Cleanup(func() {
		stopServe()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	key, _, err := gwStore.CreateAPIKey(ctx, "m_a", "test")
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, ctx: ctx, store: store, gw: gwStore, nc: nc, js: js, sim: sim, charge: adapter, cfg: cfg,
		base: "http://" + ln.Addr().String(), link: link, pubNC: pubNC, apiKey: key}
	w.eventually("completion listener up", comp.Listening)
	return w
}

// startWorker runs a real worker, charging the simulator, until the test
// ends.
func (w *world) startWorker() {
	w.t.Helper()
	cfg := w.cfg
	cfg.Holder = "w1"
	proc := consumer.NewProcessor(w.store, w.charge, cfg, nil)
	wk, err := consumer.NewWorker(w.nc, proc, cfg, nil, nil, w.gw)
	if err != nil {
		w.t.Fatal(err)
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

// charges is how many times the provider charged m_a's key.
func (w *world) charges(key string) int { return w.sim.ChargesByKey()["m_a:"+key] }

// keyMsgs counts the stream's messages for a key.
func (w *world) keyMsgs(key string) int {
	w.t.Helper()
	s, err := w.js.Stream(w.ctx, w.cfg.Stream.Name)
	if err != nil {
		w.t.Fatal(err)
	}
	info, err := s.Info(w.ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	n := 0
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(w.ctx, seq)
		if err != nil {
			continue // deleted
		}
		if m.Header.Get(stream.HeaderIdempotencyKey) == key {
			n++
		}
	}
	return n
}

// sent is one request a tap saw, and its answer.
type sent struct {
	method, key, body string
	at                time.Time
	status            int // 0: no answer reached the client
	retryAfter        string
	answeredAt        time.Time
}

// tap is the client's transport in a test: it records every request and
// answer, and lets a test act on them (lose an answer after the server
// acted, answer in the server's place, restore a link).
type tap struct {
	next http.RoundTripper
	mu   sync.Mutex
	seen []sent
	// before, when set, may answer a request in the server's place.
	before func(n int, r *http.Request) *http.Response
	// after, when set, may drop the answer (return an error: the
	// connection was lost after the server acted).
	after func(n int, r *http.Request, resp *http.Response) error
}

func (tp *tap) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		b, err := r.GetBody()
		if err == nil {
			body = readAll(b)
		}
	}
	tp.mu.Lock()
	n := len(tp.seen)
	tp.seen = append(tp.seen, sent{method: r.Method, key: r.Header.Get("Idempotency-Key"), body: string(body), at: time.Now()})
	before, after := tp.before, tp.after
	tp.mu.Unlock()
	var resp *http.Response
	var err error
	if before != nil {
		resp = before(n, r)
	}
	if resp == nil {
		if resp, err = tp.next.RoundTrip(r); err != nil {
			return nil, err
		}
	}
	if after != nil {
		if err := after(n, r, resp); err != nil {
			readAll(resp.Body)
			return nil, err
		}
	}
	tp.mu.Lock()
	s := &tp.seen[n]
	s.status, s.retryAfter, s.answeredAt = resp.StatusCode, resp.Header.Get("Retry-After"), time.Now()
	tp.mu.Unlock()
	return resp, nil
}

func (tp *tap) requests() []sent {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return append([]sent(nil), tp.seen...)
}

func readAll(rc io.ReadCloser) []byte {
	defer rc.Close()
	b, _ := io.ReadAll(rc)
	return b
}

// newTap is a tap in front of a fresh transport, closed when the test ends.
func newTap(t *testing.T) *tap {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &tap{next: tr}
}
