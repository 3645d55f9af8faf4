package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paydedup/paydedup/internal/pg"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/ledgercheck"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
)

type benchCmd struct {
	app         *app
	dbURL       string
	natsURL     string
	payments    int
	duplicates  float64
	latency     time.Duration
	concurrency int
	mode        string
	provider    string
	fetchBatch  int
	commitBatch int
	commitWait  time.Duration
	completed   bool
	jsonOut     bool
	timeout     time.Duration
	cpuProfile  string
	memProfile  string
}

func newBenchCmd(a *app) *cobra.Command {
	b := &benchCmd{app: a}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure exactly-once throughput through real NATS and PostgreSQL",
		Long: `bench publishes payment commands first, then times one worker consuming them to
quiescence through real NATS JetStream and PostgreSQL, with the simulator
in-process (no network hop; --provider-latency adds latency per call), and
checks the simulator's ledger at the end: every payment charged exactly once.

NATS: NATS_URL, or an embedded server. PostgreSQL: DATABASE_URL, or the local
server's paydedup_bench database (created if missing). Each run works in a
fresh schema and fresh streams and removes them at the end.

--provider sim calls the simulator through its Go client (no HTTP), so the
figures are the service's own; --provider stripe goes through the Stripe
adapter as production does (stripe-go, form encoding, JSON), its HTTP
served in-process by the simulator, which adds that client library's CPU to
every charge.

--mode batched is the worker as shipped: batch fetch, one claim round trip
per batch, a bounded pool of provider calls, group-committed completions.
--mode naive is the seeds' design: one message at a time, claim transaction,
provider call, complete transaction, ack.

--duplicates F republishes F×N of the commands with their own message ids, so
they reach the worker (they are not dropped by the stream's duplicate
window). --completed-duplicates then republishes all N again, every key
already completed, and times those separately.

The last line with --json is one JSON object.`,
		Example: `  paydedup bench --payments 20000 --mode batched --json
  paydedup bench --payments 2000 --mode naive
  paydedup bench --payments 20000 --provider-latency 50ms --concurrency 256
  paydedup bench --payments 20000 --completed-duplicates`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return b.Run(cmd.Context()) },
	}
	f := cmd.Flags()
	f.IntVar(&b.payments, "payments", 20000, "distinct payments")
	f.Float64Var(&b.duplicates, "duplicates", 0, "fraction of payments published a second time, interleaved (0..1)")
	f.DurationVar(&b.latency, "provider-latency", 0, "latency of every provider call")
	f.IntVar(&b.concurrency, "concurrency", 256, "payments in flight (batched mode)")
	f.StringVar(&b.mode, "mode", "batched", "batched or naive")
	f.StringVar(&b.provider, "provider", "sim", "sim (the simulator's Go client) or stripe (the Stripe adapter over in-process HTTP)")
	f.IntVar(&b.fetchBatch, "fetch-batch", consumer.DefaultFetchBatch, "messages per fetch and claim (batched mode)")
	f.IntVar(&b.commitBatch, "commit-batch", consumer.DefaultCommitBatch, "completions per group commit (batched mode)")
	f.DurationVar(&b.commitWait, "commit-wait", consumer.DefaultCommitWait, "how long a group commit waits for more completions (batched mode)")
	f.BoolVar(&b.completed, "completed-duplicates", false, "afterwards, republish every payment (all completed) and time the duplicates")
	f.BoolVar(&b.jsonOut, "json", false, "print one JSON object on the last line")
	f.DurationVar(&b.timeout, "timeout", 10*time.Minute, "give up after this long")
	f.StringVar(&b.cpuProfile, "cpuprofile", "", "write a CPU profile of the consumption phase to this file (go tool pprof)")
	f.StringVar(&b.memProfile, "memprofile", "", "write a heap profile at the end to this file (go tool pprof)")
	b.dbURL = a.getenv("DATABASE_URL")
	b.natsURL = a.getenv("NATS_URL")
	return cmd
}

func (b *benchCmd) validate() error {
	var errs []error
	if b.payments < 1 {
		errs = append(errs, fmt.Errorf("--payments must be at least 1, got %d", b.payments))
	}
	if b.duplicates < 0 || b.duplicates > 1 {
		errs = append(errs, fmt.Errorf("--duplicates must be within 0..1, got %v", b.duplicates))
	}
	if b.latency < 0 || b.latency > 10*time.Second {
		errs = append(errs, fmt.Errorf("--provider-latency must be within 0..10s, got %v", b.latency))
	}
	if b.concurrency < 1 || b.fetchBatch < 1 || b.commitBatch < 1 {
		errs = append(errs, errors.New("--concurrency, --fetch-batch and --commit-batch must be at least 1"))
	}
	if b.mode != "batched" && b.mode != "naive" {
		errs = append(errs, fmt.Errorf("--mode must be batched or naive, got %q", b.mode))
	}
	if b.provider != "sim" && b.provider != "stripe" {
		errs = append(errs, fmt.Errorf("--provider must be sim or stripe, got %q", b.provider))
	}
	return errors.Join(errs...)
}

// benchResult is the JSON report.
type benchResult struct {
	Mode                    string  `json:"mode"`
	Provider                string  `json:"provider"`
	Payments                int     `json:"payments"`
	Duplicates              int     `json:"duplicates"`
	Messages                int     `json:"messages"`
	Concurrency             int     `json:"concurrency"`
	ProviderLatencyMS       float64 `json:"provider_latency_ms"`
	Seconds                 float64 `json:"seconds"`
	PaymentsPerSec          float64 `json:"payments_per_sec"`
	MessagesPerSec          float64 `json:"messages_per_sec"`
	P50MS                   float64 `json:"p50_ms"`
	P99MS                   float64 `json:"p99_ms"`
	PGRoundTripsPerPayment  float64 `json:"pg_round_trips_per_payment"`
	RSSMB                   float64 `json:"rss_mb"`
	DoubleCharges           int     `json:"double_charges"`
	Lost                    int     `json:"lost"`
	CompletedDuplicates     int     `json:"completed_duplicates,omitempty"`
	CompletedDupSeconds     float64 `json:"completed_duplicates_seconds,omitempty"`
	CompletedDupMessagesSec float64 `json:"completed_duplicates_per_sec,omitempty"`
}

// Run runs one benchmark.
func (b *benchCmd) Run(ctx context.Context) error {
	if err := b.validate(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	say := func(format string, args ...any) { fmt.Fprintf(b.app.errOut, "bench: "+format+"\n", args...) }

	natsURL, stopNATS := b.natsURL, func() {}
	if natsURL == "" {
		u, stop, err := startEmbeddedNATS()
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		natsURL, stopNATS = u, stop
		say("no NATS_URL: embedded JetStream server at %s", u)
	}
	defer stopNATS()

	dbURL := b.dbURL
	if dbURL == "" {
		u, _, err := localDatabase(ctx, localPostgres, "paydedup_bench", 32)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		dbURL = u
	}
	suffix := randomSuffix()
	schemaURL, dropSchema, err := freshSchema(ctx, dbURL, "bench_"+suffix)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer dropSchema()
	pool, err := pg.Connect(ctx, schemaURL)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer pool.Close()
	if err := migrateUp(ctx, pool, nil); err != nil {
		return err
	}
	store, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		return err
	}

	nc, err := nats.Connect(natsURL, nats.Name("paydedup-bench"))
	if err != nil {
		return fmt.Errorf("bench: connect to NATS: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cfg := b.workerConfig(suffix)
	if cfg.DLQKey, err = b.app.labDLQKey(); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if _, _, err := consumer.EnsureStreams(ctx, js, cfg); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(cctx, cfg.Stream)
		_ = js.DeleteStream(cctx, cfg.DLQStream)
		_ = js.DeleteStream(cctx, cfg.AdvisoryStream)
	}()

	sim := provider.NewSimulator(provider.SimConfig{Faults: provider.Faults{Latency: b.latency}})
	const apiKey = "sk_test_paydedup_bench"
	var prov consumer.Charger = sim.Client(apiKey)
	if b.provider == "stripe" {
		st, err := provider.NewStripe(provider.StripeConfig{
			SecretKey: apiKey, APIBase: "http://sim.invalid", Timeout: 30 * time.Second,
			HTTPClient: &http.Client{Transport: inProcess{sim}},
		})
		if err != nil {
			return err
		}
		prov = st
	}

	dups := int(math.Round(b.duplicates * float64(b.payments)))
	say("publishing %d payments + %d duplicates to %s", b.payments, dups, cfg.Stream)
	if err := benchPublish(ctx, js, cfg, b.payments, dups, "p"); err != nil {
		return err
	}

	counting := &countingStore{Store: store}
	obs := newBenchObserver()
	proc := consumer.NewProcessor(counting, prov, cfg, nil)
	w, err := consumer.NewWorker(nc, proc, cfg, nil, obs, nil)
	if err != nil {
		return err
	}
	if b.cpuProfile != "" {
		f, err := os.Create(b.cpuProfile)
		if err != nil {
			return fmt.Errorf("bench: --cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("bench: --cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	wctx, stopWorker := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- w.Run(wctx) }()
	messages := b.payments + dups
	if err := b.waitSettled(ctx, obs, int64(messages), start, say); err != nil {
		stopWorker()
		<-done
		return err
	}
	elapsed := time.Since(start)
	roundTrips := counting.calls.Load()

	res := benchResult{
		Mode: b.mode, Provider: b.provider, Payments: b.payments, Duplicates: dups, Messages: messages, Concurrency: cfg.Concurrency,
		ProviderLatencyMS: float64(b.latency) / float64(time.Millisecond),
		Seconds:           elapsed.Seconds(), PaymentsPerSec: float64(b.payments) / elapsed.Seconds(),
		MessagesPerSec: float64(messages) / elapsed.Seconds(),
		P50MS:          obs.quantile(0.50), P99MS: obs.quantile(0.99),
		PGRoundTripsPerPayment: float64(roundTrips) / float64(b.payments),
	}

	if b.completed {
		obs.reset()
		say("republishing all %d payments, every key already completed", b.payments)
		if err := benchPublish(ctx, js, cfg, b.payments, 0, "p"); err != nil {
			stopWorker()
			<-done
			return err
		}
		start := time.Now()
		if err := b.waitSettled(ctx, obs, int64(b.payments), start, say); err != nil {
			stopWorker()
			<-done
			return err
		}
		res.CompletedDuplicates = b.payments
		res.CompletedDupSeconds = time.Since(start).Seconds()
		res.CompletedDupMessagesSec = float64(b.payments) / res.CompletedDupSeconds
	}
	stopWorker()
	if err := <-done; err != nil {
		return err
	}
	res.RSSMB = peakRSSMB()
	if b.memProfile != "" {
		f, err := os.Create(b.memProfile)
		if err != nil {
			return fmt.Errorf("bench: --memprofile: %w", err)
		}
		runtime.GC()
		err = pprof.WriteHeapProfile(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("bench: --memprofile: %w", err)
		}
	}
	res.DoubleCharges, res.Lost, err = benchCheck(ctx, store, sim, b.payments)
	if err != nil {
		return err
	}

	if b.jsonOut {
		out, _ := json.Marshal(res)
		fmt.Fprintln(b.app.out, string(out))
	} else {
		fmt.Fprintf(b.app.out, "mode %s, provider %s: %d payments (+%d duplicates) in %.2f s: %.0f payments/s, %.0f messages/s\n",
			res.Mode, res.Provider, res.Payments, res.Duplicates, res.Seconds, res.PaymentsPerSec, res.MessagesPerSec)
		fmt.Fprintf(b.app.out, "latency fetch→settle: p50 %.1f ms, p99 %.1f ms; %.2f Postgres round trips per payment; peak RSS %.0f MB\n",
			res.P50MS, res.P99MS, res.PGRoundTripsPerPayment, res.RSSMB)
		if res.CompletedDuplicates > 0 {
			fmt.Fprintf(b.app.out, "completed duplicates: %d in %.2f s: %.0f messages/s\n", res.CompletedDuplicates, res.CompletedDupSeconds, res.CompletedDupMessagesSec)
		}
		fmt.Fprintf(b.app.out, "ledger: %d double charges, %d lost\n", res.DoubleCharges, res.Lost)
	}
	return res.verdict()
}

// workerConfig is the worker under test: the shipped batched worker, or the
// seeds' one-at-a-time design.
func (b *benchCmd) workerConfig(suffix string) consumer.Config {
	name := "BENCH_" + strings.ToUpper(suffix)
	c := consumer.Config{
		Stream: name, SubjectPrefix: "bench." + suffix + ".requests", DLQStream: name + "_DLQ",
		DLQPrefix: "bench." + suffix + ".dlq", Durable: "paydedup-bench",
		StreamMaxAge: time.Hour, DLQMaxAge: time.Hour, MaxAckPending: 20000,
		Concurrency: b.concurrency, FetchBatch: b.fetchBatch, CommitBatch: b.commitBatch, CommitWait: b.commitWait,
		Holder: "bench-" + suffix,
	}
	if b.mode == "naive" {
		c.Concurrency, c.FetchBatch, c.CommitBatch = 1, 1, 1
	}
	return c.WithDefaults()
}

// waitSettled waits until the observer has seen n settled messages and the
// consumer holds nothing, printing progress every second.
func (b *benchCmd) waitSettled(ctx context.Context, obs *benchObserver, n int64, start time.Time, say func(string, ...any)) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("bench: gave up after %v with %d of %d messages settled", time.Since(start).Round(time.Second), obs.acked.Load(), n)
		case <-tick.C:
		}
		if obs.acked.Load() >= n {
			return nil
		}
		if time.Since(last) >= time.Second {
			last = time.Now()
			say("%d/%d settled, %.0f msg/s", obs.acked.Load(), n, float64(obs.acked.Load())/time.Since(start).Seconds())
		}
	}
}

// benchPublish publishes n payments (keys <prefix>-0..n-1) and dups of them
// again, interleaved, each with its own Nats-Msg-Id so the stream keeps it.
func benchPublish(ctx context.Context, js jetstream.JetStream, cfg consumer.Config, n, dups int, prefix string) error {
	// Below nats.go's default limit of 4,000 outstanding async publishes,
	// past which PublishMsgAsync fails with "stalled" on a loaded machine.
	const window = 2048
	sem := make(chan struct{}, window)
	var (
		mu      sync.Mutex
		pubErr  error
		pending sync.WaitGroup
	)
	run := randomSuffix()
	publish := func(i, copyNo int) {
		key := fmt.Sprintf("%s-%d", prefix, i)
		body, _ := json.Marshal(payment.Command{MerchantID: "m_bench", IdempotencyKey: key, Amount: int64(100 + i%1000),
			Currency: "usd", PaymentMethod: "pm_card_visa", Description: "bench"})
		m := nats.NewMsg(cfg.SubjectPrefix + ".m_bench")
		m.Data = body
		m.Header.Set(consumer.HeaderIdempotencyKey, key)
		m.Header.Set(nats.MsgIdHdr, fmt.Sprintf("%s:%s:%d", run, key, copyNo))
		sem <- struct{}{}
		f, err := js.PublishMsgAsync(m)
		if err != nil {
			<-sem
			mu.Lock()
			pubErr = errors.Join(pubErr, err)
			mu.Unlock()
			return
		}
		pending.Add(1)
		go func() {
			defer pending.Done()
			defer func() { <-sem }()
			select {
			case <-f.Ok():
			case err := <-f.Err():
				mu.Lock()
				pubErr = errors.Join(pubErr, err)
				mu.Unlock()
			case <-ctx.Done():
			}
		}()
	}
	every := 0
	if dups > 0 {
		every = max(n/dups, 1)
	}
	d := 0
	for i := range n {
		publish(i, 0)
		if every > 0 && d < dups && i%every == every-1 {
			publish(i-every/2, 1)
			d++
		}
	}
	for ; d < dups; d++ {
		publish(d%n, 1)
	}
	pending.Wait()
	if pubErr != nil {
		return fmt.Errorf("bench: publish: %w", pubErr)
	}
	return ctx.Err()
}

// benchCheck counts double charges and lost payments against the ledger.
func benchCheck(ctx context.Context, store *dedup.Store, sim *provider.Simulator, n int) (double, lost int, err error) {
	charges := sim.ChargesByKey()
	refs := make([]dedup.KeyRef, n)
	for i := range n {
		refs[i] = dedup.KeyRef{MerchantID: "m_bench", IdempotencyKey: fmt.Sprintf("p-%d", i)}
	}
	recs, err := store.GetMany(ctx, refs)
	if err != nil {
		return 0, 0, err
	}
	completed := map[string]bool{}
	for _, r := range recs {
		if r.Status == dedup.StatusCompleted {
			completed[r.MerchantID+":"+r.IdempotencyKey] = true
		}
	}
	double, lost = benchJudge(charges, completed, n)
	return double, lost, nil
}

// benchJudge counts, for the bench's n payments, the keys the provider
// charged more than once and the payments that were not charged or not
// completed. charges and completed are by "merchant_id:idempotency_key".
func benchJudge(charges map[string]int, completed map[string]bool, n int) (double, lost int) {
	double = len(ledgercheck.DoubleCharged(charges))
	for i := range n {
		key := fmt.Sprintf("m_bench:p-%d", i)
		if c := charges[key]; c == 0 || !completed[key] {
			lost++
		}
	}
	return double, lost
}

// verdict fails a run that charged any key twice or lost a payment.
func (r benchResult) verdict() error {
	if r.DoubleCharges > 0 || r.Lost > 0 {
		return fmt.Errorf("bench: %d double charges, %d lost", r.DoubleCharges, r.Lost)
	}
	return nil
}

// countingStore counts the store calls the worker makes: each is one
// round trip to Postgres.
type countingStore struct {
	*dedup.Store
	calls atomic.Int64
}

func (c *countingStore) ClaimBatch(ctx context.Context, holder string, lease time.Duration, reqs []dedup.ClaimRequest) ([]dedup.ClaimResult, error) {
	c.calls.Add(1)
	return c.Store.ClaimBatch(ctx, holder, lease, reqs)
}

func (c *countingStore) Heartbeat(ctx context.Context, l dedup.Lease, d time.Duration) (dedup.Lease, error) {
	c.calls.Add(1)
	return c.Store.Heartbeat(ctx, l, d)
}

func (c *countingStore) Complete(ctx context.Context, l dedup.Lease, comp dedup.Completion) error {
	c.calls.Add(1)
	return c.Store.Complete(ctx, l, comp)
}

func (c *countingStore) CompleteBatch(ctx context.Context, items []dedup.CompleteItem) ([]error, error) {
	c.calls.Add(1)
	return c.Store.CompleteBatch(ctx, items)
}

func (c *countingStore) Fail(ctx context.Context, l dedup.Lease, reason string) (dedup.Status, error) {
	c.calls.Add(1)
	return c.Store.Fail(ctx, l, reason)
}

func (c *countingStore) Release(ctx context.Context, l dedup.Lease, reason string) error {
	c.calls.Add(1)
	return c.Store.Release(ctx, l, reason)
}

// benchObserver counts settled messages and keeps a fixed-size latency
// histogram, so memory does not grow with the number of payments.
type benchObserver struct {
	acked   atomic.Int64
	mu      sync.Mutex
	buckets [latencyBuckets]int64
	total   int64
}

// Latency buckets: 10 per factor of two from 10 µs, up to about 10 min.
const latencyBuckets = 260

func newBenchObserver() *benchObserver { return &benchObserver{} }

func (o *benchObserver) reset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.acked.Store(0)
	o.buckets = [latencyBuckets]int64{}
	o.total = 0
}

// Settled counts messages that are done: acked or dead-lettered (a nakked
// one comes back).
func (o *benchObserver) Settled(_ consumer.Kind, act consumer.Action) {
	if act.Kind != consumer.Nak {
		o.acked.Add(1)
	}
}
func (o *benchObserver) InFlight(int)                         {}
func (o *benchObserver) Claimed(time.Duration, int)           {}
func (o *benchObserver) Committed(time.Duration, int)         {}
func (o *benchObserver) ProviderCalled(time.Duration, string) {}
func (o *benchObserver) SettledIn(_ consumer.Kind, d time.Duration) {
	i := 0
	if us := float64(d) / float64(10*time.Microsecond); us > 1 {
		i = min(int(math.Log2(us)*10), latencyBuckets-1)
	}
	o.mu.Lock()
	o.buckets[i]++
	o.total++
	o.mu.Unlock()
}

// quantile returns the q-quantile in milliseconds (bucket upper bound).
func (o *benchObserver) quantile(q float64) float64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.total == 0 {
		return 0
	}
	target := int64(math.Ceil(q * float64(o.total)))
	var seen int64
	for i, c := range o.buckets {
		seen += c
		if seen >= target {
			return 0.01 * math.Pow(2, float64(i+1)/10)
		}
	}
	return 0
}

// inProcess is an http.RoundTripper that serves requests with the
// simulator's handler directly: the Stripe adapter's whole client path
// (stripe-go, form encoding, response parsing) without a network hop.
type inProcess struct{ h http.Handler }

func (t inProcess) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r.WithContext(r.Context()))
	resp := rec.Result()
	resp.Request = r
	return resp, nil
}

// freshSchema creates schema name in the database at dbURL and returns a
// URL whose search_path selects it, and a func that drops it.
func freshSchema(ctx context.Context, dbURL, name string) (string, func(), error) {
	pool, err := pg.Connect(ctx, dbURL)
	if err != nil {
		return "", nil, err
	}
	defer pool.Close()
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+ident); err != nil {
		return "", nil, fmt.Errorf("create schema %s: %w", name, err)
	}
	drop := func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if p, err := pg.Connect(cctx, dbURL); err == nil {
			_, _ = p.Exec(cctx, "DROP SCHEMA "+ident+" CASCADE")
			p.Close()
		}
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		drop()
		return "", nil, err
	}
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	return u.String(), drop, nil
}

func randomSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// peakRSSMB reads the process's peak resident set size (VmHWM) in MiB.
func peakRSSMB() float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kb float64
		if n, _ := fmt.Sscanf(sc.Text(), "VmHWM: %f kB", &kb); n == 1 {
			return kb / 1024
		}
	}
	return 0
}
