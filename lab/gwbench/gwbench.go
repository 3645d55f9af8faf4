// Package gwbench measures the HTTP gateway: it starts "paydedup gateway"
// in process over real PostgreSQL and NATS JetStream, drives it with
// concurrent HTTP/1.1 keep-alive clients (unique keys, plus a share of
// retries with the same key and of concurrent duplicates), and checks at
// the end that every accepted payment is in the intake and on the stream
// exactly once. Without Worker no worker runs: it measures what the door
// takes in. With Worker the worker runs in process too, charging the
// in-process Stripe simulator, and the bench also measures POST→charged
// (the key's completed record) and counts double charges and lost
// payments.
package gwbench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/valyala/fasthttp"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/cpusplit"
	"github.com/paydedup/paydedup/lab/inproc"
	"github.com/paydedup/paydedup/lab/localpg"
	"github.com/paydedup/paydedup/lab/procstat"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/stream"
)

// Database is the local server's database when DatabaseURL is empty (the
// worker bench's).
const Database = "paydedup_bench"

// Config is one gateway bench run.
type Config struct {
	DatabaseURL string // PostgreSQL; "" uses the paydedup_bench database on the server localpg.Find finds
	AdminURL    string // the local server Find tries first
	NATSURL     string // NATS; "" starts an embedded JetStream server
	Connections int    // concurrent keep-alive clients
	Requests    int    // distinct payments
	Retries     float64
	Duplicates  float64
	Merchants   int
	PoolSize    int // the gateway's pool (pool_max_conns)
	BatchSize   int
	BatchWindow time.Duration
	Flushers    int
	JSON        bool
	Timeout     time.Duration
	CPUProfile  string
	Worker      bool // run the worker in process too, against the simulator
	DLQKey      []byte
	Out, ErrOut io.Writer
}

// Validate checks the run's figures and choices, naming the flag.
func (c Config) Validate() error {
	var errs []error
	if c.Connections < 1 || c.Connections > 10000 {
		errs = append(errs, fmt.Errorf("--connections must be within 1..10000, got %d", c.Connections))
	}
	if c.Requests < 1 {
		errs = append(errs, fmt.Errorf("--requests must be at least 1, got %d", c.Requests))
	}
	if c.Retries < 0 || c.Retries > 1 || c.Duplicates < 0 || c.Duplicates > 1 {
		errs = append(errs, fmt.Errorf("--retries and --duplicates must be within 0..1, got %v and %v", c.Retries, c.Duplicates))
	}
	if c.Merchants < 1 || c.Merchants > 1000 {
		errs = append(errs, fmt.Errorf("--merchants must be within 1..1000, got %d", c.Merchants))
	}
	if c.PoolSize < 1 || c.PoolSize > 1000 {
		errs = append(errs, fmt.Errorf("--pool-size must be within 1..1000, got %d", c.PoolSize))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("--timeout must be positive, got %v", c.Timeout))
	}
	return errors.Join(errs...)
}

// Result is the run's figures; the JSON report.
type Result struct {
	Connections            int     `json:"connections"`
	Requests               int     `json:"requests"` // POSTs sent, retries and duplicates included
	Seconds                float64 `json:"seconds"`
	RequestsPerSec         float64 `json:"requests_per_sec"`
	AcceptedPerSec         float64 `json:"accepted_per_sec"`
	Accepted               int     `json:"accepted"`
	Replayed               int     `json:"replayed"`
	Conflicts              int     `json:"conflicts"`
	Mismatches             int     `json:"mismatches"`
	Shed                   int     `json:"shed"`
	Errors                 int     `json:"errors"`
	P50MS                  float64 `json:"p50_ms"`
	P99MS                  float64 `json:"p99_ms"`
	PGRoundTripsPerRequest float64 `json:"pg_round_trips_per_request"`
	CPUMSPerRequest        float64 `json:"cpu_ms_per_request"` // this process: the clients, the gateway and an embedded NATS server
	// CPU time per POST over the load, in µs, split as the worker bench's
	// (lab/cpusplit): the PostgreSQL backends serving the
	// gateway's pool (-1 when the server is not on this machine), and this
	// process's time split into the HTTP clients, the embedded NATS server
	// (0 with NATS_URL) and the rest, the gateway's (an upper bound: it has
	// the runtime's background GC).
	PGCPUUSPerRequest      float64 `json:"pg_cpu_us_per_request"`
	PGBackends             int     `json:"pg_backends"`
	GatewayCPUUSPerRequest float64 `json:"gateway_cpu_us_per_request"`
	ClientCPUUSPerRequest  float64 `json:"client_cpu_us_per_request"`
	NATSCPUUSPerRequest    float64 `json:"nats_cpu_us_per_request"`
	AllocsPerRequest       float64 `json:"process_allocs_per_request"`
	RSSMB                  float64 `json:"rss_mb"`
	OnStreamOnce           bool    `json:"on_stream_exactly_once"`
	Missing                int     `json:"missing"`    // accepted, not on the stream or not published in the intake
	Duplicated             int     `json:"duplicated"` // on the stream more than once
	Unexpected             int     `json:"unexpected"` // on the stream, never accepted
	// Charged is set with Worker.
	Charged *Charged `json:"charged,omitempty"`
}

// Run runs the bench and prints its report to cfg.Out. It fails when an
// accepted payment is missing from the intake or the stream, or is on the
// stream twice.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	say := func(format string, args ...any) { fmt.Fprintf(cfg.ErrOut, "bench gateway: "+format+"\n", args...) }

	natsURL := cfg.NATSURL
	var err error
	if natsURL == "" {
		var u string
		var stop func()
		// Under its label, so that its CPU is told apart from the gateway's.
		parts.Do(ctx, partNATS, func(context.Context) { u, stop, err = inproc.NATS() })
		if err != nil {
			return fmt.Errorf("bench gateway: %w", err)
		}
		defer stop()
		natsURL = u
		say("no NATS_URL: embedded JetStream server at %s", u)
	}
	dbURL := cfg.DatabaseURL
	if dbURL == "" {
		srv, err := localpg.Find(ctx, cfg.AdminURL)
		if err != nil {
			return fmt.Errorf("bench gateway: %w", err)
		}
		defer srv.Close()
		say("no DATABASE_URL: PostgreSQL is %s", srv.Where)
		var u string
		u, _, err = localpg.Database(ctx, srv.AdminURL, Database, cfg.PoolSize)
		if err != nil {
			return fmt.Errorf("bench gateway: %w", err)
		}
		dbURL = u
	}
	nc, err := nats.Connect(natsURL, nats.Name("paydedup-bench-gateway"))
	if err != nil {
		return fmt.Errorf("bench gateway: connect to NATS: %w", err)
	}
	defer nc.Close()

	say("%d payments over %d connections", cfg.Requests, cfg.Connections)
	r, err := runOnce(ctx, cfg, dbURL, nc)
	if err != nil {
		return fmt.Errorf("bench gateway: %w", err)
	}
	say("%.0f accepted/s, p50 %.1f ms, p99 %.1f ms, %.2f round trips per request; CPU per request: PostgreSQL backends %s, gateway %.0f µs, HTTP clients %.0f µs, NATS server %.0f µs",
		r.AcceptedPerSec, r.P50MS, r.P99MS, r.PGRoundTripsPerRequest, cpusplit.PGFigure(r.PGCPUUSPerRequest), r.GatewayCPUUSPerRequest, r.ClientCPUUSPerRequest, r.NATSCPUUSPerRequest)
	if c := r.Charged; c != nil {
		say("%d charged, %.0f charged/s, POST→charged p50 %.1f ms, p99 %.1f ms, %d double, %d lost",
			c.Completed, c.PerSec, c.P50MS, c.P99MS, c.DoubleCharges, c.Lost)
	}
	if cfg.JSON {
		b, _ := json.Marshal(r)
		fmt.Fprintln(cfg.Out, string(b))
	} else {
		fmt.Fprintf(cfg.Out, "%8.0f accepted/s  %8.0f requests/s  p50 %6.1f ms  p99 %6.1f ms  %5.2f pg round trips/request  %5.2f ms CPU/request  rss %4.0f MB  exactly once: %v\n",
			r.AcceptedPerSec, r.RequestsPerSec, r.P50MS, r.P99MS, r.PGRoundTripsPerRequest, r.CPUMSPerRequest, r.RSSMB, r.OnStreamOnce)
		fmt.Fprintf(cfg.Out, "CPU per request: PostgreSQL backends %s, gateway %.0f µs, HTTP clients %.0f µs, NATS server %.0f µs (%.0f allocations)\n",
			cpusplit.PGFigure(r.PGCPUUSPerRequest), r.GatewayCPUUSPerRequest, r.ClientCPUUSPerRequest, r.NATSCPUUSPerRequest, r.AllocsPerRequest)
		if c := r.Charged; c != nil {
			fmt.Fprintf(cfg.Out, "%8.0f charged/s   POST→charged p50 %6.1f ms  p99 %6.1f ms  double %d  lost %d\n",
				c.PerSec, c.P50MS, c.P99MS, c.DoubleCharges, c.Lost)
		}
	}
	var errs []error
	if !r.OnStreamOnce {
		errs = append(errs, fmt.Errorf("%d accepted payments missing, %d on the stream twice, %d on the stream but never accepted",
			r.Missing, r.Duplicated, r.Unexpected))
	}
	if c := r.Charged; c != nil && (c.DoubleCharges > 0 || c.Lost > 0) {
		errs = append(errs, fmt.Errorf("%d double charges, %d lost", c.DoubleCharges, c.Lost))
	}
	return errors.Join(errs...)
}

// phase is the run's world: schema, streams, gateway.
type phase struct {
	cfg     Config
	gwStore *pgstore.Store
	js      jetstream.JetStream
	scfg    stream.Config
	addr    string
	apiKeys []string                             // one per merchant
	rt      atomic.Int64                         // PostgreSQL round trips
	pids    func(context.Context) ([]int, error) // the backends of the gateway's pool
	records *dedup.Store
	sim     *stripesim.Simulator // with Worker
}

func runOnce(ctx context.Context, cfg Config, dbURL string, nc *nats.Conn) (Result, error) {
	suffix := procstat.RunSuffix()
	p := &phase{cfg: cfg}
	schemaURL, dropSchema, err := localpg.FreshSchema(ctx, dbURL, "gwbench_"+suffix)
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = dropSchema() }()
	// The pool's backends are found by this name to read their CPU time.
	appName := "paydedup-gwbench-" + suffix
	appURL, err := localpg.WithAppName(schemaURL, appName)
	if err != nil {
		return Result{}, err
	}
	pool, err := pg.Connect(ctx, appURL, pg.WithMaxConns(cfg.PoolSize), pg.WithRoundTripCounter(&p.rt))
	if err != nil {
		return Result{}, err
	}
	defer pool.Close()
	p.pids = func(ctx context.Context) ([]int, error) { return localpg.BackendPIDs(ctx, pool, appName) }
	if err := localpg.Migrate(ctx, pool, nil); err != nil {
		return Result{}, err
	}
	records, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		return Result{}, err
	}
	p.records = records
	if p.gwStore, err = pgstore.New(pool, pgstore.Config{Records: records}); err != nil {
		return Result{}, err
	}
	for i := range cfg.Merchants {
		key, _, err := p.gwStore.CreateAPIKey(ctx, fmt.Sprintf("m_bench%03d", i), "bench")
		if err != nil {
			return Result{}, err
		}
		p.apiKeys = append(p.apiKeys, key)
	}
	comp, err := pgstore.NewListener(pool, pgstore.ListenerConfig{})
	if err != nil {
		return Result{}, err
	}
	compCtx, stopComp := context.WithCancel(context.WithoutCancel(ctx))
	var bg sync.WaitGroup
	bg.Go(func() { _ = comp.Run(compCtx) })
	defer func() { stopComp(); bg.Wait() }()

	if p.js, err = jetstream.New(nc); err != nil {
		return Result{}, err
	}
	name := "GWBENCH_" + strings.ToUpper(suffix)
	p.scfg = stream.Config{Name: name, SubjectPrefix: "gwbench." + suffix + ".requests", DLQStream: name + "_DLQ",
		DLQPrefix: "gwbench." + suffix + ".dlq", Durable: "paydedup-gwbench", DLQMaxAge: time.Hour,
		DLQKey: cfg.DLQKey}
	p.scfg = p.scfg.WithDefaults()
	if _, _, err := stream.EnsureStreams(ctx, p.js, p.scfg); err != nil {
		return Result{}, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, s := range []string{p.scfg.Name, p.scfg.DLQStream, p.scfg.AdvisoryStream} {
			_ = p.js.DeleteStream(cctx, s)
		}
	}()
	if cfg.Worker {
		stop, err := p.startWorker(ctx, nc, records, suffix)
		if err != nil {
			return Result{}, err
		}
		defer stop()
	}
	pub, err := stream.NewCommandPublisher(nc, p.scfg, 0)
	if err != nil {
		return Result{}, err
	}
	gw, err := gateway.New(records, p.gwStore, comp, pub, gateway.Config{
		BatchSize: cfg.BatchSize, BatchWindow: cfg.BatchWindow, Flushers: cfg.Flushers, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return Result{}, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Result{}, err
	}
	p.addr = ln.Addr().String()
	serveCtx, stopServe := context.WithCancel(context.WithoutCancel(ctx))
	served := make(chan error, 1)
	go func() { served <- gw.Serve(serveCtx, ln) }()
	var stopOnce sync.Once
	stop := func() { stopOnce.Do(func() { stopServe(); <-served }) }
	defer stop()
	for !comp.Listening() {
		select {
		case <-ctx.Done():
			return Result{}, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return p.drive(ctx, suffix, stop)
}

// outcome of one POST.
type outcome struct {
	key     int
	status  int
	replay  bool
	start   time.Time
	latency time.Duration
}

// drive sends the load and checks the result; stop stops the gateway,
// once the load's figures are taken and before the check.
func (p *phase) drive(ctx context.Context, suffix string, stop func()) (Result, error) {
	cfg := p.cfg
	keyOf := func(i int) string { return fmt.Sprintf("gwb-%s-%08d", suffix, i) }
	body := []byte(`{"amount":1999,"currency":"usd","payment_method":"pm_card_visa","description":"bench"}`)
	post := func(c *client, i int) outcome {
		c.req.Header.Set("Authorization", "Bearer "+p.apiKeys[i%len(p.apiKeys)])
		c.req.Header.Set("Idempotency-Key", keyOf(i))
		start := time.Now()
		err := c.do(p.addr, start.Add(requestTimeout))
		o := outcome{key: i, start: start, latency: time.Since(start)}
		if err != nil {
			return o
		}
		o.status = c.resp.StatusCode()
		o.replay = string(c.resp.Header.Peek(gateway.HeaderIdempotentReplay)) == "true"
		return o
	}
	newClient := func() *client {
		c := &client{}
		c.req.Header.SetMethod(http.MethodPost)
		c.req.SetRequestURI("/v1/payments")
		c.req.Header.SetHost(p.addr)
		c.req.Header.SetContentType("application/json")
		c.req.SetBody(body)
		return c
	}

	meter, err := parts.Start(ctx, p.pids, cfg.CPUProfile)
	if err != nil {
		return Result{}, err
	}
	metering := true
	defer func() {
		if metering {
			meter.Abort()
		}
	}()
	var next atomic.Int64
	outs := make([][]outcome, cfg.Connections)
	p.rt.Store(0)
	start := time.Now()
	var wg sync.WaitGroup
	for c := range cfg.Connections {
		// Under the clients' label, as are the transport's goroutines they start.
		wg.Go(func() {
			parts.Do(ctx, partClient, func(ctx context.Context) {
				rng := mrand.New(mrand.NewPCG(uint64(c), 42))
				cl, twinCl := newClient(), newClient()
				defer cl.close()
				defer twinCl.close()
				for ctx.Err() == nil {
					i := int(next.Add(1)) - 1
					if i >= cfg.Requests {
						return
					}
					if rng.Float64() < cfg.Duplicates {
						// Two concurrent first requests for one key.
						twin := make(chan outcome, 1)
						go func() { twin <- post(twinCl, i) }()
						outs[c] = append(outs[c], post(cl, i), <-twin)
					} else {
						outs[c] = append(outs[c], post(cl, i))
					}
					if rng.Float64() < cfg.Retries {
						outs[c] = append(outs[c], post(cl, i)) // a client's retry
					}
				}
			})
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	trips := p.rt.Load()
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("the load did not finish within --timeout: %w", err)
	}
	sent := 0
	for _, os := range outs {
		sent += len(os)
	}
	cpu, err := meter.Stop(ctx, sent)
	metering = false
	if err != nil {
		return Result{}, err
	}

	r := Result{Connections: cfg.Connections, Seconds: elapsed.Seconds(), RSSMB: round2(procstat.PeakRSSMB())}
	var lat []time.Duration
	accepted := map[string]bool{}
	posted := map[string]time.Time{} // the start of each accepted POST
	for _, os := range outs {
		for _, o := range os {
			r.Requests++
			lat = append(lat, o.latency)
			switch {
			case o.status == http.StatusAccepted:
				r.Accepted++
				accepted[keyOf(o.key)] = true
				posted[keyOf(o.key)] = o.start
			case o.replay:
				r.Replayed++
			case o.status == http.StatusConflict:
				r.Conflicts++
			case o.status == http.StatusUnprocessableEntity:
				r.Mismatches++
			case o.status == http.StatusTooManyRequests || o.status == http.StatusServiceUnavailable:
				r.Shed++
			default:
				r.Errors++
			}
		}
	}
	r.P50MS, r.P99MS = quantile(lat, 0.50), quantile(lat, 0.99)
	r.RequestsPerSec = float64(r.Requests) / elapsed.Seconds()
	r.AcceptedPerSec = float64(r.Accepted) / elapsed.Seconds()
	r.PGRoundTripsPerRequest = round2(float64(trips) / float64(r.Requests))
	r.CPUMSPerRequest = round2(cpu.ProcessUS / 1000)
	r.PGCPUUSPerRequest, r.PGBackends = math.Round(cpu.PGUS), cpu.PGBackends
	r.GatewayCPUUSPerRequest, r.AllocsPerRequest = math.Round(cpu.RestUS), math.Round(cpu.Allocs)
	r.ClientCPUUSPerRequest, r.NATSCPUUSPerRequest = math.Round(cpu.Parts[partClient]), math.Round(cpu.Parts[partNATS])
	// A batch answers 202 before its publish mark commits; once the gateway
	// has stopped, every flush, its mark included, has ended.
	stop()
	if err := p.check(ctx, accepted, &r); err != nil {
		return Result{}, err
	}
	if cfg.Worker {
		c, err := p.charged(ctx, p.records, posted, p.merchantOf)
		if err != nil {
			return Result{}, err
		}
		r.Charged = c
	}
	return r, nil
}

// requestTimeout bounds one POST, its connection's dial included.
const requestTimeout = 30 * time.Second

// client is one of the load's keep-alive HTTP/1.1 connections: fasthttp's
// request and response, reused, written to and read from a connection of
// its own, so the load costs the process less CPU than net/http's client
// would (the gateway's share is the measurement). Not safe for concurrent
// use: a concurrent duplicate goes through a second client.
type client struct {
	conn net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	req  fasthttp.Request
	resp fasthttp.Response
}

// do sends the request and reads the whole response by deadline, dialing
// first when the connection is closed. On an error the connection is
// closed, and the next call dials again.
func (c *client) do(addr string, deadline time.Time) error {
	if c.conn == nil {
		conn, err := net.DialTimeout("tcp", addr, time.Until(deadline))
		if err != nil {
			return err
		}
		c.conn, c.br, c.bw = conn, bufio.NewReader(conn), bufio.NewWriter(conn)
	}
	err := c.conn.SetDeadline(deadline)
	if err == nil {
		err = c.req.Write(c.bw)
	}
	if err == nil {
		err = c.bw.Flush()
	}
	if err == nil {
		err = c.resp.Read(c.br)
	}
	if err != nil || c.resp.ConnectionClose() {
		c.close()
	}
	return err
}

func (c *client) close() {
	if c.conn != nil {
		_ = c.conn.Close()
		c.conn = nil
	}
}

// check compares the accepted keys with the intake and the stream: each
// accepted key published in the intake and on the stream exactly once,
// nothing else on the stream.
func (p *phase) check(ctx context.Context, accepted map[string]bool, r *Result) error {
	var reqs []ledger.ClaimRequest
	for k := range accepted {
		reqs = append(reqs, ledger.ClaimRequest{MerchantID: p.merchantOf(k), IdempotencyKey: k})
	}
	published := 0
	for start := 0; start < len(reqs); start += 5000 {
		found, err := p.gwStore.GetIntakes(ctx, reqs[start:min(start+5000, len(reqs))])
		if err != nil {
			return err
		}
		for _, in := range found {
			if in.Published() {
				published++
			}
		}
	}
	r.Missing = len(accepted) - published

	s, err := p.js.Stream(ctx, p.scfg.Name)
	if err != nil {
		return err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return err
	}
	seen := map[string]int{}
	if n := info.State.Msgs; n > 0 {
		cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
		if err != nil {
			return err
		}
		for got := uint64(0); got < n; {
			batch, err := cons.FetchNoWait(1000)
			if err != nil {
				return err
			}
			for m := range batch.Messages() {
				got++
				seen[m.Headers().Get(stream.HeaderIdempotencyKey)]++
			}
			if err := batch.Error(); err != nil {
				return err
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	for k := range accepted {
		switch seen[k] {
		case 0:
			r.Missing++
		case 1:
		default:
			r.Duplicated++
		}
	}
	for k := range seen {
		if !accepted[k] {
			r.Unexpected++
		}
	}
	r.OnStreamOnce = r.Missing == 0 && r.Duplicated == 0 && r.Unexpected == 0
	return nil
}

// merchantOf is the merchant a bench key was posted for.
func (p *phase) merchantOf(key string) string {
	var n int
	_, _ = fmt.Sscanf(key[strings.LastIndexByte(key, '-')+1:], "%d", &n)
	return fmt.Sprintf("m_bench%03d", n%len(p.apiKeys))
}

// Charged is the end to end figures of a run with the worker: from each
// accepted POST's start to its key's completed record.
type Charged struct {
	Completed     int     `json:"completed"`
	PerSec        float64 `json:"charged_per_sec"` // completed / (last completion - first POST)
	P50MS         float64 `json:"p50_ms"`
	P99MS         float64 `json:"p99_ms"`
	DoubleCharges int     `json:"double_charges"` // keys the provider charged more than once
	Lost          int     `json:"lost"`           // accepted, never completed or not charged exactly once
}

// startWorker runs the worker on the phase's stream, charging an
// in-process simulator, until the returned stop is called.
func (p *phase) startWorker(ctx context.Context, nc *nats.Conn, records *dedup.Store, suffix string) (func(), error) {
	p.sim = stripesim.New(stripesim.Config{})
	wcfg := consumer.Config{Stream: p.scfg, Holder: "gwbench-" + suffix}
	wcfg.Stream.MaxAckPending = 20000
	wcfg = wcfg.WithDefaults()
	proc := consumer.NewProcessor(records, p.sim.Client("sk_test_paydedup_gwbench"), wcfg, nil)
	w, err := consumer.NewWorker(nc, proc, wcfg, nil, nil, p.gwStore)
	if err != nil {
		return nil, err
	}
	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	return func() { stop(); <-done }, nil
}

// charged waits until every accepted key has a completed record (or ctx
// ends) and measures POST→charged against the POSTs' starts.
func (p *phase) charged(ctx context.Context, records *dedup.Store, posted map[string]time.Time, merchantOf func(string) string) (*Charged, error) {
	c := &Charged{}
	var refs []ledger.KeyRef
	var first time.Time
	for k, t := range posted {
		refs = append(refs, ledger.KeyRef{MerchantID: merchantOf(k), IdempotencyKey: k})
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	done := map[string]time.Time{}
	for len(done) < len(refs) && ctx.Err() == nil {
		var open []ledger.KeyRef
		for _, r := range refs {
			if _, ok := done[r.IdempotencyKey]; !ok {
				open = append(open, r)
			}
		}
		for start := 0; start < len(open); start += 5000 {
			recs, err := records.GetMany(ctx, open[start:min(start+5000, len(open))])
			if err != nil {
				return nil, err
			}
			for _, r := range recs {
				if r.Status == ledger.StatusCompleted {
					done[r.IdempotencyKey] = r.CompletedAt
				}
			}
		}
		if len(done) < len(refs) {
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	var lat []time.Duration
	var last time.Time
	for k, at := range done {
		lat = append(lat, at.Sub(posted[k]))
		if at.After(last) {
			last = at
		}
	}
	c.Completed = len(done)
	c.P50MS, c.P99MS = quantile(lat, 0.50), quantile(lat, 0.99)
	if len(done) > 0 {
		c.PerSec = float64(len(done)) / last.Sub(first).Seconds()
	}
	c.DoubleCharges, c.Lost = judge(refs, done, p.sim.ChargesByKey())
	return c, nil
}

// judge counts, of the accepted keys, those the provider charged more than
// once (charges are by "merchant_id:idempotency_key") and those not
// completed or not charged exactly once.
func judge(accepted []ledger.KeyRef, completed map[string]time.Time, charges map[string]int) (double, lost int) {
	for _, r := range accepted {
		n := charges[r.MerchantID+":"+r.IdempotencyKey]
		if n > 1 {
			double++
		}
		if _, ok := completed[r.IdempotencyKey]; !ok || n != 1 {
			lost++
		}
	}
	return double, lost
}

// quantile is the f quantile of lat in milliseconds; it sorts lat.
func quantile(lat []time.Duration, f float64) float64 {
	if len(lat) == 0 {
		return 0
	}
	slices.Sort(lat)
	return float64(lat[min(len(lat)-1, int(f*float64(len(lat))))].Microseconds()) / 1000
}

func round2(f float64) float64 { return math.Round(100*f) / 100 }

// How the bench splits its process's CPU time (lab/cpusplit): the
// embedded NATS server and the load's HTTP clients (their goroutines, or a
// frame of fasthttp's request writing and response parsing) apart from
// the gateway, which has the rest.
const (
	partClient = "http_client"
	partNATS   = "nats_server"
)

var parts = cpusplit.New(
	cpusplit.Part{Name: partNATS, Packages: []string{"github.com/nats-io/nats-server/"}},
	cpusplit.Part{Name: partClient, Packages: []string{"github.com/valyala/fasthttp."}},
)
