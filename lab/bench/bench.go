// Package bench measures exactly-once throughput through real NATS
// JetStream and PostgreSQL: it publishes payment commands first, then times
// one worker consuming them to quiescence, with the simulator in-process,
// and checks the simulator's ledger at the end.
package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/inproc"
	"github.com/paydedup/paydedup/lab/localpg"
	"github.com/paydedup/paydedup/lab/procstat"
	"github.com/paydedup/paydedup/lab/storehook"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/workload"
	"github.com/paydedup/paydedup/outbox"
	"github.com/paydedup/paydedup/provider/stripe"
	"github.com/paydedup/paydedup/stream"
)

// Database is the local server's database when DatabaseURL is empty.
const Database = "paydedup_bench"

// Config is one bench run. The command fills it from its flags and the
// environment.
type Config struct {
	DatabaseURL         string        // PostgreSQL; "" uses the paydedup_bench database on the server localpg.Find finds
	AdminURL            string        // the local server Find tries first ("": localpg.AdminURL)
	NATSURL             string        // NATS; "" starts an embedded JetStream server
	Payments            int           // distinct payments
	Duplicates          float64       // fraction of payments published a second time, interleaved (0..1)
	ProviderLatency     time.Duration // latency of every provider call
	Concurrency         int           // payments in flight: provider calls (batched), handlers (naive)
	Mode                string        // batched or naive
	CompareNaive        bool          // afterwards, run the naive design at 1, 8 and 32 handlers and report the best
	NaivePayments       int           // payments per naive run of CompareNaive
	Provider            string        // sim (the simulator's Go client) or stripe (the adapter over in-process HTTP)
	FetchBatch          int           // messages per fetch and claim (batched mode)
	CommitBatch         int           // completions per group commit (batched mode)
	CommitWait          time.Duration // how long a group commit waits for more completions (batched mode)
	PoolSize            int           // the worker's PostgreSQL pool (batched mode; naive: at least one per handler)
	CompletedDuplicates bool          // afterwards, republish every payment (all completed) and time the duplicates
	JSON                bool          // print one JSON object on the last line
	Timeout             time.Duration // give up after this long
	CPUProfile          string        // write a CPU profile of the consumption phase to this file
	MemProfile          string        // write a heap profile at the end to this file
	DLQKey              []byte        // the worker's dead-letter key
	PreloadRows         int           // finished payments in the ledger before the run (see Preload)
	PreloadKeys         int           // of them, the newest with their key rows (at most PreloadRows)
	PreloadVacuum       bool          // VACUUM (ANALYZE) after the preload, not only ANALYZE
	Window              int           // report payments/s and RSS per this many settled payments (0: none)
	Warmup              int           // payments of their own settled first by a worker of their own, untimed
	Out, ErrOut         io.Writer     // the report; progress
}

// Validate checks the run's figures and choices.
func (c Config) Validate() error {
	var errs []error
	if c.Payments < 1 {
		errs = append(errs, fmt.Errorf("--payments must be at least 1, got %d", c.Payments))
	}
	if c.Duplicates < 0 || c.Duplicates > 1 {
		errs = append(errs, fmt.Errorf("--duplicates must be within 0..1, got %v", c.Duplicates))
	}
	if c.ProviderLatency < 0 || c.ProviderLatency > 10*time.Second {
		errs = append(errs, fmt.Errorf("--provider-latency must be within 0..10s, got %v", c.ProviderLatency))
	}
	if c.CompareNaive && (c.Mode != "batched" || c.NaivePayments < 1) {
		errs = append(errs, fmt.Errorf("--compare-naive needs --mode batched and --naive-payments of at least 1 (got %q, %d)", c.Mode, c.NaivePayments))
	}
	if c.Concurrency < 1 || c.FetchBatch < 1 || c.CommitBatch < 1 || c.PoolSize < 1 {
		errs = append(errs, errors.New("--concurrency, --fetch-batch, --commit-batch and --pool-size must be at least 1"))
	}
	if c.PreloadRows < 0 || c.PreloadKeys < 0 || c.Window < 0 {
		errs = append(errs, fmt.Errorf("--preload-rows, --preload-keys and --window must not be negative (got %d, %d, %d)", c.PreloadRows, c.PreloadKeys, c.Window))
	}
	if c.Warmup < 0 {
		errs = append(errs, fmt.Errorf("--warmup must not be negative, got %d", c.Warmup))
	}
	if c.Warmup > 0 && (c.Duplicates > 0 || c.CompareNaive) {
		// The duplicates are spread over the whole numbered workload, the
		// warm-up's share included; the naive runs would each warm up too.
		errs = append(errs, errors.New("--warmup cannot be combined with --duplicates or --compare-naive"))
	}
	if c.Mode != "batched" && c.Mode != "naive" {
		errs = append(errs, fmt.Errorf("--mode must be batched or naive, got %q", c.Mode))
	}
	if c.Provider != "sim" && c.Provider != "stripe" {
		errs = append(errs, fmt.Errorf("--provider must be sim or stripe, got %q", c.Provider))
	}
	return errors.Join(errs...)
}

// benchCmd is one run of the bench.
type benchCmd struct{ Config }

// Run runs one benchmark and prints its report to cfg.Out. It fails if any
// payment was charged twice or lost.
func Run(ctx context.Context, cfg Config) error {
	return (&benchCmd{Config: cfg}).run(ctx)
}

// Measure runs one bench run (no --compare-naive) and returns its result
// without printing it; the error reports a double charge or a lost
// payment as Run's does.
func Measure(ctx context.Context, cfg Config) (Result, error) {
	b := &benchCmd{Config: cfg}
	if err := b.Validate(); err != nil {
		return Result{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, b.Timeout)
	defer cancel()
	res, err := b.runOnce(ctx)
	if err != nil {
		return res, err
	}
	return res, res.verdict()
}

// Result is the JSON report.
type Result struct {
	Mode                   string  `json:"mode"`
	Provider               string  `json:"provider"`
	Payments               int     `json:"payments"`
	Duplicates             int     `json:"duplicates"`
	Messages               int     `json:"messages"`
	Concurrency            int     `json:"concurrency"`
	ProviderLatencyMS      float64 `json:"provider_latency_ms"`
	Seconds                float64 `json:"seconds"`
	PaymentsPerSec         float64 `json:"payments_per_sec"`
	MessagesPerSec         float64 `json:"messages_per_sec"`
	P50MS                  float64 `json:"p50_ms"`
	P99MS                  float64 `json:"p99_ms"`
	PGRoundTripsPerPayment float64 `json:"pg_round_trips_per_payment"`
	PGPoolSize             int     `json:"pg_pool_size"`
	RSSMB                  float64 `json:"rss_mb"`
	DoubleCharges          int     `json:"double_charges"`
	Lost                   int     `json:"lost"`
	// With --warmup: the payments worked before the timed ones, by a
	// worker of their own; every figure but the check of the ledger (which
	// covers them too) is of the timed payments.
	WarmupPayments          int     `json:"warmup_payments,omitempty"`
	CompletedDuplicates     int     `json:"completed_duplicates,omitempty"`
	CompletedDupSeconds     float64 `json:"completed_duplicates_seconds,omitempty"`
	CompletedDupMessagesSec float64 `json:"completed_duplicates_per_sec,omitempty"`

	// CPU time per unique payment over the consumption phase, in µs (see
	// cpu.go for how the process's time is split). PGCPUUSPerPayment is
	// -1 when the server's processes cannot be read from this machine.
	PGCPUUSPerPayment float64 `json:"pg_cpu_us_per_payment"`
	PGBackends        int     `json:"pg_backends"`
	// The cluster's WAL written over the consumption phase, per payment,
	// and the checkpoints the cluster began meanwhile (pg_stat_bgwriter):
	// a page's first change after a checkpoint logs the whole page. Both
	// are the whole cluster's (the bench is its only writer when nothing
	// else runs); -1 when the server does not tell.
	PGWALBytesPerPayment    float64 `json:"pg_wal_bytes_per_payment"`
	PGCheckpoints           int     `json:"pg_checkpoints"`
	WorkerCPUUSPerPayment   float64 `json:"worker_cpu_us_per_payment"`
	SimCPUUSPerPayment      float64 `json:"sim_cpu_us_per_payment"`
	NATSCPUUSPerPayment     float64 `json:"nats_cpu_us_per_payment"`
	ProcessCPUUSPerPayment  float64 `json:"process_cpu_us_per_payment"`
	ProcessAllocsPerPayment float64 `json:"process_allocs_per_payment"` // heap allocations, worker, simulator and NATS server together
	// The outbox relay's lag over the timed run (sampled every 100 ms):
	// the oldest unrelayed outcome event's largest age, the largest
	// backlog, and how long after the last settle the outbox was empty.
	OutcomeLagMaxMS     float64 `json:"outcome_lag_max_ms"`
	OutcomeUnrelayedMax int64   `json:"outcome_unrelayed_max"`
	OutcomeDrainMS      float64 `json:"outcome_drain_ms"`
	// Mean rows per claim round trip and per group commit.
	ClaimBatchMean  float64 `json:"claim_batch_mean"`
	CommitBatchMean float64 `json:"commit_batch_mean"`
	// The same for the completed-duplicates phase, per message.
	CompletedDupPGCPUUS     float64 `json:"completed_duplicates_pg_cpu_us,omitempty"`
	CompletedDupWorkerCPUUS float64 `json:"completed_duplicates_worker_cpu_us,omitempty"`
	// The live heap at the end by part, after a GC (heap profile).
	HeapWorkerMB float64 `json:"heap_worker_mb"`
	HeapSimMB    float64 `json:"heap_sim_mb"`
	HeapNATSMB   float64 `json:"heap_nats_mb"`

	// With --preload-rows: the finished payments in the tables before the
	// run, and how long they took to write and to vacuum or analyze.
	PreloadRows          int     `json:"preload_rows"`
	PreloadKeys          int     `json:"preload_keys"`
	PreloadSeconds       float64 `json:"preload_seconds,omitempty"`
	PreloadVacuumSeconds float64 `json:"preload_vacuum_seconds,omitempty"`
	PreloadLedgerMB      float64 `json:"preload_ledger_mb,omitempty"`
	PreloadKeysMB        float64 `json:"preload_keys_mb,omitempty"`
	// With --window: the rate and the resident set per window of settled
	// payments of the consumption phase.
	Windows []Window `json:"windows,omitempty"`

	// With --compare-naive: the naive design at each concurrency, the
	// best of them, and this run's payments/s over the best's.
	Naive            []Result `json:"naive,omitempty"`
	NaiveBest        int      `json:"naive_best_concurrency,omitempty"`
	NaiveBestPerSec  float64  `json:"naive_best_payments_per_sec,omitempty"`
	RatioToBestNaive float64  `json:"ratio_to_best_naive,omitempty"`
}

// NaiveConcurrencies are the handler counts --compare-naive tries.
var NaiveConcurrencies = []int{1, 8, 32}

func (b *benchCmd) run(ctx context.Context) error {
	if err := b.Validate(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, b.Timeout)
	defer cancel()
	res, err := b.runOnce(ctx)
	if err != nil {
		return err
	}
	if b.CompareNaive {
		for _, n := range NaiveConcurrencies {
			nb := &benchCmd{Config: b.Config}
			nb.Mode, nb.Concurrency, nb.Payments, nb.Duplicates = "naive", n, b.NaivePayments, 0
			nb.CompletedDuplicates, nb.CompareNaive, nb.CPUProfile, nb.MemProfile = false, false, "", ""
			nb.Window = 0
			nr, err := nb.runOnce(ctx)
			if err != nil {
				return fmt.Errorf("naive at concurrency %d: %w", n, err)
			}
			if err := nr.verdict(); err != nil {
				return fmt.Errorf("naive at concurrency %d: %w", n, err)
			}
			res.Naive = append(res.Naive, nr)
			if nr.PaymentsPerSec > res.NaiveBestPerSec {
				res.NaiveBest, res.NaiveBestPerSec = n, nr.PaymentsPerSec
			}
		}
		res.RatioToBestNaive = res.PaymentsPerSec / res.NaiveBestPerSec
	}
	b.report(res)
	return res.verdict()
}

// poolSize is the run's PostgreSQL pool: the worker's (PoolSize) in
// batched mode; in naive mode at least one connection per handler, as the
// per-message design runs each handler's statements on its own.
func (b *benchCmd) poolSize() int {
	if b.Mode == "naive" {
		return max(b.PoolSize, b.Concurrency)
	}
	return b.PoolSize
}

// runOnce sets up, runs and checks one bench run.
func (b *benchCmd) runOnce(ctx context.Context) (Result, error) {
	var res Result
	say := func(format string, args ...any) { fmt.Fprintf(b.ErrOut, "bench: "+format+"\n", args...) }

	natsURL, stopNATS := b.NATSURL, func() {}
	if natsURL == "" {
		var err error
		// Under its label, so that its CPU is told apart from the worker's.
		labelled(ctx, labelNATS, func(context.Context) { natsURL, stopNATS, err = inproc.NATS() })
		if err != nil {
			return res, fmt.Errorf("bench: %w", err)
		}
		say("no NATS_URL: embedded JetStream server at %s", natsURL)
	}
	defer stopNATS()

	dbURL := b.DatabaseURL
	if dbURL == "" {
		srv, err := localpg.Find(ctx, b.AdminURL)
		if err != nil {
			return res, fmt.Errorf("bench: %w", err)
		}
		defer srv.Close()
		say("no DATABASE_URL: PostgreSQL is %s", srv.Where)
		u, _, err := localpg.Database(ctx, srv.AdminURL, Database, b.poolSize())
		if err != nil {
			return res, fmt.Errorf("bench: %w", err)
		}
		dbURL = u
	}
	suffix := procstat.RunSuffix()
	schemaURL, dropSchema, err := localpg.FreshSchema(ctx, dbURL, "bench_"+suffix)
	if err != nil {
		return res, fmt.Errorf("bench: %w", err)
	}
	defer func() { _ = dropSchema() }()
	// The pool's backends are found by this name to read their CPU time.
	appName := "paydedup-bench-" + suffix
	appURL, err := localpg.WithAppName(schemaURL, appName)
	if err != nil {
		return res, fmt.Errorf("bench: %w", err)
	}
	pool, err := pg.Connect(ctx, appURL, pg.WithMaxConns(b.poolSize()))
	if err != nil {
		return res, fmt.Errorf("bench: %w", err)
	}
	defer pool.Close()
	if err := localpg.Migrate(ctx, pool, nil); err != nil {
		return res, fmt.Errorf("bench: %w", err)
	}
	pids := func(ctx context.Context) ([]int, error) { return localpg.BackendPIDs(ctx, pool, appName) }
	store, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		return res, err
	}

	nc, err := nats.Connect(natsURL, nats.Name("paydedup-bench"))
	if err != nil {
		return res, fmt.Errorf("bench: connect to NATS: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return res, err
	}
	cfg := b.workerConfig(suffix)
	cfg.Stream.DLQKey = b.DLQKey
	if _, _, err := stream.EnsureStreams(ctx, js, cfg.Stream); err != nil {
		return res, fmt.Errorf("bench: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(cctx, cfg.Stream.Name)
		_ = js.DeleteStream(cctx, cfg.Stream.DLQStream)
		_ = js.DeleteStream(cctx, cfg.Stream.AdvisoryStream)
		_ = js.DeleteStream(cctx, cfg.Stream.OutcomeStream)
	}()
	// The outbox relay, as every worker runs it (cmd/paydedup/outcomes.go).
	if _, err := stream.EnsureOutcomeStream(ctx, js, cfg.Stream); err != nil {
		return res, fmt.Errorf("bench: %w", err)
	}
	relay, err := outbox.New(outbox.Config{}, outbox.Outcomes(store, stream.NewOutcomePublisher(js, cfg.Stream, 0)))
	if err != nil {
		return res, err
	}
	if err := relay.Start(ctx); err != nil {
		return res, err
	}
	defer relay.Stop()

	sim := stripesim.New(stripesim.Config{Faults: stripesim.Faults{Latency: b.ProviderLatency}})
	const apiKey = "sk_test_paydedup_bench"
	var prov consumer.Charger = simCharger{sim.Client(apiKey)}
	if b.Provider == "stripe" {
		st, err := stripe.New(stripe.Config{
			SecretKey: apiKey, APIBase: "http://sim.invalid", Timeout: 30 * time.Second,
			HTTPClient: &http.Client{Transport: inProcess{sim}},
		})
		if err != nil {
			return res, err
		}
		prov = st
	}

	db := DB{
		Exec: func(ctx context.Context, sql string, args ...any) error {
			_, err := pool.Exec(ctx, sql, args...)
			return err
		},
		Scan: func(ctx context.Context, sql string, dest []any, args ...any) error {
			return pool.QueryRow(ctx, sql, args...).Scan(dest...)
		},
	}
	var pre PreloadStats
	if b.PreloadRows > 0 {
		say("preloading %d finished payments, %d of them with their keys", b.PreloadRows, min(b.PreloadKeys, b.PreloadRows))
		pre, err = PreloadFill(ctx, db, Preload{Rows: b.PreloadRows, Keys: b.PreloadKeys, Vacuum: b.PreloadVacuum, Progress: b.ErrOut})
		if err != nil {
			return res, err
		}
	}

	// Each store call the worker makes is one round trip to Postgres.
	counting := storehook.Wrap(store)
	log := shippedLogger()
	proc := consumer.NewProcessor(counting, prov, cfg, log)

	// The warm-up: Warmup payments of their own, published and worked as
	// the timed ones are, by a worker of their own that stops once they
	// are settled, untimed and unmetered. What a run right after a bulk
	// load pays once (the first reads of the loaded pages, the first
	// writes of their hint bits) is not what a deployment pays on tables
	// it has been writing to for days.
	if b.Warmup > 0 {
		say("warm-up: publishing and working %d payments, untimed", b.Warmup)
		t0 := time.Now()
		if err := benchPublish(ctx, js, cfg, workload.Numbered{N: b.Warmup}, 0); err != nil {
			return res, err
		}
		if err := b.work(ctx, nc, proc, cfg, log, newBenchObserver(), b.Warmup, say); err != nil {
			return res, fmt.Errorf("bench: warm-up: %w", err)
		}
		say("warm-up: %d payments settled in %.1f s", b.Warmup, time.Since(t0).Seconds())
	}

	dups := int(math.Round(b.Duplicates * float64(b.Payments)))
	total := b.Warmup + b.Payments // the timed payments are numbered after the warm-up's
	say("publishing %d payments + %d duplicates to %s", b.Payments, dups, cfg.Stream.Name)
	if err := benchPublish(ctx, js, cfg, workload.Numbered{N: total, Dups: dups}, b.Warmup); err != nil {
		return res, err
	}

	obs := newBenchObserver()
	if b.Window > 0 {
		obs.win = &windows{size: int64(b.Window)}
	}
	w, err := consumer.NewWorker(nc, proc, cfg, log, obs, nil)
	if err != nil {
		return res, err
	}
	tripsBefore := counting.Calls(storehook.Any)
	walBefore := readWAL(ctx, db)
	meter, err := startCPU(ctx, pids, b.CPUProfile)
	if err != nil {
		return res, err
	}
	metering := true
	defer func() {
		if metering {
			pprof.StopCPUProfile()
		}
	}()
	wctx, stopWorker := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	lag := watchOutbox(wctx, store)
	go func() { done <- w.Run(wctx) }()
	messages := b.Payments + dups
	if err := b.waitSettled(ctx, nc, obs, int64(messages), start, say); err != nil {
		stopWorker()
		<-done
		return res, err
	}
	end := time.Now()
	if err := lag.drained(ctx, store, end); err != nil {
		stopWorker()
		<-done
		return res, err
	}
	elapsed := end.Sub(start)
	roundTrips := counting.Calls(storehook.Any) - tripsBefore
	cpu, err := meter.stop(ctx, b.Payments)
	metering = false
	walBytes, checkpoints := readWAL(ctx, db).since(walBefore, b.Payments)
	if err != nil {
		stopWorker()
		<-done
		return res, err
	}

	res = Result{
		Mode: b.Mode, Provider: b.Provider, Payments: b.Payments, Duplicates: dups, Messages: messages, Concurrency: cfg.Concurrency,
		PGPoolSize:        int(pool.Config().MaxConns),
		ProviderLatencyMS: float64(b.ProviderLatency) / float64(time.Millisecond),
		Seconds:           elapsed.Seconds(), PaymentsPerSec: float64(b.Payments) / elapsed.Seconds(),
		MessagesPerSec: float64(messages) / elapsed.Seconds(),
		P50MS:          obs.quantile(0.50), P99MS: obs.quantile(0.99),
		PGRoundTripsPerPayment: float64(roundTrips) / float64(b.Payments),
		PGCPUUSPerPayment:      cpu.PGUS, PGBackends: cpu.PGBackends, WorkerCPUUSPerPayment: cpu.WorkerUS,
		SimCPUUSPerPayment: cpu.SimUS, NATSCPUUSPerPayment: cpu.NATSUS, ProcessCPUUSPerPayment: cpu.ProcessUS,
		ProcessAllocsPerPayment: cpu.Allocs, WarmupPayments: b.Warmup,
		PGWALBytesPerPayment: walBytes, PGCheckpoints: checkpoints,
	}
	res.OutcomeLagMaxMS, res.OutcomeUnrelayedMax, res.OutcomeDrainMS = lag.result()
	res.ClaimBatchMean, res.CommitBatchMean = obs.batchMeans()
	res.PreloadRows, res.PreloadKeys, res.PreloadSeconds, res.PreloadVacuumSeconds = pre.Rows, pre.Keys, pre.LoadSeconds, pre.VacuumSeconds
	res.PreloadLedgerMB, res.PreloadKeysMB = pre.LedgerMB, pre.KeysMB
	if obs.win != nil {
		res.Windows = obs.win.rates(start, end, obs.paid.Load())
	}

	if b.CompletedDuplicates {
		obs.reset()
		say("republishing all %d payments, every key already completed", b.Payments)
		if err := benchPublish(ctx, js, cfg, workload.Numbered{N: b.Payments}, 0); err != nil {
			stopWorker()
			<-done
			return res, err
		}
		dupProfile := ""
		if b.CPUProfile != "" {
			dupProfile = b.CPUProfile + ".duplicates"
		}
		meter, err := startCPU(ctx, pids, dupProfile)
		if err != nil {
			stopWorker()
			<-done
			return res, err
		}
		start := time.Now()
		if err := b.waitSettled(ctx, nc, obs, int64(b.Payments), start, say); err != nil {
			pprof.StopCPUProfile()
			stopWorker()
			<-done
			return res, err
		}
		dcpu, err := meter.stop(ctx, b.Payments)
		if err != nil {
			stopWorker()
			<-done
			return res, err
		}
		res.CompletedDupPGCPUUS, res.CompletedDupWorkerCPUUS = dcpu.PGUS, dcpu.WorkerUS
		res.CompletedDuplicates = b.Payments
		res.CompletedDupSeconds = time.Since(start).Seconds()
		res.CompletedDupMessagesSec = float64(b.Payments) / res.CompletedDupSeconds
	}
	stopWorker()
	if err := <-done; err != nil {
		return res, err
	}
	heap, err := heapSplit()
	if err != nil {
		return res, fmt.Errorf("bench: heap profile: %w", err)
	}
	res.HeapWorkerMB, res.HeapSimMB, res.HeapNATSMB = heap.WorkerMB, heap.SimMB, heap.NATSMB
	if b.MemProfile != "" {
		f, err := os.Create(b.MemProfile)
		if err != nil {
			return res, fmt.Errorf("bench: --memprofile: %w", err)
		}
		runtime.GC()
		err = pprof.WriteHeapProfile(f)
		f.Close()
		if err != nil {
			return res, fmt.Errorf("bench: --memprofile: %w", err)
		}
	}
	res.DoubleCharges, res.Lost, err = benchCheck(ctx, store, sim.ChargesByKey(), workload.Numbered{N: total})
	if err != nil {
		return res, err
	}
	// The peak of the whole run, the check of the ledger included.
	res.RSSMB = procstat.PeakRSSMB()

	return res, nil
}

// report prints the run: one JSON object, or lines for a person.
func (b *benchCmd) report(res Result) {
	if b.JSON {
		out, _ := json.Marshal(res)
		fmt.Fprintln(b.Out, string(out))
	} else {
		fmt.Fprintf(b.Out, "mode %s, provider %s: %d payments (+%d duplicates) in %.2f s: %.0f payments/s, %.0f messages/s\n",
			res.Mode, res.Provider, res.Payments, res.Duplicates, res.Seconds, res.PaymentsPerSec, res.MessagesPerSec)
		if res.WarmupPayments > 0 {
			fmt.Fprintf(b.Out, "(timed after a warm-up of %d payments, worked the same way and not counted)\n", res.WarmupPayments)
		}
		fmt.Fprintf(b.Out, "latency fetch→settle: p50 %.1f ms, p99 %.1f ms; %.2f Postgres round trips per payment; peak RSS %.0f MB\n",
			res.P50MS, res.P99MS, res.PGRoundTripsPerPayment, res.RSSMB)
		if res.CompletedDuplicates > 0 {
			fmt.Fprintf(b.Out, "completed duplicates: %d in %.2f s: %.0f messages/s; CPU per message: Postgres backends %s, worker %.1f µs\n",
				res.CompletedDuplicates, res.CompletedDupSeconds, res.CompletedDupMessagesSec, pgFigure(res.CompletedDupPGCPUUS), res.CompletedDupWorkerCPUUS)
		}
		fmt.Fprintf(b.Out, "CPU per payment: Postgres backends %s, worker %.1f µs, simulator %.1f µs, NATS server %.1f µs (process %.1f µs, %.0f allocations)\n",
			pgFigure(res.PGCPUUSPerPayment), res.WorkerCPUUSPerPayment, res.SimCPUUSPerPayment, res.NATSCPUUSPerPayment, res.ProcessCPUUSPerPayment, res.ProcessAllocsPerPayment)
		fmt.Fprintf(b.Out, "live heap at the end: worker %.1f MB, simulator %.1f MB, NATS server %.1f MB\n", res.HeapWorkerMB, res.HeapSimMB, res.HeapNATSMB)
		if res.PGWALBytesPerPayment >= 0 {
			fmt.Fprintf(b.Out, "PostgreSQL's WAL: %.0f bytes per payment, %d checkpoints begun during the run (the whole cluster's)\n",
				res.PGWALBytesPerPayment, res.PGCheckpoints)
		}
		fmt.Fprintf(b.Out, "outcome relay: oldest unrelayed event at most %.0f ms old, at most %d unrelayed; outbox empty %.0f ms after the last settle\n",
			res.OutcomeLagMaxMS, res.OutcomeUnrelayedMax, res.OutcomeDrainMS)
		if res.PreloadRows > 0 {
			fmt.Fprintf(b.Out, "preloaded %d ledger rows (%d with their keys) in %.0f s, +%.0f s vacuum/analyze; ledger %.0f MB, keys %.0f MB\n",
				res.PreloadRows, res.PreloadKeys, res.PreloadSeconds, res.PreloadVacuumSeconds, res.PreloadLedgerMB, res.PreloadKeysMB)
		}
		for _, w := range res.Windows {
			fmt.Fprintf(b.Out, "window to %d settled: %.0f payments/s, RSS %.0f MB\n", w.Settled, w.PaymentsPerSec, w.RSSMB)
		}
		for _, n := range res.Naive {
			fmt.Fprintf(b.Out, "naive, %d handlers: %d payments in %.2f s: %.0f payments/s; CPU per payment: Postgres %s, worker %.1f µs\n",
				n.Concurrency, n.Payments, n.Seconds, n.PaymentsPerSec, pgFigure(n.PGCPUUSPerPayment), n.WorkerCPUUSPerPayment)
		}
		if res.NaiveBestPerSec > 0 {
			fmt.Fprintf(b.Out, "batched / best naive (%d handlers): %.1f×\n", res.NaiveBest, res.RatioToBestNaive)
		}
		fmt.Fprintf(b.Out, "ledger: %d double charges, %d lost\n", res.DoubleCharges, res.Lost)
	}
}

// workerConfig is the worker under test: the shipped batched worker, or the
// seeds' one-at-a-time design.
func (b *benchCmd) workerConfig(suffix string) consumer.Config {
	name := "BENCH_" + strings.ToUpper(suffix)
	c := consumer.Config{
		Stream: stream.Config{
			Name: name, SubjectPrefix: "bench." + suffix + ".requests", DLQStream: name + "_DLQ",
			DLQPrefix: "bench." + suffix + ".dlq", Durable: "paydedup-bench",
			OutcomeStream: name + "_OUTCOMES", OutcomePrefix: "bench." + suffix + ".outcomes",
			DLQMaxAge: time.Hour, MaxAckPending: 20000,
		},
		Concurrency: b.Concurrency, FetchBatch: b.FetchBatch, CommitBatch: b.CommitBatch, CommitWait: b.CommitWait,
		Holder: "bench-" + suffix,
	}
	if b.Mode == "naive" {
		// Concurrency handlers, each message alone: a claim statement
		// (autocommit), the provider call, a complete statement
		// (autocommit), the ack.
		c.FetchBatch, c.CommitBatch = 1, 1
	}
	return c.WithDefaults()
}

// walMark is where the cluster's WAL stood, and how many checkpoints it
// had begun; ok is false when the server did not tell.
type walMark struct {
	lsn         string
	checkpoints int
	ok          bool
}

func readWAL(ctx context.Context, db DB) walMark {
	var m walMark
	err := db.Scan(ctx, `SELECT pg_current_wal_lsn()::text,
        (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter)::int`, []any{&m.lsn, &m.checkpoints})
	m.ok = err == nil
	return m
}

// since returns the WAL bytes per payment written since before, and the
// checkpoints begun since; -1 and -1 when either mark is missing.
func (m walMark) since(before walMark, payments int) (bytesPerPayment float64, checkpoints int) {
	if !m.ok || !before.ok {
		return -1, -1
	}
	end, err1 := parseLSN(m.lsn)
	start, err2 := parseLSN(before.lsn)
	if err1 != nil || err2 != nil {
		return -1, -1
	}
	return float64(end-start) / float64(max(payments, 1)), m.checkpoints - before.checkpoints
}

// parseLSN reads a pg_lsn's text form, two hexadecimal halves "X/Y".
func parseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("not an LSN: %q", s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("not an LSN: %q", s)
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("not an LSN: %q", s)
	}
	return h<<32 | l, nil
}

// work runs a worker of proc until obs has seen n settled messages, then
// stops it.
func (b *benchCmd) work(ctx context.Context, nc *nats.Conn, proc *consumer.Processor, cfg consumer.Config, log *slog.Logger, obs *benchObserver, n int, say func(string, ...any)) error {
	w, err := consumer.NewWorker(nc, proc, cfg, log, obs, nil)
	if err != nil {
		return err
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	err = b.waitSettled(ctx, nc, obs, int64(n), time.Now(), say)
	stop()
	return cmp.Or(err, <-done)
}

// waitSettled waits until the observer has seen n settled messages and the
// connection's acks reached the server, printing progress every second.
func (b *benchCmd) waitSettled(ctx context.Context, nc *nats.Conn, obs *benchObserver, n int64, start time.Time, say func(string, ...any)) error {
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
			// The acks the worker does not wait for (a duplicate's) reach
			// the server before the clock stops.
			if err := nc.FlushWithContext(ctx); err != nil {
				return fmt.Errorf("bench: flush the acks: %w", err)
			}
			return nil
		}
		if time.Since(last) >= time.Second {
			last = time.Now()
			say("%d/%d settled, %.0f msg/s", obs.acked.Load(), n, float64(obs.acked.Load())/time.Since(start).Seconds())
		}
	}
}

// benchPublish publishes the workload's payments from the first-th on, in
// its order, each copy with its own Nats-Msg-Id so the stream keeps it.
func benchPublish(ctx context.Context, js jetstream.JetStream, cfg consumer.Config, w workload.Numbered, first int) error {
	// Below nats.go's default limit of 4,000 outstanding async publishes.
	const window = 2048
	var failure error
	pub, err := stream.NewPublisher(js.Conn(), stream.PublisherConfig{
		Window: window,
		OnResult: func(r stream.PublishResult) {
			if r.Err != nil && failure == nil {
				failure = r.Err
			}
		},
	})
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	run := procstat.RunSuffix()
	for _, c := range w.Order() {
		if c.I < first {
			continue
		}
		p := w.Command(c.I)
		m := stream.CommandMsg(cfg.Stream, p.Cmd.MerchantID, p.Cmd.IdempotencyKey, p.Body)
		m.Header.Set(nats.MsgIdHdr, fmt.Sprintf("%s:%s:%d", run, p.Cmd.IdempotencyKey, c.N))
		if err := pub.Publish(ctx, m); err != nil {
			pub.Close()
			return fmt.Errorf("bench: publish: %w", err)
		}
	}
	if st := pub.Close(); st.Failed > 0 {
		return fmt.Errorf("bench: publish: %d messages got no PubAck: %w", st.Failed, failure)
	}
	return ctx.Err()
}

// checkChunk is how many payments' rows benchCheck reads at a time: the
// rows of all of them (stored responses included) would hold more memory
// than the rest of the run.
const checkChunk = 5000

// benchCheck counts double charges and lost payments against the
// provider's charges (by "merchant_id:idempotency_key"): every payment's
// row, read a chunk at a time.
func benchCheck(ctx context.Context, store workload.Getter, charges map[string]int, w workload.Numbered) (double, lost int, err error) {
	refs, expected := w.Refs(), w.Expected()
	for lo := 0; lo < len(refs); lo += checkChunk {
		hi := min(lo+checkChunk, len(refs))
		rows, err := workload.StoreRows(ctx, store, refs[lo:hi])
		if err != nil {
			return 0, 0, err
		}
		d, l := benchJudge(charges, rows, expected[lo:hi])
		double, lost = d, lost+l
	}
	return double, lost, nil
}

// benchJudge counts the keys the provider charged more than once (of all
// its charges) and, of the expected payments, those that were not charged
// exactly as recorded. charges and rows are by
// "merchant_id:idempotency_key".
func benchJudge(charges map[string]int, rows map[string]workload.Row, expected []workload.Expected) (double, lost int) {
	t := workload.Check(expected, rows, charges)
	return len(t.Double), len(t.Unsettled) + len(t.Disagree)
}

// verdict fails a run that charged any key twice or lost a payment.
func (r Result) verdict() error {
	if r.DoubleCharges > 0 || r.Lost > 0 {
		return fmt.Errorf("bench: %d double charges, %d lost", r.DoubleCharges, r.Lost)
	}
	return nil
}

// benchObserver counts settled messages and keeps a fixed-size latency
// histogram, so memory does not grow with the number of payments.
type benchObserver struct {
	consumer.NopObserver
	acked atomic.Int64
	// paid counts the settled messages that settled a payment (charged or
	// declined), for win (nil without --window).
	paid atomic.Int64
	win  *windows
	// claims and commits count batches; claimed and committed their rows.
	claims, claimed, commits, committed atomic.Int64
	mu                                  sync.Mutex
	buckets                             [latencyBuckets]int64
	total                               int64
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

// Claimed and Committed count batches and their rows.
func (o *benchObserver) Claimed(_ time.Duration, n int) {
	o.claims.Add(1)
	o.claimed.Add(int64(n))
}

func (o *benchObserver) Committed(_ time.Duration, n int) {
	o.commits.Add(1)
	o.committed.Add(int64(n))
}

// batchMeans returns the mean rows per claim and per commit.
func (o *benchObserver) batchMeans() (claim, commit float64) {
	mean := func(rows, batches int64) float64 {
		if batches == 0 {
			return 0
		}
		return float64(rows) / float64(batches)
	}
	return mean(o.claimed.Load(), o.claims.Load()), mean(o.committed.Load(), o.commits.Load())
}

// Settled counts messages that are done: acked or dead-lettered (a nakked
// one comes back).
func (o *benchObserver) Settled(kind consumer.Kind, act consumer.Action) {
	if act.Kind == consumer.Nak {
		return
	}
	o.acked.Add(1)
	if kind == consumer.Completed || kind == consumer.Declined {
		if n := o.paid.Add(1); o.win != nil && n%o.win.size == 0 {
			o.win.mark(n, time.Now())
		}
	}
}
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
	labelled(r.Context(), labelSim, func(context.Context) { t.h.ServeHTTP(rec, r.WithContext(r.Context())) })
	resp := rec.Result()
	resp.Request = r
	return resp, nil
}

// shippedLogger logs as `paydedup worker` does by default, JSON at info (a
// line per payment), into io.Discard: the bench pays for making the lines,
// as the shipped worker does, but not for writing them to a terminal.
func shippedLogger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
}
