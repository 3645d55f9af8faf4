// Package demo runs paydedup end to end in one process and proves, against
// the payment provider's own ledger, that no payment was charged twice or
// lost: several workers (one killed mid-run), a reconciler, the simulator
// with faults on, and a workload with duplicates, declines, key reuses and
// malformed messages.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/audit"
	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/lab/inproc"
	"github.com/paydedup/paydedup/lab/localpg"
	"github.com/paydedup/paydedup/lab/storehook"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/workload"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
	"github.com/paydedup/paydedup/reconciler"
	"github.com/paydedup/paydedup/stream"
)

// Demo timings: short leases and timeouts so a crashed worker's claims are
// taken over within seconds. They nest as the worker requires: provider
// budget (2 × 800 ms + 200 ms) < lease < AckWait.
const (
	demoAttemptTimeout = 800 * time.Millisecond
	demoLease          = 3 * time.Second
	demoAckWait        = 5 * time.Second
)

// Database is the local server's database when DatabaseURL is empty.
const Database = "paydedup_demo"

// Config is one demo run. The command fills it from its flags and the
// environment.
type Config struct {
	DatabaseURL string        // PostgreSQL; "" uses the local server's paydedup_demo database
	AdminURL    string        // the local server tried first when DatabaseURL is empty ("": localpg.AdminURL)
	NATSURL     string        // NATS; "" starts an embedded JetStream server
	Streams     stream.Config // the streams, subjects and durable the run uses
	Payments    int           // distinct payments to publish
	Workers     int           // workers to run (one of them is killed mid-run)
	Seed        uint64        // of the workload and the simulator's faults (0: random)
	Duplicates  float64       // duplicate messages per payment, as a fraction
	Declines    float64       // fraction of payments with a card that is declined
	Timeout     time.Duration // give up (and fail) if the messages have not settled by then
	Verbose     bool          // show the components' logs, not only errors
	DLQKey      []byte        // the workers' dead-letter key
	Out, ErrOut io.Writer     // the report; progress
	Logger      *slog.Logger  // the components' logs go through it
}

// Validate checks the run's figures.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Payments < 1 {
		bad("--payments must be at least 1, got %d", c.Payments)
	}
	if c.Workers < 2 {
		bad("--workers must be at least 2 (one is killed mid-run and the others take over), got %d", c.Workers)
	}
	for _, v := range []struct {
		name string
		val  float64
	}{{"--duplicates", c.Duplicates}, {"--declines", c.Declines}} {
		if math.IsNaN(v.val) || v.val < 0 || v.val > 1 {
			bad("%s must be a fraction between 0 and 1, got %v", v.name, v.val)
		}
	}
	if c.Timeout <= 0 {
		bad("--timeout must be positive, got %v", c.Timeout)
	}
	return errors.Join(errs...)
}

// demoCmd is one run of the demo.
type demoCmd struct{ Config }

// Run runs the demo and prints its report to cfg.Out. It fails if any
// payment was charged twice or lost, or the messages did not settle.
func Run(ctx context.Context, cfg Config) error {
	return (&demoCmd{Config: cfg}).run(ctx)
}

func (d *demoCmd) say(format string, args ...any) {
	fmt.Fprintf(d.ErrOut, "demo: "+format+"\n", args...)
}

func (d *demoCmd) run(ctx context.Context) error {
	if err := d.Validate(); err != nil {
		return err
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, d.Timeout)
	defer cancel()
	seed := d.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}

	natsURL, stopNATS, err := d.startNATS()
	if err != nil {
		return err
	}
	defer stopNATS()
	dbURL, closeDB, err := d.database(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	pool, err := pg.Connect(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer pool.Close()
	if err := localpg.Migrate(ctx, pool, d.quietLogger(nil)); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	store, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		return err
	}

	faults := stripesim.Faults{Latency: 2 * time.Millisecond, Jitter: 10 * time.Millisecond, Rate5xx: 0.02, RateDropAfterCharge: 0.02}
	prov, sim, stopSim, err := inproc.Simulator(ctx, stripesim.Config{Seed: int64(seed >> 1), Faults: faults, Logger: d.quietLogger(nil)}, demoAttemptTimeout)
	if err != nil {
		return err
	}
	defer stopSim()

	nc, err := nats.Connect(natsURL, nats.Name("paydedup-demo"), nats.Timeout(5*time.Second))
	if err != nil {
		return fmt.Errorf("demo: connect to NATS at %s: %w", redact.URLs(natsURL), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cfg := d.workerConfig()
	cfg.Stream.DLQKey = d.DLQKey
	cleanupStreams, dlqStart, err := d.setupStreams(ctx, js, cfg, natsURL)
	if err != nil {
		return err
	}
	defer cleanupStreams()

	run := &demoRun{
		demoCmd: d, cfg: cfg, store: store, js: js, natsURL: natsURL, sim: sim,
		rng:   rand.New(rand.NewPCG(seed, 0x5eed)),
		runID: fmt.Sprintf("%x", uint32(time.Now().UnixNano())^uint32(seed)),
		start: start,
	}
	d.say("run %s: %d payments, %d workers, seed %d, provider faults: %.0f%% charge-then-drop, %.0f%% 5xx, %v-%v latency",
		run.runID, d.Payments, d.Workers, seed, faults.RateDropAfterCharge*100, faults.Rate5xx*100, faults.Latency, faults.Latency+faults.Jitter)
	if err := run.startWorkers(ctx, prov); err != nil {
		return err
	}
	defer run.stopWorkers()
	rec, err := reconciler.New(store, prov, reconciler.Config{
		Interval: 500 * time.Millisecond, Grace: time.Second, SearchLag: time.Second,
		Lease: demoLease, LookupTimeout: time.Second, Logger: d.quietLogger(nil),
	})
	if err != nil {
		return err
	}
	if err := rec.Start(ctx); err != nil {
		return err
	}
	defer rec.Stop()

	settled, runErr := run.drive(ctx)
	run.stopWorkers()
	rec.Stop()
	if errors.Is(ctx.Err(), context.Canceled) {
		return errors.New("demo: interrupted")
	}
	if runErr != nil && !settled {
		d.say("%v", runErr)
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer rcancel()
	rep, err := run.report(rctx, dlqStart, prov)
	if err != nil {
		return err
	}
	// The audit reads the provider's refunds once per charged payment:
	// with the calls' latency that alone took past the report's 30 s at
	// 3000 payments (the audit could not run). The workers are stopped, so
	// the latency is dropped (the 5xx stay: the audit asks again) and the
	// audit has its own budget.
	f := sim.Faults()
	f.Latency, f.Jitter = 0, 0
	if err := sim.SetFaults(f); err != nil {
		return err
	}
	actx, acancel := context.WithTimeout(context.WithoutCancel(ctx), auditTimeout)
	defer acancel()
	auditErr := rep.runAudit(actx, prov, store, start)
	rep.print(d.Out, time.Since(start))
	return errors.Join(rep.verdict(settled, d.Timeout), auditErr)
}

// auditTimeout is the final audit's budget.
const auditTimeout = 2 * time.Minute

// audit is the demo's final verdict beside its own ledger check: `paydedup
// audit` over the run, the provider's own records against the ledger. The
// simulator's faults still apply (the audit asks a failed page again); the
// window starts at the run's start, leaving out earlier demos' rows in the
// same database, and most of the run's intents are made in its first second.
func (rep *demoReport) runAudit(ctx context.Context, prov *stripe.Client, store *dedup.Store, start time.Time) error {
	a, err := audit.Run(ctx, prov, store, audit.Config{Since: start, Until: time.Now().Add(time.Second), Margin: time.Minute})
	if err != nil {
		rep.audit = []string{fmt.Sprintf("the audit could not run: %v", err)}
		return fmt.Errorf("demo: %w", err)
	}
	for _, f := range head(a.Findings) {
		rep.audit = append(rep.audit, fmt.Sprintf("AUDIT %s %s:%s: %s", f.Kind, f.MerchantID, f.IdempotencyKey, f.Detail))
	}
	rep.audit = append(rep.audit, fmt.Sprintf("audited against the provider's own records (paydedup audit): %d intents, %d ledger rows: %s", a.Intents, a.LedgerRows, a.Summary()))
	counts := a.Counts()
	rep.auditRefunds = map[audit.Kind]int{}
	for _, k := range auditRefundKinds {
		rep.auditRefunds[k] = counts[k]
	}
	rep.providerRefunds, rep.bookRefunds = a.Refunds, a.LedgerRefunds
	return a.DriftError()
}

// auditRefundKinds are the audit's refund findings the lifecycle section
// prints, each of which fails the run (DriftError).
var auditRefundKinds = []audit.Kind{audit.DoubleRefund, audit.UnrecordedRefund, audit.MissingRefund, audit.RefundMismatch}

// workerConfig is the consumer configuration of the demo's workers.
func (d *demoCmd) workerConfig() consumer.Config {
	c := consumer.Config{Stream: d.Streams}
	c.Stream.StreamMaxBytes, c.Stream.DLQMaxAge = 256<<20, time.Hour
	c.Lease, c.Stream.AckWait, c.Stream.MaxDeliver = demoLease, demoAckWait, 20
	c.ProviderTry = provider.RetryPolicy{MaxTries: 2, AttemptTimeout: demoAttemptTimeout, InitialInterval: 50 * time.Millisecond, MaxInterval: 200 * time.Millisecond}
	c.RetryBase, c.RetryMax = 100*time.Millisecond, time.Second
	c.DrainTimeout, c.Concurrency, c.FetchBatch = 2*time.Second, 32, 50
	return c.WithDefaults()
}

// startNATS returns the NATS URL to use: NATS_URL, or an embedded server.
func (d *demoCmd) startNATS() (string, func(), error) {
	if d.NATSURL != "" {
		return d.NATSURL, func() {}, nil
	}
	u, stop, err := inproc.NATS()
	if err != nil {
		return "", nil, fmt.Errorf("demo: %w", err)
	}
	d.say("no NATS_URL: started an embedded JetStream server at %s", u)
	return u, stop, nil
}

// database returns the database URL: DATABASE_URL, or the paydedup_demo
// database, created if missing, on the server localpg.Find finds (the
// local one, else a private cluster or a container, which close removes).
func (d *demoCmd) database(ctx context.Context) (u string, close func(), err error) {
	if d.DatabaseURL != "" {
		return d.DatabaseURL, func() {}, nil
	}
	srv, err := localpg.Find(ctx, d.AdminURL)
	if err != nil {
		return "", nil, fmt.Errorf("demo: %w", err)
	}
	u, created, err := localpg.Database(ctx, srv.AdminURL, Database, 16)
	if err != nil {
		srv.Close()
		return "", nil, fmt.Errorf("demo: %w", err)
	}
	d.say("no DATABASE_URL: PostgreSQL is %s", srv.Where)
	if created {
		d.say("created database %s", Database)
	}
	return u, srv.Close, nil
}

// setupStreams creates the demo's streams (or uses existing ones), and
// returns a cleanup that deletes those it created on an external server, and
// the DLQ's last sequence before the run.
func (d *demoCmd) setupStreams(ctx context.Context, js jetstream.JetStream, cfg consumer.Config, natsURL string) (func(), uint64, error) {
	created := []string{}
	for _, name := range []string{cfg.Stream.Name, cfg.Stream.DLQStream, cfg.Stream.AdvisoryStream} {
		if _, err := js.Stream(ctx, name); errors.Is(err, jetstream.ErrStreamNotFound) {
			created = append(created, name)
		}
	}
	if _, _, err := stream.EnsureStreams(ctx, js, cfg.Stream); err != nil {
		return func() {}, 0, fmt.Errorf("demo: %w", err)
	}
	dlq, err := js.Stream(ctx, cfg.Stream.DLQStream)
	if err != nil {
		return func() {}, 0, err
	}
	info, err := dlq.Info(ctx)
	if err != nil {
		return func() {}, 0, err
	}
	cleanup := func() {
		if d.NATSURL == "" {
			return // the embedded server and its store go away
		}
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, name := range created {
			_ = js.DeleteStream(cctx, name)
		}
	}
	return cleanup, info.State.LastSeq, nil
}

// quietLogger is the logger of the demo's components: errors only unless
// --verbose, and nothing at all once muted (a killed worker is silent).
func (d *demoCmd) quietLogger(muted *atomic.Bool) *slog.Logger {
	min := slog.LevelError
	if d.Verbose {
		min = slog.LevelDebug
	}
	return slog.New(&demoLogHandler{inner: d.Logger.Handler(), min: min, muted: muted})
}

type demoLogHandler struct {
	inner slog.Handler
	min   slog.Level
	muted *atomic.Bool
}

func (h *demoLogHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && (h.muted == nil || !h.muted.Load()) && h.inner.Enabled(ctx, l)
}

func (h *demoLogHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.inner.Handle(ctx, r)
}

func (h *demoLogHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &demoLogHandler{inner: h.inner.WithAttrs(as), min: h.min, muted: h.muted}
}

func (h *demoLogHandler) WithGroup(name string) slog.Handler {
	return &demoLogHandler{inner: h.inner.WithGroup(name), min: h.min, muted: h.muted}
}

// ---------------------------------------------------------------------------
// The run

// demoRun is one demo's moving parts and counters.
type demoRun struct {
	*demoCmd
	cfg     consumer.Config
	store   *dedup.Store
	js      jetstream.JetStream
	natsURL string
	sim     *stripesim.Simulator
	rng     *rand.Rand
	runID   string
	start   time.Time

	procs []*demoWorker
	pub   *stream.Publisher

	plan      workload.Phased
	payments  []demoPayment
	flows     []workload.Flow // the lifecycle's, rooted in payments
	published struct {
		early, late, windowed, reuse, malformed int
		ops, opCopies                           int // the lifecycle's operations, and their duplicates
	}
	killedAt time.Duration
	killedIn int64
}

// demoPayment is one distinct valid payment of the workload.
type demoPayment struct {
	ref ledger.KeyRef
	cmd payment.Command
	// canceled: its flow cancels its authorization, so it is never
	// charged; the lifecycle's proof judges it.
	canceled bool
}

// demoWorker is one in-process worker with its own NATS connection.
type demoWorker struct {
	name   string
	nc     *nats.Conn
	store  storehook.Wrapper
	obs    *demoObserver
	muted  atomic.Bool
	cancel context.CancelFunc
	done   chan struct{}
	killed atomic.Bool
}

func (r *demoRun) startWorkers(ctx context.Context, prov *stripe.Client) error {
	for i := range r.Workers {
		w := &demoWorker{name: fmt.Sprintf("demo-%s-worker-%d", r.runID, i+1), obs: &demoObserver{}, done: make(chan struct{})}
		nc, err := nats.Connect(r.natsURL, nats.Name(w.name), nats.Timeout(5*time.Second))
		if err != nil {
			return fmt.Errorf("demo: connect worker to NATS: %w", err)
		}
		w.nc = nc
		// Once killed, every store call fails before reaching Postgres,
		// the refunds', captures' and cancels' too (the wrapper has them
		// as the store has).
		w.store = storehook.Wrap(r.store).Before(storehook.Any, func(context.Context, *storehook.Call) error {
			if w.killed.Load() {
				return errKilled
			}
			return nil
		})
		cfg := r.cfg
		cfg.Holder = w.name
		log := r.quietLogger(&w.muted).With("worker", w.name)
		worker, err := consumer.NewWorker(nc, consumer.NewProcessor(w.store, prov, cfg, log), cfg, log, w.obs, nil)
		if err != nil {
			nc.Close()
			return err
		}
		wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		w.cancel = cancel
		go func() {
			defer close(w.done)
			if err := worker.Run(wctx); err != nil && !w.killed.Load() {
				r.say("%s stopped: %v", w.name, err)
			}
		}()
		r.procs = append(r.procs, w)
	}
	return nil
}

// stopWorkers drains the workers still running and closes their
// connections. It may be called more than once.
func (r *demoRun) stopWorkers() {
	for _, w := range r.procs {
		w.cancel()
	}
	for _, w := range r.procs {
		<-w.done
		w.nc.Close()
	}
}

// kill stops a worker abruptly: from now on every store call fails and its
// NATS connection is closed, so it can neither commit nor ack; its claims
// are abandoned, as in a crash. Its leases expire and, after AckWait,
// JetStream redelivers its messages to the other workers.
func (r *demoRun) kill(w *demoWorker) {
	r.killedIn = w.obs.inFlight.Load()
	w.killed.Store(true)
	w.muted.Store(true)
	w.nc.Close()
	w.cancel() // stop its fetch loop; nothing it does can reach Postgres or NATS
	r.killedAt = time.Since(r.start)
	r.say("killed %s with %d payments in flight: its claims are abandoned, as in a crash; the others take over when its leases expire",
		w.name, r.killedIn)
}

// errKilled is what a killed worker's store calls return.
var errKilled = errors.New("worker killed")

// demoObserver counts one worker's settled messages.
type demoObserver struct {
	consumer.NopObserver
	inFlight, completed, declined, duplicates, deadLettered, retried atomic.Int64
}

func (o *demoObserver) Settled(kind consumer.Kind, act consumer.Action) {
	switch {
	case act.Kind == consumer.DeadLetterTerm:
		o.deadLettered.Add(1)
	case kind == consumer.Completed:
		o.completed.Add(1)
	case kind == consumer.Declined:
		o.declined.Add(1)
	case kind == consumer.Duplicate:
		o.duplicates.Add(1)
	default:
		o.retried.Add(1)
	}
}

func (o *demoObserver) InFlight(delta int) { o.inFlight.Add(int64(delta)) }

// totals sums the workers' counters.
func (r *demoRun) totals() (done, inFlight, dups, dead int64) {
	for _, w := range r.procs {
		done += w.obs.completed.Load() + w.obs.declined.Load()
		if !w.killed.Load() {
			inFlight += w.obs.inFlight.Load()
		}
		dups += w.obs.duplicates.Load()
		dead += w.obs.deadLettered.Load()
	}
	return
}

// ---------------------------------------------------------------------------
// Workload

// drive publishes the workload, kills a worker mid-run, and waits until
// every message is settled. settled is false when the timeout came first.
func (r *demoRun) drive(ctx context.Context) (settled bool, err error) {
	r.plan = workload.PlanPhased(r.rng, workload.PhasedConfig{
		Payments: r.Payments, Duplicates: r.Duplicates, Declines: r.Declines, Prefix: "demo-" + r.runID,
	})
	r.flows = workload.PlanLifecycle(r.rng, &r.plan, lifecycleSets(r.demoCmd.Payments))
	r.payments = make([]demoPayment, len(r.plan.Payments))
	for i, g := range r.plan.Payments {
		r.payments[i] = demoPayment{ref: ledger.KeyRef{MerchantID: g.Cmd.MerchantID, IdempotencyKey: g.Cmd.IdempotencyKey}, cmd: g.Cmd}
	}
	for _, f := range r.flows {
		r.payments[f.Root].canceled = f.Canceled()
	}
	early, late := r.plan.Early, r.plan.Late
	pub, err := stream.NewPublisher(r.js.Conn(), stream.PublisherConfig{})
	if err != nil {
		return false, err
	}
	r.pub = pub
	defer pub.Close() // a no-op once closed below

	// Progress, and the kill once 40% of the payments are done.
	stopTicker := make(chan struct{})
	tickerDone := make(chan struct{})
	killAt := int64(max(1, r.demoCmd.Payments*2/5))
	var killOnce sync.Once
	killed := make(chan struct{})
	go func() {
		defer close(tickerDone)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		poll := time.NewTicker(20 * time.Millisecond)
		defer poll.Stop()
		for {
			select {
			case <-stopTicker:
				return
			case <-ctx.Done():
				return
			case <-poll.C:
				if done, _, _, _ := r.totals(); done >= killAt {
					killOnce.Do(func() { r.kill(r.procs[0]); close(killed) })
				}
			case <-tick.C:
				r.progress(ctx)
			}
		}
	}()
	defer func() {
		close(stopTicker)
		<-tickerDone
	}()

	for _, m := range early {
		if err := pub.Publish(ctx, r.plan.Message(r.cfg.Stream, m)); err != nil {
			return false, fmt.Errorf("publish: %w", err)
		}
		r.count(m)
	}
	if err := r.publishLate(ctx, late); err != nil {
		return false, err
	}
	if err := r.publishLifecycle(ctx); err != nil {
		return false, err
	}
	select {
	case <-killed:
	case <-ctx.Done():
		return false, fmt.Errorf("the workers never completed %d payments: %w", killAt, ctx.Err())
	}
	st := pub.Close()
	r.published.windowed = st.Duplicates
	if st.Failed > 0 {
		r.say("%d messages got no PubAck", st.Failed)
	}
	return r.waitQuiescent(ctx)
}

func (r *demoRun) count(m workload.Planned) {
	switch m.Kind {
	case workload.KindSameID, workload.KindNoID, workload.KindNewID:
		r.published.early++
	case workload.KindLate:
		r.published.late++
	case workload.KindReuse:
		r.published.reuse++
	case workload.KindMalformed:
		r.published.malformed++
	}
}

// publishLate publishes each late message once its payment has completed.
func (r *demoRun) publishLate(ctx context.Context, late []workload.Planned) error {
	for len(late) > 0 {
		refs := make([]ledger.KeyRef, len(late))
		for j, m := range late {
			refs[j] = r.payments[m.I].ref
		}
		recs, err := r.store.GetMany(ctx, refs)
		if err != nil {
			return err
		}
		done := map[ledger.KeyRef]bool{}
		for _, rec := range recs {
			if rec.Status == ledger.StatusCompleted {
				done[ledger.KeyRef{MerchantID: rec.MerchantID, IdempotencyKey: rec.IdempotencyKey}] = true
			}
		}
		rest := late[:0]
		for _, m := range late {
			if !done[r.payments[m.I].ref] {
				rest = append(rest, m)
				continue
			}
			if err := r.pub.Publish(ctx, r.plan.Message(r.cfg.Stream, m)); err != nil {
				return fmt.Errorf("publish: %w", err)
			}
			r.count(m)
		}
		late = rest
		if len(late) > 0 {
			select {
			case <-ctx.Done():
				return fmt.Errorf("%d late duplicates never found their payment completed: %w", len(late), ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

// lifecycleSets is how many sets of the lifecycle's flows a run of n
// payments plans: a few, one more per thousand payments.
func lifecycleSets(n int) int { return 1 + n/1000 }

// publishLifecycle publishes each flow's operations in turn, each once
// what it acts on has settled (the payment authorized or charged, the
// operation before it stored with a final outcome), each with a
// duplicate under another Nats-Msg-Id (it reaches the workers, which
// must not act twice), every other one also with its own id again (the
// stream drops it), and a late copy of the operation before it.
func (r *demoRun) publishLifecycle(ctx context.Context) error {
	next := make([]int, len(r.flows))
	refs := make([]ledger.KeyRef, len(r.flows))
	for i, f := range r.flows {
		refs[i] = f.Ref()
	}
	publish := func(op workload.LifeOp, copies ...string) error {
		for _, c := range copies {
			if err := r.pub.Publish(ctx, workload.OpMessage(r.cfg.Stream, op, c)); err != nil {
				return fmt.Errorf("publish: %w", err)
			}
		}
		r.published.opCopies += len(copies) - 1
		return nil
	}
	for {
		left := 0
		settled, err := r.lifeSettled(ctx, refs, next)
		if err != nil {
			return err
		}
		for i, f := range r.flows {
			if next[i] == len(f.Ops) {
				continue
			}
			left++
			if !settled[i] {
				continue
			}
			op := f.Ops[next[i]]
			copies := []string{"", "retry"}
			if r.published.ops%2 == 0 {
				copies = append(copies, "")
			}
			if err := publish(op, copies...); err != nil {
				return err
			}
			if next[i] > 0 {
				if err := publish(f.Ops[next[i]-1], "late"); err != nil {
					return err
				}
				r.published.opCopies++
			}
			r.published.ops++
			next[i]++
		}
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d flows of the lifecycle never found what they act on settled: %w", left, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// lifeSettled reports, for each flow, whether what its next operation
// acts on has settled: its payment authorized or charged, or the
// operation before it stored with a final outcome.
func (r *demoRun) lifeSettled(ctx context.Context, roots []ledger.KeyRef, next []int) ([]bool, error) {
	pays, err := r.store.PaymentsFor(ctx, roots)
	if err != nil {
		return nil, err
	}
	refunds, err := r.store.RefundsOf(ctx, roots)
	if err != nil {
		return nil, err
	}
	status := map[string]string{}
	for _, p := range pays {
		status[p.MerchantID+":"+p.IdempotencyKey] = p.Status
	}
	for _, rf := range refunds {
		status[rf.MerchantID+":"+rf.IdempotencyKey] = rf.Status
	}
	out := make([]bool, len(r.flows))
	for i, f := range r.flows {
		switch {
		case next[i] == len(f.Ops):
		case next[i] == 0:
			out[i] = status[f.RootKey()] == ledger.PaymentAuthorized || status[f.RootKey()] == ledger.PaymentSucceeded
		default:
			prev := f.Ops[next[i]-1]
			if prev.Cmd.Kind == payment.KindRefund {
				st := status[prev.Key()]
				out[i] = st != "" && st != ledger.RefundPending && st != ledger.RefundUnknown
				continue
			}
			op, err := r.store.GetPaymentOp(ctx, prev.Cmd.MerchantID, prev.Cmd.IdempotencyKey)
			switch {
			case errors.Is(err, ledger.ErrNotFound):
			case err != nil:
				return nil, err
			default:
				out[i] = op.Final()
			}
		}
	}
	return out, nil
}

// waitQuiescent waits until the consumer has nothing pending or unacked and
// no payment of the run is pending in Postgres.
func (r *demoRun) waitQuiescent(ctx context.Context) (bool, error) {
	refs := make([]ledger.KeyRef, len(r.payments))
	for i, p := range r.payments {
		refs[i] = p.ref
	}
	for {
		cs, err := stream.ConsumerState(ctx, r.js, r.cfg.Stream)
		if err == nil && cs.NumPending == 0 && cs.NumAckPending == 0 {
			recs, err := r.store.GetMany(ctx, refs)
			if err == nil && !slices.ContainsFunc(recs, func(rec ledger.Record) bool { return rec.Status == ledger.StatusPending }) {
				return true, nil
			}
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("not settled: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// progress prints one line of progress.
func (r *demoRun) progress(ctx context.Context) {
	done, inFlight, dups, dead := r.totals()
	ps := r.pub.Stats()
	backlog := "?"
	if cs, err := stream.ConsumerState(ctx, r.js, r.cfg.Stream); err == nil {
		backlog = fmt.Sprintf("%d", cs.NumPending+uint64(cs.NumAckPending))
	}
	r.say("%5.1fs  published %d  completed %d/%d  in flight %d  duplicates suppressed %d  dead-lettered %d  backlog %s",
		time.Since(r.start).Seconds(), ps.Sent, done, len(r.payments), inFlight, dups, dead, backlog)
}

// ---------------------------------------------------------------------------
// Report

type demoReport struct {
	// audit is what the final audit printed.
	audit                                                  []string
	payments, duplicates, late, windowed, reuse, malformed int
	keysCharged                                            int
	chargedOnce, declined, deadLetteredValid               int
	double, lost, disagree                                 int
	deadLetters                                            int
	byReason                                               map[string]int
	killedAt                                               time.Duration
	killedIn                                               int64
	lostKeys, doubleKeys, disagreeKeys                     []string
	canceled                                               int // authorizations canceled, by their flow

	// life is the judgement of the lifecycle's flows; opCopies counts the
	// duplicates of their operations published.
	life     workload.LifeTally
	opCopies int
	// auditRefunds counts the audit's refund findings by kind, beside
	// the provider's refunds and the ledger's it compared.
	auditRefunds                 map[audit.Kind]int
	providerRefunds, bookRefunds int
}

// report checks Postgres and the dead letters against the simulator's
// ledger.
func (r *demoRun) report(ctx context.Context, dlqStart uint64, prov *stripe.Client) (*demoReport, error) {
	rep := &demoReport{
		payments: len(r.payments), duplicates: r.published.early + r.published.late, late: r.published.late, windowed: r.published.windowed,
		reuse: r.published.reuse, malformed: r.published.malformed, byReason: map[string]int{},
		killedAt: r.killedAt, killedIn: r.killedIn, opCopies: r.published.opCopies,
	}
	charges := r.sim.ChargesByKey()
	refs := make([]ledger.KeyRef, len(r.payments))
	for i, p := range r.payments {
		refs[i] = p.ref
	}
	recs, err := r.store.GetMany(ctx, refs)
	if err != nil {
		return nil, fmt.Errorf("demo report: %w", err)
	}
	byRef := make(map[ledger.KeyRef]ledger.Record, len(recs))
	for _, rec := range recs {
		byRef[ledger.KeyRef{MerchantID: rec.MerchantID, IdempotencyKey: rec.IdempotencyKey}] = rec
	}
	letters, err := dlq.List(ctx, r.js, r.cfg.Stream, dlq.Filter{})
	if err != nil {
		return nil, fmt.Errorf("demo report: %w", err)
	}
	lettered := map[ledger.KeyRef]string{}
	byKey := map[string][]string{}
	for _, l := range letters {
		if l.Seq <= dlqStart {
			continue
		}
		rep.deadLetters++
		rep.byReason[l.Reason]++
		ref := ledger.KeyRef{MerchantID: l.MerchantID, IdempotencyKey: l.IdempotencyKey}
		lettered[ref] = l.Reason
		byKey[workload.RowKey(ref)] = append(byKey[workload.RowKey(ref)], l.Reason)
	}
	rep.judge(r.payments, charges, byRef, lettered)
	ev, err := r.lifeEvidence(ctx, prov, byKey)
	if err != nil {
		return nil, fmt.Errorf("demo report: %w", err)
	}
	rep.judgeLifecycle(r.flows, ev)
	return rep, nil
}

// lifeEvidence reads what the run left of its flows: the payments' and
// the operations' rows, the provider's refunds and what each payment's
// intent received (the simulator's ledger) and its status (asked of the
// provider, whose faults still apply: a failed read is asked again).
func (r *demoRun) lifeEvidence(ctx context.Context, prov *stripe.Client, letters map[string][]string) (workload.LifeEvidence, error) {
	ev := workload.LifeEvidence{Roots: map[string]workload.LifeRoot{}, Ops: map[string]workload.LifeRow{}, Letters: letters}
	refs := make([]ledger.KeyRef, len(r.flows))
	for i, f := range r.flows {
		refs[i] = f.Ref()
	}
	pays, err := r.store.PaymentsFor(ctx, refs)
	if err != nil {
		return ev, err
	}
	received := map[string]int64{}
	for _, c := range r.sim.Charges() {
		received[c.ID] = c.Amount
	}
	for _, p := range pays {
		root := workload.LifeRoot{Status: p.Status, ChargeID: p.ChargeID, Received: received[p.ChargeID]}
		if p.ChargeID != "" {
			in, err := getIntent(ctx, prov, p.ChargeID)
			if err != nil {
				return ev, err
			}
			root.Intent = in.Status
		}
		ev.Roots[p.MerchantID+":"+p.IdempotencyKey] = root
	}
	refunds, err := r.store.RefundsOf(ctx, refs)
	if err != nil {
		return ev, err
	}
	for _, rf := range refunds {
		ev.Ops[rf.MerchantID+":"+rf.IdempotencyKey] = workload.LifeRow{Found: true, Status: rf.Status, Amount: rf.Amount, RefundID: rf.RefundID}
	}
	for _, f := range r.flows {
		for _, op := range f.Ops {
			if op.Cmd.Kind == payment.KindRefund {
				continue
			}
			o, err := r.store.GetPaymentOp(ctx, op.Cmd.MerchantID, op.Cmd.IdempotencyKey)
			switch {
			case errors.Is(err, ledger.ErrNotFound):
			case err != nil:
				return ev, err
			default:
				ev.Ops[op.Key()] = workload.LifeRow{Found: true, Status: o.Status, Amount: o.AmountReceived}
			}
		}
	}
	for _, rf := range r.sim.Refunds() {
		ev.Refunds = append(ev.Refunds, workload.ProviderRefund{ID: rf.ID, Intent: rf.PaymentIntent, Key: rf.MerchantID + ":" + rf.IdempotencyKey,
			Amount: rf.Amount, Status: rf.Status})
	}
	return ev, nil
}

// getIntent reads intent id, asking again while the simulator's faults
// fail the read.
func getIntent(ctx context.Context, prov *stripe.Client, id string) (provider.Intent, error) {
	var err error
	for range 10 {
		var in provider.Intent
		if in, err = prov.GetIntent(ctx, id); err == nil {
			return in, nil
		}
		select {
		case <-ctx.Done():
			return provider.Intent{}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return provider.Intent{}, fmt.Errorf("get intent %s: %w", id, err)
}

// judge checks each payment's record and dead letters against the
// provider's charges (by "merchant_id:idempotency_key"): a payment not
// completed is lost, unless a dead letter for another reason than bad
// input accounts for it.
func (rep *demoReport) judge(payments []demoPayment, charges map[string]int, byRef map[ledger.KeyRef]ledger.Record, lettered map[ledger.KeyRef]string) {
	rows := make(map[string]workload.Row, len(byRef))
	for ref, rec := range byRef {
		rows[workload.RowKey(ref)] = workload.RowOf(rec)
	}
	var expected []workload.Expected
	for _, p := range payments {
		if p.canceled {
			rep.canceled++
			continue
		}
		expected = append(expected, workload.Expected{Key: workload.RowKey(p.ref), Declines: p.cmd.PaymentMethod == "pm_card_chargeDeclined"})
	}
	t := workload.Check(expected, rows, charges)
	rep.keysCharged, rep.doubleKeys, rep.double = t.KeysCharged, t.Double, len(t.Double)
	rep.chargedOnce, rep.declined = t.ChargedOnce, t.Declined
	rep.disagreeKeys, rep.disagree = t.Disagree, len(t.Disagree)
	unsettled := map[string]string{}
	for _, u := range t.Unsettled {
		key, _, _ := strings.Cut(u, " ")
		unsettled[key] = u
	}
	for _, p := range payments {
		u, ok := unsettled[workload.RowKey(p.ref)]
		switch {
		case !ok:
		case lettered[p.ref] != "" && !payment.IsInputReason(lettered[p.ref]):
			rep.deadLetteredValid++
		default:
			rep.lost++
			rep.lostKeys = append(rep.lostKeys, u)
		}
	}
}

// judgeLifecycle checks the flows' payments and operations against the
// provider's ledger (workload.CheckLifecycle).
func (rep *demoReport) judgeLifecycle(flows []workload.Flow, ev workload.LifeEvidence) {
	rep.life = workload.CheckLifecycle(flows, ev)
}

// verdict fails a run that charged a key twice, lost a payment, disagrees
// with the provider, refunded a refund twice or past what was captured,
// ended an operation otherwise than planned, or did not settle.
func (rep *demoReport) verdict(settled bool, timeout time.Duration) error {
	switch {
	case rep.double > 0 || rep.lost > 0 || rep.disagree > 0:
		return fmt.Errorf("demo: %d double charges, %d lost payments, %d outcomes disagreeing with the provider", rep.double, rep.lost, rep.disagree)
	case !rep.life.OK():
		return fmt.Errorf("demo: %d refunds made twice, %d payments refunded past what was captured, %d operations not as planned or disagreeing with the provider",
			len(rep.life.DoubleRefunds), len(rep.life.OverRefunded), len(rep.life.Wrong))
	case !settled:
		return fmt.Errorf("demo: the messages did not settle within --timeout %v", timeout)
	}
	return nil
}

func (rep *demoReport) print(out io.Writer, elapsed time.Duration) {
	say := func(format string, args ...any) { fmt.Fprintf(out, "demo: "+format+"\n", args...) }
	say("published %d payments, %d duplicates (%d dropped by the stream's duplicate window, %d reached the workers; %d of them after the payment completed), %d key reuses with another amount, %d malformed messages",
		rep.payments, rep.duplicates, rep.windowed, rep.duplicates-rep.windowed, rep.late, rep.reuse, rep.malformed)
	if rep.killedAt > 0 {
		say("one worker was killed at %.1f s with %d payments in flight; the others took its claims over", rep.killedAt.Seconds(), rep.killedIn)
	}
	reasons := make([]string, 0, len(rep.byReason))
	for k := range rep.byReason {
		reasons = append(reasons, k)
	}
	slices.Sort(reasons)
	var parts []string
	for _, k := range reasons {
		parts = append(parts, fmt.Sprintf("%s %d", k, rep.byReason[k]))
	}
	if len(parts) > 0 {
		say("dead letters by reason: %s", strings.Join(parts, ", "))
	}
	if rep.deadLetteredValid > 0 {
		say("%d valid payments were dead-lettered (e.g. max_deliveries) and can be replayed with paydedup dlq replay", rep.deadLetteredValid)
	}
	for _, k := range head(rep.doubleKeys) {
		say("DOUBLE CHARGE: %s", k)
	}
	for _, k := range head(rep.lostKeys) {
		say("LOST: %s", k)
	}
	for _, k := range head(rep.disagreeKeys) {
		say("DISAGREES WITH THE PROVIDER: %s", k)
	}
	say("checked against the provider's ledger: %d keys charged, %d of them more than once", rep.keysCharged, rep.double)
	rep.printLifecycle(say)
	for _, l := range rep.audit {
		say("%s", l)
	}
	fmt.Fprintf(out, "demo: %d payments, %d duplicates, %d charged once, %d declined, %d canceled, %d double charges, %d lost, %d double refunds, %d dead letters, %.1f s\n",
		rep.payments, rep.duplicates, rep.chargedOnce, rep.declined, rep.canceled, rep.double, rep.lost, len(rep.life.DoubleRefunds), rep.deadLetters, elapsed.Seconds())
}

// printLifecycle prints the lifecycle's section: the operations by kind
// and outcome, and their proof against the provider's ledger and the
// audit's refund findings.
func (rep *demoReport) printLifecycle(say func(string, ...any)) {
	l := rep.life
	if l.Flows == 0 {
		return
	}
	var kinds []string
	for _, kind := range []string{payment.KindAuthorize, payment.KindCapture, payment.KindCancel, payment.KindRefund} {
		outs := l.Outcomes[kind]
		names := make([]string, 0, len(outs))
		for o := range outs {
			names = append(names, o)
		}
		slices.Sort(names)
		var parts []string
		for _, o := range names {
			parts = append(parts, fmt.Sprintf("%d %s", outs[o], o))
		}
		if len(parts) > 0 {
			kinds = append(kinds, kind+" "+strings.Join(parts, ", "))
		}
	}
	say("lifecycle: %d flows (%s), %d operations published after what they act on settled, %d duplicates of them",
		l.Flows, strings.Join(workload.Flows, "; "), l.Ops, rep.opCopies)
	say("lifecycle outcomes (authorize: where its payment ended): %s", strings.Join(kinds, "; "))
	for _, k := range head(l.DoubleRefunds) {
		say("REFUNDED TWICE: %s", k)
	}
	for _, k := range head(l.OverRefunded) {
		say("REFUNDED PAST WHAT WAS CAPTURED: %s", k)
	}
	for _, k := range head(l.Wrong) {
		say("LIFECYCLE: %s", k)
	}
	audited := "the audit did not run"
	if rep.auditRefunds != nil {
		var found []string
		for _, k := range auditRefundKinds {
			found = append(found, fmt.Sprintf("%d %s", rep.auditRefunds[k], k))
		}
		audited = fmt.Sprintf("audit of %d provider refunds against %d ledger refunds: %s", rep.providerRefunds, rep.bookRefunds, strings.Join(found, ", "))
	}
	say("lifecycle checked against the provider's ledger: %d refunds made twice, %d payments refunded past what was captured, %d operations not as planned or disagreeing with the provider; %s",
		len(l.DoubleRefunds), len(l.OverRefunded), len(l.Wrong), audited)
}

func head[T any](s []T) []T { return s[:min(len(s), 10)] }
