// Command chaos is paydedup's fault harness. It runs the real binary as
// separate processes (three workers, the provider simulator) against its
// own nats-server and its own Postgres cluster, publishes a workload of
// payments with duplicates, malformed messages and key reuses, and while it
// runs SIGKILLs a worker every 1-3 s, kills NATS (-9) and restarts it with
// its store twice, and stops Postgres in immediate mode and restarts it
// twice. Then it waits for quiescence, replays the max_deliveries dead
// letters once, and checks the provider's ledger and the database: no key
// charged twice, no valid payment lost, nothing left pending.
//
//	go run ./lab/cmd/chaos -payments 2000     # CI (make chaos-short)
//	go run ./lab/cmd/chaos -payments 20000 -nats-cluster 3 -pauses 3 -net-latency -net-cuts -net-partitions -pg-failover 2  # make chaos
//	go run ./lab/cmd/chaos -scale 1,2,4,8     # make chaos-scale
//	go run ./lab/cmd/chaos -soak 30m          # make soak
//
// The modes (a three-node NATS cluster, worker pauses, network faults, the
// scale and soak runs, Postgres failover) each live in their own file.
//
// With -pg-failover N, Postgres is a pg_auto_failover formation (a
// monitor, a primary and a synchronous standby) and the Postgres faults are
// N kills -9 of the primary, each waited through the promotion and the old
// primary's return as the standby (failover.go). In every mode the harness
// also checks what the workers saw committed (each ack they sent, each
// charge the provider made) against the database at the end, and follows
// the outcome events (payments.outcomes.>) through the whole run: each
// payment of the ledger must have its events, one final event each,
// matching the ledger (outcomes.go).
//
// With -gateway-clients N, a `paydedup gateway` runs too, and N HTTP
// clients (the Go client package) pay through it (gwclients.go);
// at the end every answer's promise is checked against the provider's
// ledger (promise.go). -puback-losses, -provider-outage and -pg-long-stop
// add the outage faults of outage.go, and -replay none leaves the
// max_deliveries dead letters where they are, so a run shows whether a
// fault dead-lettered a good payment.
//
// In the gateway mode about 12 % of the clients' payments also go through
// the money lifecycle (lifecycle.go): authorized then captured (all or
// part) then refunded, authorized then canceled, or charged then
// refunded, each operation under its own key through the HTTP door, sent
// once its payment is settled, retried by the client like a payment. At
// the end the operations are checked against the provider's own ledger
// (checkOperations): no refund, capture or cancel executed twice, no
// payment refunded past what it received, every accepted operation ended
// as told.
//
// -provider-rate-limit, -provider-concurrency-limit,
// -provider-latency-median and -provider-latency-p99 make the simulator the
// provider as it really is: slow, and limiting the account, answering 429
// rate_limit past its limits (ratelimit.go). Every run reports what the
// provider saw (the simulator's GET /_sim/stats) and the workers' pauses.
//
// The last line is the summary; the exit status is non-zero on any
// violation, with the offending keys listed above it. Every process and
// temporary directory it starts is removed on exit, on failure and on
// SIGINT (-keep keeps the directory and its logs).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/lab/localpg"
	"github.com/paydedup/paydedup/lab/workload"
	"github.com/paydedup/paydedup/stream"
)

type config struct {
	payments   int
	workers    int
	duration   time.Duration // the fault phase; 0: from the payment count
	quiesce    time.Duration // how long to wait for quiescence after the faults
	seed       uint64
	bin        string
	keep       bool
	natsServer string
	pgBin      string

	lease, ackWait, providerTimeout time.Duration
	maxDeliver                      int

	rate5xx, rate429, dropAfterCharge float64
	latency, jitter                   time.Duration

	natsRestarts, pgRestarts int
	replay                   string // auto, cli, self or none

	// The modes of issue 19, each in its own file.
	natsCluster int           // nodes of a clustered NATS (cluster.go); 0: one server
	pauses      int           // workers SIGSTOPped and SIGCONTed (pause.go)
	pauseFor    time.Duration // how long each pause lasts

	netLatency, netCuts, netPartitions bool // network faults (netfault.go)

	scale         []int // worker counts of the scale mode (scale.go)
	scalePayments int

	soak                       time.Duration // the soak mode's length (soak.go); 0: no soak
	soakRate                   float64
	soakFaultEvery, soakSample time.Duration

	// pgFailover > 0 runs Postgres as a pg_auto_failover formation and
	// kills -9 its primary that many times instead of the restarts
	// (failover.go).
	pgFailover      int
	pgFailoverAsync bool // the negative control: an asynchronous standby

	// The gateway mode and the outage faults (gwclients.go, outage.go).
	gatewayClients, gatewayPayments int
	gatewayPublishTimeout           time.Duration
	clientGiveUp                    time.Duration
	pubAckLosses, gatewayKills      int
	clientsNewKeyOn503              bool // the negative control: clients that break the contract
	providerOutage, pgLongStop      time.Duration

	// The provider as it really is (ratelimit.go): the simulator's latency
	// model and account limits, the workers' fleet budget.
	providerRateLimit                         float64 // requests/s of the account; 0: none
	providerConcurrencyLimit                  int     // requests in flight of the account; 0: none
	providerLatencyMedian, providerLatencyP99 time.Duration
	providerRate                              float64 // PAYDEDUP_PROVIDER_RATE; 0: not set
	providerMax429Share                       float64 // a violation above it; 0: not checked
}

func main() {
	var cfg config
	flag.IntVar(&cfg.payments, "payments", 20000, "valid unique payments to publish")
	flag.IntVar(&cfg.workers, "workers", 3, "worker processes")
	flag.DurationVar(&cfg.duration, "duration", 0, "length of the fault phase (default: 40s, or payments/100 seconds if longer)")
	flag.DurationVar(&cfg.quiesce, "quiesce-timeout", 0, "how long to wait for quiescence after the faults (default: 2m + payments/100 seconds)")
	flag.Uint64Var(&cfg.seed, "seed", 0, "random seed (0: from the clock); printed, so a run can be repeated")
	flag.StringVar(&cfg.bin, "bin", "", "paydedup binary to run (default: go build ./cmd/paydedup into the work directory)")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the work directory (logs, stores) instead of removing it")
	flag.StringVar(&cfg.natsServer, "nats-server", "/usr/sbin/nats-server", "nats-server binary")
	flag.StringVar(&cfg.pgBin, "pg-bin", "", "directory of initdb, postgres and pg_ctl (default: pg_config --bindir, else the newest /usr/lib/postgresql/*/bin)")
	flag.DurationVar(&cfg.lease, "lease", 5*time.Second, "worker lease (PAYDEDUP_LEASE)")
	flag.DurationVar(&cfg.ackWait, "ack-wait", 8*time.Second, "JetStream AckWait (PAYDEDUP_ACK_WAIT)")
	flag.DurationVar(&cfg.providerTimeout, "provider-timeout", time.Second, "one provider call (PAYDEDUP_PROVIDER_TIMEOUT); two tries per delivery")
	flag.IntVar(&cfg.maxDeliver, "max-deliver", 5, "deliveries before a message is dead-lettered max_deliveries (PAYDEDUP_MAX_DELIVER)")
	flag.Float64Var(&cfg.rate5xx, "rate-5xx", 0.05, "simulator: fraction of requests answered 500")
	flag.Float64Var(&cfg.rate429, "rate-429", 0.05, "simulator: fraction of requests answered 429")
	flag.Float64Var(&cfg.dropAfterCharge, "drop-after-charge", 0.1, "simulator: fraction of charges whose connection is dropped")
	flag.DurationVar(&cfg.latency, "latency", 2*time.Millisecond, "simulator: latency of every request")
	flag.DurationVar(&cfg.jitter, "jitter", 10*time.Millisecond, "simulator: random extra latency")
	flag.IntVar(&cfg.natsRestarts, "nats-restarts", 2, "times NATS is killed (-9) and restarted")
	flag.IntVar(&cfg.pgRestarts, "pg-restarts", 2, "times Postgres is stopped (immediate) and restarted")
	flag.IntVar(&cfg.pgFailover, "pg-failover", 0, "run Postgres as a pg_auto_failover formation (monitor, primary, synchronous standby) and kill -9 the primary this many times instead of -pg-restarts")
	flag.BoolVar(&cfg.pgFailoverAsync, "pg-failover-async", false, "with -pg-failover: keep the standby out of the replication quorum (asynchronous), the negative control: the commit check should find what the kills lost")
	flag.StringVar(&cfg.replay, "replay", "auto", "how to replay max_deliveries dead letters: cli (paydedup dlq replay), self (the harness), auto (cli when the binary has it), none (not at all: a good payment a fault dead-lettered is then reported lost)")
	flag.IntVar(&cfg.gatewayClients, "gateway-clients", 0, "run a paydedup gateway and this many HTTP clients paying -gateway-payments through it by the client contract, and check each answer's promise at the end (0: no gateway)")
	flag.IntVar(&cfg.gatewayPayments, "gateway-payments", 500, "with -gateway-clients: payments the clients make through the gateway")
	flag.DurationVar(&cfg.gatewayPublishTimeout, "gateway-publish-timeout", 2*time.Second, "with -gateway-clients: the gateway's PAYDEDUP_PUBLISH_TIMEOUT")
	flag.DurationVar(&cfg.clientGiveUp, "client-give-up", time.Minute, "with -gateway-clients: how long a client retries one payment before it gives up without a final answer")
	flag.IntVar(&cfg.pubAckLosses, "puback-losses", 0, "with -gateway-clients: times the gateway's link to NATS holds back everything NATS sends for longer than the publish timeout (its PUBs are stored, their PubAcks lost)")
	flag.BoolVar(&cfg.clientsNewKeyOn503, "clients-new-key-on-503", false, "with -gateway-clients: the negative control: clients break the contract and pay again under a new key after any 503; the promise check should find payments charged under two keys")
	flag.IntVar(&cfg.gatewayKills, "gateway-kills", 0, "with -gateway-clients: times the gateway is killed (-9) mid-run and started again (its clients see resets and refused connections)")
	flag.DurationVar(&cfg.providerOutage, "provider-outage", 0, "once, refuse every worker connection to the provider for this long (longer than the delivery schedule, e.g. 30s); 0: no outage")
	flag.DurationVar(&cfg.pgLongStop, "pg-long-stop", 0, "the first Postgres stop lasts this long instead of a second (longer than -lease, e.g. 8s); 0: off")
	flag.Float64Var(&cfg.providerRateLimit, "provider-rate-limit", 0, "simulator: the account's requests per second (every endpoint, every worker, the reconciler and the audit alike), answered 429 rate_limit global-rate past it (--rate-limit; Stripe live mode 100); 0: none")
	flag.IntVar(&cfg.providerConcurrencyLimit, "provider-concurrency-limit", 0, "simulator: the account's requests in flight, answered 429 rate_limit global-concurrency past it (--concurrency-limit); 0: none")
	flag.DurationVar(&cfg.providerLatencyMedian, "provider-latency-median", 0, "simulator: median of a log-normal latency of every request (--latency-median), on top of -latency and -jitter; 0: none")
	flag.DurationVar(&cfg.providerLatencyP99, "provider-latency-p99", 0, "simulator: 99th percentile of that latency (--latency-p99), under -provider-timeout; 0: always the median")
	flag.Float64Var(&cfg.providerRate, "provider-rate", 0, "the workers' fleet-wide provider budget in requests per second (PAYDEDUP_PROVIDER_RATE, set only when this is); 0: not set")
	flag.Float64Var(&cfg.providerMax429Share, "provider-max-429-share", 0, "a violation when the account's limits answered more than this share (0..1) of the provider requests 429 (the injected -rate-429 ones not counted); 0: reported, not checked")
	flag.IntVar(&cfg.natsCluster, "nats-cluster", 0, "run a NATS cluster of this many nodes (3), streams with one replica each; NATS restarts then kill -9 single nodes, the stream leader among them (0: one server)")
	flag.IntVar(&cfg.pauses, "pauses", 0, "times a worker holding claims is SIGSTOPped for -pause-for, then SIGCONTed")
	flag.DurationVar(&cfg.pauseFor, "pause-for", 0, "length of a pause (default: AckWait + 2 leases, so its messages are redelivered and its leases taken over)")
	flag.BoolVar(&cfg.netLatency, "net-latency", false, "network faults: add latency on one worker link (Postgres, a NATS node, the provider) at a time, through toxiproxy")
	flag.BoolVar(&cfg.netCuts, "net-cuts", false, "network faults: reset the connections of one worker link mid-request")
	flag.BoolVar(&cfg.netPartitions, "net-partitions", false, "network faults: partition one worker link completely for longer than the lease")
	scale := flag.String("scale", "", "scale mode instead of a chaos run: worker counts to measure one after another, e.g. 1,2,4,8 (the simulator at 20 ms unless -latency says otherwise, no faults)")
	flag.IntVar(&cfg.scalePayments, "scale-payments", 5000, "scale mode: payments each worker count drains")
	flag.DurationVar(&cfg.soak, "soak", 0, "soak mode instead of a chaos run: steady load with periodic faults for this long, checking the workers' memory, goroutines, descriptors, connections and pending rows stay flat (make soak: 30m)")
	flag.Float64Var(&cfg.soakRate, "soak-rate", 50, "soak mode: payments published per second")
	flag.DurationVar(&cfg.soakFaultEvery, "soak-fault-every", 40*time.Second, "soak mode: one fault (worker kill, NATS restart, Postgres restart, in turn) this often")
	flag.DurationVar(&cfg.soakSample, "soak-sample", 10*time.Second, "soak mode: how often the figures are sampled")
	flag.Parse()
	if *scale != "" {
		var err error
		if cfg.scale, err = parseScale(*scale); err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			os.Exit(2)
		}
		cfg.scaleDefaults()
	}
	if cfg.pauseFor == 0 {
		cfg.pauseFor = cfg.ackWait + 2*cfg.lease
	}
	if err := cfg.validateModes(); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	if cfg.seed == 0 {
		cfg.seed = uint64(time.Now().UnixNano())
	}
	if cfg.duration == 0 {
		cfg.duration = max(40*time.Second, time.Duration(cfg.payments/100)*time.Second)
		if cfg.pgFailover > 0 { // a failover and the old primary's return take 15-30 s here
			cfg.duration = max(cfg.duration, time.Duration(cfg.pgFailover+cfg.natsRestarts)*30*time.Second)
		}
	}
	if cfg.quiesce == 0 {
		cfg.quiesce = 2*time.Minute + time.Duration(cfg.payments/100)*time.Second
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, cfg, os.Stdout)
	stop()
	os.Exit(code)
}

// harness holds one run's processes and connections.
type harness struct {
	cfg   config
	out   io.Writer
	work  string // temporary directory: stores, logs, binary
	logs  string
	bin   string
	procs registry

	pg       *localpg.Cluster
	nats     *proc
	natsAddr string
	sim      *proc
	simAddr  string
	slots    []*slot
	cluster  *natsCluster // -nats-cluster

	pauseStats pauseStats
	net        *netFaults   // -net-*
	gw         *gatewayRun  // -gateway-clients
	outage     *outages     // -puback-losses, -provider-outage, -pg-long-stop
	load       providerLoad // what the provider saw, read at the end (ratelimit.go)

	outcomes        outcomeWatch // the reader of the outcome events (outcomes.go)
	outcomeVerdict  outcomeVerdict
	outcomesChecked bool

	nc *nats.Conn
	js jetstream.JetStream
	// dlqKey is this run's PAYDEDUP_DLQ_KEY: the workers authenticate
	// dead letters with it and dlq replay verifies them.
	dlqKey string

	outMu sync.Mutex
	start time.Time

	kills, natsRestarts, pgRestarts atomic.Int64
	published                       atomic.Int64

	fo          *formation    // the failover mode's Postgres, else nil
	witness     commitWitness // what the workers saw committed
	pgFailovers atomic.Int64
	restarting  atomic.Int32 // a NATS or Postgres restart under way (the PubAck losses wait it out)
}

func (h *harness) logf(format string, args ...any) {
	h.outMu.Lock()
	defer h.outMu.Unlock()
	fmt.Fprintf(h.out, "chaos: %6.1fs "+format+"\n", append([]any{time.Since(h.start).Seconds()}, args...)...)
}

// streamConfig is the consumer configuration the workers run with, so the
// harness's EnsureStreams and the workers' agree.
func (h *harness) streamConfig() consumer.Config {
	return consumer.Config{Stream: stream.Config{AckWait: h.cfg.ackWait, MaxDeliver: h.cfg.maxDeliver, DLQKey: []byte(h.dlqKey),
		Replicas: h.replicas()}, Lease: h.cfg.lease}.WithDefaults()
}

// run is the whole harness; it returns the exit status.
func run(ctx context.Context, cfg config, out io.Writer) int {
	h := &harness{cfg: cfg, out: out, start: time.Now(),
		dlqKey: fmt.Sprintf("chaos-%016x%016x%016x", rand.Uint64(), rand.Uint64(), rand.Uint64())}
	work, err := os.MkdirTemp("", "paydedup-chaos-")
	if err != nil {
		fmt.Fprintln(out, "chaos:", err)
		return 2
	}
	h.work, h.logs = work, filepath.Join(work, "logs")
	// Cleanup runs on every path out, a failure or SIGINT included.
	defer func() {
		if h.nc != nil {
			h.nc.Close()
		}
		h.procs.killAll()
		h.fo.stop()
		if h.pg != nil {
			h.pg.Kill()
		}
		if cfg.keep {
			fmt.Fprintf(out, "chaos: kept %s (logs in %s)\n", work, h.logs)
			return
		}
		if err := os.RemoveAll(work); err != nil {
			fmt.Fprintln(out, "chaos: remove work directory:", err)
		}
	}()
	// Postgres, running as its own user, must be able to reach its data
	// directory inside ours.
	if err := os.Chmod(work, 0o755); err != nil {
		fmt.Fprintln(out, "chaos:", err)
		return 2
	}
	if err := os.Mkdir(h.logs, 0o755); err != nil {
		fmt.Fprintln(out, "chaos:", err)
		return 2
	}
	if cfg.scale != nil {
		return h.runScale(ctx)
	}
	if cfg.soak > 0 {
		return h.runSoak(ctx)
	}
	h.logf("seed %d, %d payments, %d workers, fault phase %v, work directory %s", cfg.seed, cfg.payments, cfg.workers, cfg.duration, work)
	if cfg.rateLimitMode() {
		h.logf("provider as it really is: simulator %s, workers %v", strings.Join(cfg.simModelArgs(), " "), cfg.providerRateEnv())
	}
	v, err := h.execute(ctx)
	if err != nil {
		h.logf("aborted: %v", err)
		if ctx.Err() != nil {
			return 130
		}
		// What the provider saw may say why (a 429 storm that never settles).
		if h.simAddr != "" && !h.load.read {
			h.readProviderLoad(context.Background())
			h.logf("%s", h.load.providerLine())
		}
		return 2
	}
	return h.report(v)
}

func (h *harness) execute(ctx context.Context) (workload.Verdict, error) {
	if err := h.build(ctx); err != nil {
		return workload.Verdict{}, err
	}
	if err := h.initPostgres(ctx); err != nil {
		return workload.Verdict{}, err
	}
	if err := h.migrate(ctx); err != nil {
		return workload.Verdict{}, err
	}
	if err := h.initNATS(ctx); err != nil {
		return workload.Verdict{}, err
	}
	if err := h.startSim(ctx); err != nil {
		return workload.Verdict{}, err
	}
	if err := h.connectNATS(ctx); err != nil {
		return workload.Verdict{}, err
	}
	if err := h.witness.watch(h.nc); err != nil {
		return workload.Verdict{}, err
	}
	// The outcome events' reader runs from here to the end of the run.
	readCtx, stopReading := context.WithCancel(ctx)
	var reading sync.WaitGroup
	reading.Add(1)
	go func() { defer reading.Done(); h.outcomes.follow(readCtx, h.js, h.streamConfig().Stream.OutcomeStream) }()
	defer reading.Wait()
	defer stopReading()
	defer h.stopOutages()
	if err := h.initOutages(); err != nil {
		return workload.Verdict{}, err
	}
	defer h.stopNetFaults()
	if err := h.initNetFaults(); err != nil {
		return workload.Verdict{}, err
	}
	defer h.stopGateway()
	if err := h.initGateway(ctx); err != nil {
		return workload.Verdict{}, err
	}
	w := workload.Generate(workload.MixConfig{
		Payments: h.cfg.payments, Seed: h.cfg.seed, Run: fmt.Sprintf("r%x", h.cfg.seed&0xffffff),
		Subject: stream.DefaultSubjectPrefix, DuplicateRate: 0.3, MalformedRate: 0.02, ReuseRate: 0.01,
		DeclineRate: 0.05, HeaderOnly: 0.1,
	})
	h.logf("workload: %d payments, %d duplicates, %d key reuses, %d malformed: %d publishes",
		len(w.Payments), w.Duplicates, w.Reuses, len(w.Malformed), len(w.Publishes))

	// Workers run until the harness ends; the faults until the phase ends.
	workCtx, stopWorkers := context.WithCancel(ctx)
	defer stopWorkers()
	var wg sync.WaitGroup
	for i := range h.cfg.workers {
		s := &slot{proc: h.procs.add(&proc{
			name: fmt.Sprintf("worker-%d", i), path: h.bin, args: []string{"worker"}, env: h.workerEnv(),
			log: filepath.Join(h.logs, fmt.Sprintf("worker-%d.log", i)),
		})}
		h.slots = append(h.slots, s)
		wg.Add(1)
		go func() { defer wg.Done(); h.superviseWorker(workCtx, s) }()
	}
	defer wg.Wait()
	defer stopWorkers()
	if h.gw != nil {
		if err := h.startGateway(workCtx, &wg); err != nil {
			return workload.Verdict{}, err
		}
	}

	faultCtx, stopFaults := context.WithTimeout(ctx, h.cfg.duration)
	defer stopFaults()
	pubDone := make(chan error, 1)
	go func() { pubDone <- h.publishAll(ctx, w.Publishes, h.cfg.duration*8/10) }()
	clientsDone := make(chan error, 1)
	go func() {
		if h.gw == nil {
			clientsDone <- nil
			return
		}
		clientsDone <- h.runClients(ctx, h.cfg.duration*8/10)
	}()
	faultsDone := make(chan struct{})
	go func() { defer close(faultsDone); h.faults(faultCtx) }()
	if err := <-pubDone; err != nil {
		return workload.Verdict{}, fmt.Errorf("publish: %w", err)
	}
	h.logf("published %d messages (all PubAcked)", h.published.Load())
	<-faultsDone
	if err := <-clientsDone; err != nil {
		return workload.Verdict{}, fmt.Errorf("gateway clients: %w", err)
	}
	if ctx.Err() != nil {
		return workload.Verdict{}, ctx.Err()
	}
	h.logf("faults over: %d worker kills, %d NATS restarts, %d Postgres restarts, %d Postgres failovers%s%s",
		h.kills.Load(), h.natsRestarts.Load(), h.pgRestarts.Load(), h.pgFailovers.Load(), h.outageSummary(), h.pubAckSummary())

	replayed, err := h.settle(ctx)
	if err != nil {
		return workload.Verdict{}, err
	}
	if h.gw != nil {
		if err := h.askFinal(ctx); err != nil {
			return workload.Verdict{}, fmt.Errorf("gateway clients: %w", err)
		}
		if err := h.askOpsFinal(ctx); err != nil {
			return workload.Verdict{}, fmt.Errorf("gateway clients: %w", err)
		}
	}
	ev, err := h.collect(ctx)
	if err != nil {
		return workload.Verdict{}, err
	}
	ev.Replayed = replayed
	if err := h.checkOutcomeEvents(ctx); err != nil {
		return workload.Verdict{}, fmt.Errorf("outcome events: %w", err)
	}
	if h.gw != nil {
		h.takeGateway(&ev)
		if err := h.checkOps(ctx); err != nil {
			return workload.Verdict{}, fmt.Errorf("operations: %w", err)
		}
	}
	v := workload.Verify(w, ev)
	findings, err := h.audit(ctx)
	if err != nil {
		return workload.Verdict{}, err
	}
	for _, f := range findings {
		v.Inconsistent = append(v.Inconsistent, fmt.Sprintf("audit %s %s:%s: %s", f.Kind, f.MerchantID, f.IdempotencyKey, f.Detail))
	}
	lost, err := h.checkCommitted(ctx)
	if err != nil {
		return workload.Verdict{}, err
	}
	v.Inconsistent = append(v.Inconsistent, lost...)
	h.readProviderLoad(ctx)
	if err := h.checkProviderLoad(); err != nil {
		v.Inconsistent = append(v.Inconsistent, "provider load: "+err.Error())
	}
	return v, nil
}

// faults runs the fault schedule until ctx ends: a worker SIGKILLed every
// 1-3 s, NATS and Postgres restarts spread over the phase, never at once.
func (h *harness) faults(ctx context.Context) {
	rng := rand.New(rand.NewPCG(h.cfg.seed, 0xfa17))
	type event struct {
		at time.Duration
		fn func(context.Context) error
		kd string
	}
	// Alternate NATS and Postgres restarts, evenly spread over the first
	// 85 % of the phase, so that one is always over before the next.
	var events []event
	pgEvents, pgEvent := h.cfg.pgRestarts, h.restartPostgres
	if h.fo != nil {
		pgEvents, pgEvent = h.cfg.pgFailover, h.failoverPrimary
	}
	for i, j := 0, 0; i < h.cfg.natsRestarts || j < pgEvents; {
		if i < h.cfg.natsRestarts && (i <= j || j >= pgEvents) {
			events = append(events, event{kd: "nats", fn: h.restartNATS})
			i++
		} else {
			events = append(events, event{kd: "postgres", fn: pgEvent})
			j++
		}
	}
	for k := range events {
		events[k].at = h.cfg.duration * 85 / 100 * time.Duration(k+1) / time.Duration(len(events)+1)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); h.pauses(ctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); h.netFaultLoop(ctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); h.providerOutage(ctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); h.pubAckLosses(ctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); h.gatewayKillLoop(ctx) }()
	wg.Add(1)
	go func() { // the service restarts, in their own time line
		defer wg.Done()
		start := time.Now()
		for _, e := range events {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(start.Add(e.at))):
			}
			// A restart is finished even if the phase ends meanwhile.
			h.restarting.Add(1)
			if err := e.fn(context.WithoutCancel(ctx)); err != nil {
				h.logf("%s restart failed: %v", e.kd, err)
			}
			h.restarting.Add(-1)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-time.After(time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))):
		}
		s := h.slots[rng.IntN(len(h.slots))]
		if s.paused.Load() {
			continue
		}
		select {
		case <-s.proc.exited():
			continue // already down (e.g. cannot start while NATS is down)
		default:
		}
		s.proc.kill()
		h.kills.Add(1)
	}
}

// restartNATS kills nats-server with SIGKILL and starts it again on the same
// port with the same store, after a second of downtime.
func (h *harness) restartNATS(ctx context.Context) error {
	if h.cluster != nil {
		return h.restartNode(ctx)
	}
	h.logf("NATS: kill -9")
	h.nats.kill()
	time.Sleep(time.Second)
	if err := h.startNATS(ctx); err != nil {
		return err
	}
	h.natsRestarts.Add(1)
	h.logf("NATS: restarted with its store")
	return nil
}

// restartPostgres stops Postgres in immediate mode and starts it again
// after a second of downtime, or -pg-long-stop the first time (crash
// recovery replays the WAL).
func (h *harness) restartPostgres(ctx context.Context) error {
	down := h.pgDowntime()
	h.logf("Postgres: pg_ctl stop -m immediate, down for %v", down)
	if err := h.pg.StopImmediate(ctx); err != nil {
		h.logf("Postgres: stop: %v", err)
	}
	time.Sleep(down)
	if err := h.pg.Start(ctx); err != nil {
		return err
	}
	h.pgRestarts.Add(1)
	h.logf("Postgres: restarted")
	return nil
}
