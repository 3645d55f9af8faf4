package main

import (
	"context"
	"encoding/json"
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

	"github.com/paydedup/paydedup/internal/pg"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/ledgercheck"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/reconciler"
)

// Demo timings: short leases and timeouts so a crashed worker's claims are
// taken over within seconds. They nest as the worker requires: provider
// budget (2 × 800 ms + 200 ms) < lease < AckWait.
const (
	demoAttemptTimeout = 800 * time.Millisecond
	demoLease          = 3 * time.Second
	demoAckWait        = 5 * time.Second
	demoDatabase       = "paydedup_demo"
)

type demoCmd struct {
	app      *app
	localPG  string // the server tried when DATABASE_URL is empty
	dbURL    string
	natsURL  string
	streams  streamFlags
	payments int
	workers  int
	seed     uint64
	dups     float64
	declines float64
	timeout  time.Duration
	verbose  bool
}

func newDemoCmd(a *app) *cobra.Command {
	d := &demoCmd{app: a, localPG: localPostgres}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the whole system on this machine and prove no payment is charged twice or lost",
		Long: `demo runs paydedup end to end in one process and checks the result against the
payment provider's own ledger:

  - NATS: NATS_URL, or else an embedded JetStream server (temporary store);
  - PostgreSQL: DATABASE_URL, or else the local server at 127.0.0.1:5432
    (database paydedup_demo, created if missing), migrated;
  - the Stripe-compatible simulator with faults on: charges whose connection
    drops after charging, 5xx answers, latency;
  - several workers (each its own lease holder and NATS connection) and a
    reconciler;
  - a few thousand payments with duplicates (quick double publishes that the
    stream drops, retries with other or no Nats-Msg-Id, late retries after the
    payment completed), declined cards, a reused key with another amount and
    malformed messages;
  - mid-run, one worker is killed: its claims are abandoned as in a crash,
    its leases expire and the other workers take over.

When every message is settled it compares PostgreSQL and the dead letters
with the simulator's ledger (charges per key) and prints the report; the last
line sums it up. It exits non-zero if any payment was charged twice or lost.
On an existing NATS it uses its own streams (PAYDEDUP_DEMO...) unless
PAYDEDUP_STREAM and friends say otherwise, and deletes the streams it created.`,
		Example: `  go run ./cmd/paydedup demo
  paydedup demo --payments 10000 --workers 4 --seed 7
  DATABASE_URL=postgres://me@db:5432/scratch?sslmode=disable paydedup demo`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return d.Run(cmd.Context()) },
	}
	f := cmd.Flags()
	// URLs may hold passwords: the environment is read after parsing, never
	// as a flag default that --help would print.
	f.StringVar(&d.dbURL, "database-url", "", "PostgreSQL URL (default: $DATABASE_URL, else the local server's database "+demoDatabase+")")
	f.StringVar(&d.natsURL, "nats-url", "", "NATS URL (default: $NATS_URL, else an embedded JetStream server)")
	d.streams.bindDefaults(cmd, a, consumer.Config{
		Stream: "PAYDEDUP_DEMO", SubjectPrefix: "paydedup_demo.requests",
		DLQStream: "PAYDEDUP_DEMO_DLQ", DLQPrefix: "paydedup_demo.dlq", Durable: "paydedup-demo",
	})
	f.IntVar(&d.payments, "payments", 3000, "distinct payments to publish")
	f.IntVar(&d.workers, "workers", 3, "workers to run (one of them is killed mid-run)")
	f.Uint64Var(&d.seed, "seed", 0, "random seed of the workload and the simulator's faults (0: random)")
	f.Float64Var(&d.dups, "duplicates", 0.4, "duplicate messages per payment, as a fraction")
	f.Float64Var(&d.declines, "declines", 0.05, "fraction of payments with a card that is declined")
	f.DurationVar(&d.timeout, "timeout", 3*time.Minute, "give up (and fail) if the messages have not settled by then")
	f.BoolVar(&d.verbose, "verbose", false, "show the workers', reconciler's and simulator's logs (default: errors only)")
	return cmd
}

func (d *demoCmd) validate() error {
	if d.dbURL == "" {
		d.dbURL = d.app.getenv("DATABASE_URL")
	}
	if d.natsURL == "" {
		d.natsURL = d.app.getenv("NATS_URL")
	}
	errs := []error{d.streams.validate()}
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if d.payments < 1 {
		bad("--payments must be at least 1, got %d", d.payments)
	}
	if d.workers < 2 {
		bad("--workers must be at least 2 (one is killed mid-run and the others take over), got %d", d.workers)
	}
	for _, v := range []struct {
		name string
		val  float64
	}{{"--duplicates", d.dups}, {"--declines", d.declines}} {
		if math.IsNaN(v.val) || v.val < 0 || v.val > 1 {
			bad("%s must be a fraction between 0 and 1, got %v", v.name, v.val)
		}
	}
	if d.timeout <= 0 {
		bad("--timeout must be positive, got %v", d.timeout)
	}
	return errors.Join(errs...)
}

func (d *demoCmd) say(format string, args ...any) {
	fmt.Fprintf(d.app.errOut, "demo: "+format+"\n", args...)
}

// Run runs the demo and prints its report.
func (d *demoCmd) Run(ctx context.Context) error {
	if err := d.validate(); err != nil {
		return err
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	seed := d.seed
	if seed == 0 {
		seed = rand.Uint64()
	}

	natsURL, stopNATS, err := d.startNATS()
	if err != nil {
		return err
	}
	defer stopNATS()
	dbURL, err := d.database(ctx)
	if err != nil {
		return err
	}
	pool, err := pg.Connect(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer pool.Close()
	if err := migrateUp(ctx, pool, d.quietLogger(nil)); err != nil {
		return err
	}
	store, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		return err
	}

	faults := provider.Faults{Latency: 2 * time.Millisecond, Jitter: 10 * time.Millisecond, Rate5xx: 0.02, RateDropAfterCharge: 0.02}
	pf := providerFlags{kind: "sim", timeout: demoAttemptTimeout}
	prov, sim, stopSim, err := pf.build(ctx, provider.SimConfig{Seed: int64(seed >> 1), Faults: faults, Logger: d.quietLogger(nil)})
	if err != nil {
		return err
	}
	defer stopSim()

	nc, err := nats.Connect(natsURL, nats.Name("paydedup-demo"), nats.Timeout(5*time.Second))
	if err != nil {
		return fmt.Errorf("demo: connect to NATS at %s: %w", redactURL(natsURL), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cfg := d.workerConfig()
	if cfg.DLQKey, err = d.app.labDLQKey(); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
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
		run.runID, d.payments, d.workers, seed, faults.RateDropAfterCharge*100, faults.Rate5xx*100, faults.Latency, faults.Latency+faults.Jitter)
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
	rep, err := run.report(rctx, dlqStart)
	if err != nil {
		return err
	}
	rep.print(d.app.out, time.Since(start))
	return rep.verdict(settled, d.timeout)
}

// workerConfig is the consumer configuration of the demo's workers.
func (d *demoCmd) workerConfig() consumer.Config {
	c := d.streams.cfg
	c.StreamMaxAge, c.DLQMaxAge = time.Hour, time.Hour
	c.Lease, c.AckWait, c.MaxDeliver = demoLease, demoAckWait, 20
	c.ProviderTry = provider.RetryPolicy{MaxTries: 2, AttemptTimeout: demoAttemptTimeout, InitialInterval: 50 * time.Millisecond, MaxInterval: 200 * time.Millisecond}
	c.RetryBase, c.RetryMax = 100*time.Millisecond, time.Second
	c.DrainTimeout, c.Concurrency, c.FetchBatch = 2*time.Second, 32, 50
	return c.WithDefaults()
}

// startNATS returns the NATS URL to use: NATS_URL, or an embedded server.
func (d *demoCmd) startNATS() (string, func(), error) {
	if d.natsURL != "" {
		return d.natsURL, func() {}, nil
	}
	u, stop, err := startEmbeddedNATS()
	if err != nil {
		return "", nil, fmt.Errorf("demo: %w", err)
	}
	d.say("no NATS_URL: started an embedded JetStream server at %s", u)
	return u, stop, nil
}

// database returns the database URL: DATABASE_URL, or the local server's
// paydedup_demo database, created if missing.
func (d *demoCmd) database(ctx context.Context) (string, error) {
	if d.dbURL != "" {
		return d.dbURL, nil
	}
	u, created, err := localDatabase(ctx, d.localPG, demoDatabase, 16)
	if err != nil {
		return "", fmt.Errorf("demo: %w", err)
	}
	if created {
		d.say("created database %s", demoDatabase)
	}
	return u, nil
}

// migrateUp applies the schema migrations.
func migrateUp(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	m, err := dedup.NewMigrator(ctx, pool, logger)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer m.Close()
	if _, err := m.Up(ctx); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	return nil
}

// setupStreams creates the demo's streams (or uses existing ones), and
// returns a cleanup that deletes those it created on an external server, and
// the DLQ's last sequence before the run.
func (d *demoCmd) setupStreams(ctx context.Context, js jetstream.JetStream, cfg consumer.Config, natsURL string) (func(), uint64, error) {
	created := []string{}
	for _, name := range []string{cfg.Stream, cfg.DLQStream, cfg.AdvisoryStream} {
		if _, err := js.Stream(ctx, name); errors.Is(err, jetstream.ErrStreamNotFound) {
			created = append(created, name)
		}
	}
	if _, _, err := consumer.EnsureStreams(ctx, js, cfg); err != nil {
		return func() {}, 0, fmt.Errorf("demo: %w", err)
	}
	dlq, err := js.Stream(ctx, cfg.DLQStream)
	if err != nil {
		return func() {}, 0, err
	}
	info, err := dlq.Info(ctx)
	if err != nil {
		return func() {}, 0, err
	}
	cleanup := func() {
		if d.natsURL == "" {
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
	if d.verbose {
		min = slog.LevelDebug
	}
	return slog.New(&demoLogHandler{inner: d.app.logger.Handler(), min: min, muted: muted})
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
	sim     *provider.Simulator
	rng     *rand.Rand
	runID   string
	start   time.Time

	procs []*demoWorker
	pub   *consumer.Publisher

	payments  []demoPayment
	published struct {
		early, late, windowed, reuse, malformed int
	}
	killedAt time.Duration
	killedIn int64
}

// demoPayment is one distinct valid payment of the workload.
type demoPayment struct {
	ref  dedup.KeyRef
	cmd  payment.Command
	body []byte
}

// demoWorker is one in-process worker with its own NATS connection.
type demoWorker struct {
	name   string
	nc     *nats.Conn
	store  *killableStore
	obs    *demoObserver
	muted  atomic.Bool
	cancel context.CancelFunc
	done   chan struct{}
	killed atomic.Bool
}

func (r *demoRun) startWorkers(ctx context.Context, prov *provider.Stripe) error {
	for i := range r.workers {
		w := &demoWorker{name: fmt.Sprintf("demo-%s-worker-%d", r.runID, i+1), obs: &demoObserver{}, done: make(chan struct{})}
		nc, err := nats.Connect(r.natsURL, nats.Name(w.name), nats.Timeout(5*time.Second))
		if err != nil {
			return fmt.Errorf("demo: connect worker to NATS: %w", err)
		}
		w.nc = nc
		w.store = &killableStore{Store: r.store}
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
	w.store.dead.Store(true)
	w.nc.Close()
	w.cancel() // stop its fetch loop; nothing it does can reach Postgres or NATS
	r.killedAt = time.Since(r.start)
	r.say("killed %s with %d payments in flight: its claims are abandoned, as in a crash; the others take over when its leases expire",
		w.name, r.killedIn)
}

// errKilled is what a killed worker's store calls return.
var errKilled = errors.New("worker killed")

// killableStore is a worker's view of the store that can die: once dead,
// every call fails before reaching Postgres. Methods the consumer's Store
// interface may gain later pass through to the embedded store.
type killableStore struct {
	consumer.Store
	dead atomic.Bool
}

func (k *killableStore) ClaimBatch(ctx context.Context, holder string, lease time.Duration, reqs []dedup.ClaimRequest) ([]dedup.ClaimResult, error) {
	if k.dead.Load() {
		return nil, errKilled
	}
	return k.Store.ClaimBatch(ctx, holder, lease, reqs)
}

func (k *killableStore) Heartbeat(ctx context.Context, l dedup.Lease, d time.Duration) (dedup.Lease, error) {
	if k.dead.Load() {
		return l, errKilled
	}
	return k.Store.Heartbeat(ctx, l, d)
}

func (k *killableStore) Complete(ctx context.Context, l dedup.Lease, c dedup.Completion) error {
	if k.dead.Load() {
		return errKilled
	}
	return k.Store.Complete(ctx, l, c)
}

// CompleteBatch is the group commit's store call.
func (k *killableStore) CompleteBatch(ctx context.Context, items []dedup.CompleteItem) ([]error, error) {
	if k.dead.Load() {
		return nil, errKilled
	}
	return k.Store.CompleteBatch(ctx, items)
}

func (k *killableStore) Fail(ctx context.Context, l dedup.Lease, reason string) (dedup.Status, error) {
	if k.dead.Load() {
		return "", errKilled
	}
	return k.Store.Fail(ctx, l, reason)
}

func (k *killableStore) Release(ctx context.Context, l dedup.Lease, reason string) error {
	if k.dead.Load() {
		return errKilled
	}
	return k.Store.Release(ctx, l, reason)
}

// demoObserver counts one worker's settled messages.
type demoObserver struct {
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

func (o *demoObserver) Claimed(time.Duration, int)           {}
func (o *demoObserver) Committed(time.Duration, int)         {}
func (o *demoObserver) ProviderCalled(time.Duration, string) {}

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

// msgKind is what a published message is, in the workload.
type msgKind int

const (
	kindOriginal msgKind = iota
	kindSameID           // a quick double publish: same Nats-Msg-Id, dropped by the window
	kindNoID             // a retry through a path that sets no Nats-Msg-Id
	kindNewID            // a retry with a new Nats-Msg-Id (another SDK attempt)
	kindLate             // a late retry, after the payment completed
	kindReuse            // the same key with another amount
	kindMalformed
)

type demoMsg struct {
	kind msgKind
	i    int // payment index, or malformed variant
}

// merchants of the demo's payments.
var demoMerchants = []string{"m_acme", "m_globex", "m_initech", "m_umbrella"}

// plan makes the payments and the two publishing phases: the first with
// originals, early duplicates and malformed messages interleaved, the second
// (late duplicates and key reuses) for payments that completed.
func (r *demoRun) plan() (early []demoMsg, late []demoMsg) {
	n := r.demoCmd.payments
	declined := map[int]bool{}
	for _, i := range r.rng.Perm(n)[:int(math.Round(r.declines*float64(n)))] {
		declined[i] = true
	}
	r.payments = make([]demoPayment, n)
	for i := range n {
		g := generate(r.rng, fmt.Sprintf("demo-%s-%06d", r.runID, i), demoMerchants[r.rng.IntN(len(demoMerchants))], declined[i])
		r.payments[i] = demoPayment{ref: dedup.KeyRef{MerchantID: g.cmd.MerchantID, IdempotencyKey: g.cmd.IdempotencyKey}, cmd: g.cmd, body: g.body}
	}
	dups := int(math.Round(r.dups * float64(n)))
	after := make(map[int][]demoMsg, dups)
	for j, i := range r.rng.Perm(n)[:min(dups, n)] {
		var k msgKind
		switch f := float64(j) / float64(max(dups, 1)); {
		case f < 0.15:
			k = kindSameID
		case f < 0.50:
			k = kindNoID
		case f < 0.70:
			k = kindNewID
		default:
			k = kindLate
		}
		if k == kindLate {
			late = append(late, demoMsg{kind: k, i: i})
			continue
		}
		at := min(i+1+r.rng.IntN(64), n-1)
		after[at] = append(after[at], demoMsg{kind: k, i: i})
	}
	for j := n; j < dups; j++ { // more duplicates than payments: extra late ones
		late = append(late, demoMsg{kind: kindLate, i: r.rng.IntN(n)})
	}
	bad := max(1, n/300)
	badAt := map[int]int{}
	for range bad {
		badAt[r.rng.IntN(n)]++
	}
	v := 0
	for i := range n {
		early = append(early, demoMsg{kind: kindOriginal, i: i})
		early = append(early, after[i]...)
		for range badAt[i] {
			early = append(early, demoMsg{kind: kindMalformed, i: v})
			v++
		}
	}
	for _, i := range r.rng.Perm(n)[:min(n, max(1, n/300))] {
		late = append(late, demoMsg{kind: kindReuse, i: i})
	}
	r.rng.Shuffle(len(late), func(a, b int) { late[a], late[b] = late[b], late[a] })
	return early, late
}

// message builds the NATS message for one planned message.
func (r *demoRun) message(m demoMsg) *nats.Msg {
	if m.kind == kindMalformed {
		return r.malformed(m.i)
	}
	p := r.payments[m.i]
	msg := consumer.CommandMsg(r.cfg, p.ref.MerchantID, p.ref.IdempotencyKey, p.body)
	id := consumer.MsgID(p.ref.MerchantID, p.ref.IdempotencyKey)
	switch m.kind {
	case kindNoID:
		msg.Header.Del(nats.MsgIdHdr)
	case kindNewID:
		msg.Header.Set(nats.MsgIdHdr, id+":retry")
	case kindLate:
		msg.Header.Set(nats.MsgIdHdr, id+":late")
	case kindReuse:
		c := p.cmd
		c.Amount++
		msg.Data, _ = json.Marshal(c)
		msg.Header.Set(nats.MsgIdHdr, id+":reuse")
	}
	return msg
}

// malformed builds the v-th malformed message: each is dead-lettered.
func (r *demoRun) malformed(v int) *nats.Msg {
	merchant := demoMerchants[v%len(demoMerchants)]
	key := fmt.Sprintf("demo-%s-bad-%d", r.runID, v)
	valid := fmt.Sprintf(`{"merchant_id":%q,"idempotency_key":%q,"amount":1500,"currency":"usd","payment_method":"pm_card_visa"}`, merchant, key)
	bodies := []string{
		`{"merchant_id":"` + merchant + `","idempotency_key":`, // truncated JSON
		strings.Replace(valid, `"idempotency_key":"`+key+`",`, "", 1),
		strings.Replace(valid, `"amount":1500`, `"amount":-5`, 1),
		strings.Replace(valid, `"usd"`, `"USD"`, 1),
		strings.Replace(valid, `"amount"`, `"coupon":"FREE","amount"`, 1),
		strings.Replace(valid, `"merchant_id":"`+merchant+`"`, `"merchant_id":"m_other"`, 1), // subject says otherwise
	}
	m := nats.NewMsg(r.cfg.SubjectPrefix + "." + merchant)
	m.Data = []byte(bodies[v%len(bodies)])
	m.Header.Set(nats.MsgIdHdr, key)
	return m
}

// drive publishes the workload, kills a worker mid-run, and waits until
// every message is settled. settled is false when the timeout came first.
func (r *demoRun) drive(ctx context.Context) (settled bool, err error) {
	early, late := r.plan()
	pub, err := consumer.NewPublisher(r.js.Conn(), consumer.PublisherConfig{})
	if err != nil {
		return false, err
	}
	r.pub = pub
	defer pub.Close() // a no-op once closed below

	// Progress, and the kill once 40% of the payments are done.
	stopTicker := make(chan struct{})
	tickerDone := make(chan struct{})
	killAt := int64(max(1, r.demoCmd.payments*2/5))
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
		if err := pub.Publish(ctx, r.message(m)); err != nil {
			return false, fmt.Errorf("publish: %w", err)
		}
		r.count(m)
	}
	if err := r.publishLate(ctx, late); err != nil {
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

func (r *demoRun) count(m demoMsg) {
	switch m.kind {
	case kindSameID, kindNoID, kindNewID:
		r.published.early++
	case kindLate:
		r.published.late++
	case kindReuse:
		r.published.reuse++
	case kindMalformed:
		r.published.malformed++
	}
}

// publishLate publishes each late message once its payment has completed.
func (r *demoRun) publishLate(ctx context.Context, late []demoMsg) error {
	for len(late) > 0 {
		refs := make([]dedup.KeyRef, len(late))
		for j, m := range late {
			refs[j] = r.payments[m.i].ref
		}
		recs, err := r.store.GetMany(ctx, refs)
		if err != nil {
			return err
		}
		done := map[dedup.KeyRef]bool{}
		for _, rec := range recs {
			if rec.Status == dedup.StatusCompleted {
				done[dedup.KeyRef{MerchantID: rec.MerchantID, IdempotencyKey: rec.IdempotencyKey}] = true
			}
		}
		rest := late[:0]
		for _, m := range late {
			if !done[r.payments[m.i].ref] {
				rest = append(rest, m)
				continue
			}
			if err := r.pub.Publish(ctx, r.message(m)); err != nil {
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

// waitQuiescent waits until the consumer has nothing pending or unacked and
// no payment of the run is pending in Postgres.
func (r *demoRun) waitQuiescent(ctx context.Context) (bool, error) {
	refs := make([]dedup.KeyRef, len(r.payments))
	for i, p := range r.payments {
		refs[i] = p.ref
	}
	for {
		cs, err := consumer.ConsumerState(ctx, r.js, r.cfg)
		if err == nil && cs.NumPending == 0 && cs.NumAckPending == 0 {
			recs, err := r.store.GetMany(ctx, refs)
			if err == nil && !slices.ContainsFunc(recs, func(rec dedup.Record) bool { return rec.Status == dedup.StatusPending }) {
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
	if cs, err := consumer.ConsumerState(ctx, r.js, r.cfg); err == nil {
		backlog = fmt.Sprintf("%d", cs.NumPending+uint64(cs.NumAckPending))
	}
	r.say("%5.1fs  published %d  completed %d/%d  in flight %d  duplicates suppressed %d  dead-lettered %d  backlog %s",
		time.Since(r.start).Seconds(), ps.Sent, done, len(r.payments), inFlight, dups, dead, backlog)
}

// ---------------------------------------------------------------------------
// Report

type demoReport struct {
	payments, duplicates, late, windowed, reuse, malformed int
	keysCharged                                            int
	chargedOnce, declined, deadLetteredValid               int
	double, lost, disagree                                 int
	deadLetters                                            int
	byReason                                               map[string]int
	killedAt                                               time.Duration
	killedIn                                               int64
	lostKeys, doubleKeys, disagreeKeys                     []string
}

// report checks Postgres and the dead letters against the simulator's
// ledger.
func (r *demoRun) report(ctx context.Context, dlqStart uint64) (*demoReport, error) {
	rep := &demoReport{
		payments: len(r.payments), duplicates: r.published.early + r.published.late, late: r.published.late, windowed: r.published.windowed,
		reuse: r.published.reuse, malformed: r.published.malformed, byReason: map[string]int{},
		killedAt: r.killedAt, killedIn: r.killedIn,
	}
	charges := r.sim.ChargesByKey()
	refs := make([]dedup.KeyRef, len(r.payments))
	for i, p := range r.payments {
		refs[i] = p.ref
	}
	recs, err := r.store.GetMany(ctx, refs)
	if err != nil {
		return nil, fmt.Errorf("demo report: %w", err)
	}
	byRef := make(map[dedup.KeyRef]dedup.Record, len(recs))
	for _, rec := range recs {
		byRef[dedup.KeyRef{MerchantID: rec.MerchantID, IdempotencyKey: rec.IdempotencyKey}] = rec
	}
	letters, err := consumer.ListDeadLetters(ctx, r.js, r.cfg, consumer.DLQFilter{})
	if err != nil {
		return nil, fmt.Errorf("demo report: %w", err)
	}
	lettered := map[dedup.KeyRef]string{}
	for _, l := range letters {
		if l.Seq <= dlqStart {
			continue
		}
		rep.deadLetters++
		rep.byReason[l.Reason]++
		lettered[dedup.KeyRef{MerchantID: l.MerchantID, IdempotencyKey: l.IdempotencyKey}] = l.Reason
	}
	rep.judge(r.payments, charges, byRef, lettered)
	return rep, nil
}

// judge checks each payment's record and dead letters against the
// provider's charges (by "merchant_id:idempotency_key").
func (rep *demoReport) judge(payments []demoPayment, charges map[string]int, byRef map[dedup.KeyRef]dedup.Record, lettered map[dedup.KeyRef]string) {
	rep.keysCharged = len(charges)
	rep.doubleKeys = ledgercheck.DoubleCharged(charges)
	rep.double = len(rep.doubleKeys)
	for _, p := range payments {
		rec, ok := byRef[p.ref]
		n := charges[p.ref.MerchantID+":"+p.ref.IdempotencyKey]
		wantDecline := p.cmd.PaymentMethod == "pm_card_chargeDeclined"
		switch {
		case ok && rec.Status == dedup.StatusCompleted:
			declined := rec.ResponseStatus >= 400 // a definitive decline, stored with its error response
			switch {
			case declined && wantDecline && n == 0:
				rep.declined++
			case !declined && !wantDecline && n >= 1:
				if n == 1 {
					rep.chargedOnce++
				}
			default:
				rep.disagree++
				rep.disagreeKeys = append(rep.disagreeKeys, fmt.Sprintf("%s:%s (completed with HTTP %d, charge %q; the provider has %d charges)",
					p.ref.MerchantID, p.ref.IdempotencyKey, rec.ResponseStatus, rec.ChargeID, n))
			}
		case lettered[p.ref] != "" && !payment.IsInputReason(lettered[p.ref]):
			rep.deadLetteredValid++
		default:
			rep.lost++
			status := "no row"
			if ok {
				status = string(rec.Status)
			}
			rep.lostKeys = append(rep.lostKeys, fmt.Sprintf("%s:%s (%s, %d charges)", p.ref.MerchantID, p.ref.IdempotencyKey, status, n))
		}
	}
}

// verdict fails a run that charged a key twice, lost a payment, disagrees
// with the provider, or did not settle.
func (rep *demoReport) verdict(settled bool, timeout time.Duration) error {
	switch {
	case rep.double > 0 || rep.lost > 0 || rep.disagree > 0:
		return fmt.Errorf("demo: %d double charges, %d lost payments, %d outcomes disagreeing with the provider", rep.double, rep.lost, rep.disagree)
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
	fmt.Fprintf(out, "demo: %d payments, %d duplicates, %d charged once, %d declined, %d double charges, %d lost, %d dead letters, %.1f s\n",
		rep.payments, rep.duplicates, rep.chargedOnce, rep.declined, rep.double, rep.lost, rep.deadLetters, elapsed.Seconds())
}

func head(s []string) []string { return s[:min(len(s), 10)] }
