package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	budgetstore "github.com/paydedup/paydedup/budget/pgstore"
	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/intake"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/ops"
	"github.com/paydedup/paydedup/reconciler"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

type workerCmd struct {
	app       *app
	db        databaseFlag
	nats      natsFlags
	prov      providerFlags
	streams   streamFlags
	worker    workerFlags
	rec       reconcileFlags
	reconcile bool
	adminAddr string
}

func newWorkerCmd(a *app) *cobra.Command {
	w := &workerCmd{app: a}
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Consume payment commands and charge each exactly once",
		Long: `worker consumes the PAYMENTS stream with the durable pull consumer
paydedup-worker (created or updated at start, with PAYMENTS_DLQ), claims each
command's idempotency key in PostgreSQL before calling the provider, and acks
only after the outcome is committed. Run as many as you like: they share the
consumer. The reconciler runs inside it unless --reconcile=false.

Every setting comes from the environment and can be overridden by its flag.
A contradictory configuration (e.g. a lease shorter than the provider retry
budget) is refused at start with the setting named. On SIGTERM or SIGINT it
stops fetching, lets in-flight payments finish within --drain-timeout,
releases and naks what is left (never acks unfinished work) and exits 0.

Required, with no flag (secrets never go on a command line):
  PAYDEDUP_DLQ_KEY   the dead letters' HMAC key, at least 32 bytes (openssl
                     rand -hex 32), the same on every worker and wherever
                     "paydedup dlq replay" runs
  STRIPE_SECRET_KEY  the Stripe API key (sk_test_... in test mode), unless
                     PAYDEDUP_PROVIDER=sim
and DATABASE_URL (or --database-url). NATS_URL defaults to the local server.

Optional, with no flag:
  PAYDEDUP_DLQ_PREVIOUS_KEYS  the DLQ keys PAYDEDUP_DLQ_KEY replaced, comma-
                     separated, each at least 32 bytes: they verify dead
                     letters and never sign (docs/operations.md, rotation)`,
		Example: `  DATABASE_URL=postgres://postgres@127.0.0.1:5432/paydedup?sslmode=disable \
  PAYDEDUP_DLQ_KEY=$(openssl rand -hex 32) \
  PAYDEDUP_PROVIDER=sim PAYDEDUP_ADMIN_ADDR=127.0.0.1:9090 paydedup worker

  STRIPE_SECRET_KEY=sk_test_... PAYDEDUP_DLQ_KEY=... paydedup worker --concurrency 128 --lease 60s --ack-wait 90s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return w.Run(cmd.Context()) },
	}
	w.db.bind(cmd, a)
	w.nats.bind(cmd, a)
	w.prov.bind(cmd, a)
	w.streams.bind(cmd, a)
	w.worker.bind(cmd, a)
	w.rec.bind(cmd, a, "reconcile-")
	cmd.Flags().BoolVar(&w.reconcile, "reconcile", a.envBool("PAYDEDUP_RECONCILE", true), "run the reconciler in this process (PAYDEDUP_RECONCILE)")
	cmd.Flags().StringVar(&w.adminAddr, "admin-addr", a.getenv("PAYDEDUP_ADMIN_ADDR"), "address of the /metrics, /livez, /readyz listener; empty disables it (PAYDEDUP_ADMIN_ADDR)")
	return cmd
}

func (w *workerCmd) validate() (consumer.Config, error) {
	var errs []error
	checks := []error{w.db.validate(), w.nats.validate(), w.prov.validate(), w.streams.validate()}
	if w.reconcile {
		checks = append(checks, w.rec.validate(w.prov))
	}
	for _, err := range checks {
		if err != nil {
			errs = append(errs, err)
		}
	}
	s := w.streams.cfg
	ws := &w.worker.cfg.Stream
	ws.Name, ws.SubjectPrefix, ws.DLQStream = s.Name, s.SubjectPrefix, s.DLQStream
	ws.DLQPrefix, ws.Durable = s.DLQPrefix, s.Durable
	ws.OutcomeStream, ws.OutcomePrefix = s.OutcomeStream, s.OutcomePrefix
	// The worker signs with the current key only; it checks the previous
	// ones so that a bad list stops the rollout at its first pod.
	if err := w.app.dlqKeys(ws); err != nil {
		errs = append(errs, err)
	}
	cfg, err := w.worker.config(w.prov)
	if err != nil {
		errs = append(errs, err)
	}
	return cfg, errors.Join(errs...)
}

// Run starts the worker (and the reconciler and admin listener) and blocks
// until ctx ends and the drain is over.
func (w *workerCmd) Run(ctx context.Context) error {
	cfg, err := w.validate()
	if err != nil {
		return err
	}
	prop, err := w.app.propagator()
	if err != nil {
		return err
	}
	log := w.app.logger
	gogc, memLimit := w.app.tuneGC()
	log.Info("garbage collector", "gogc", gogc, "gomemlimit", memLimit)
	tp, traced, stopTracing, err := w.app.tracing(ctx, "paydedup-worker")
	if err != nil {
		return err
	}
	defer stopTracing()
	pool, err := pg.Connect(ctx, w.db.url, append(traced, pg.WithMaxConns(w.worker.poolSize))...)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := dedup.New(pool, dedup.Config{Retention: cfg.KeyRetention})
	if err != nil {
		return err
	}
	// The worker tells the gateway's intake of the final dead letters of
	// the commands the gateway published (its role may update only the
	// intake's dead-letter columns).
	gwIntake, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		return err
	}
	nc, err := w.nats.connect("paydedup-worker " + cfg.Holder)
	if err != nil {
		return err
	}
	defer nc.Close()
	prov, stopSim, err := w.prov.buildTraced(ctx, tp, prop)
	if err != nil {
		return err
	}
	defer stopSim()
	log.Info("payment provider", w.prov.describe()...)

	reg := prometheus.NewRegistry()
	metrics := ops.NewMetrics(reg, version)
	// Every charge, probe and reconciler lookup of this process draws on
	// the fleet's provider budget.
	bstore, err := budgetstore.New(pool, budgetstore.Config{})
	if err != nil {
		return err
	}
	budgeted, err := w.prov.budgeted(bstore, prov, log, reg)
	if err != nil {
		return err
	}
	ops.WatchPool(reg, func() ops.PoolStat { return pool.Stat() })
	ops.WatchPending(reg, func(ctx context.Context) (int64, int64, error) {
		c, err := store.CountPending(ctx, w.rec.grace)
		return c.Pending, c.Stuck, err
	})
	ops.WatchOperations(reg, func(ctx context.Context) (map[string]ops.OpCounts, error) {
		counts, err := store.CountUnsettledOps(ctx)
		out := make(map[string]ops.OpCounts, len(counts))
		for kind, c := range counts {
			out[kind] = ops.OpCounts{Stuck: c.Stuck, Unknown: c.Unknown}
		}
		return out, err
	})
	if err := watchConsumerLag(reg, nc, cfg.Stream.Name, cfg.Stream.Durable); err != nil {
		return err
	}
	proc := consumer.NewProcessor(store, budgeted, cfg, log)
	watchPause(reg, proc)
	watchCallLimit(reg, proc)
	worker, err := consumer.NewWorker(nc, proc, cfg, log, metrics, gwIntake)
	if err != nil {
		return err
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "paydedup_worker_lanes",
		Help: "Lanes open at the worker's last look (PAYDEDUP_LANES at most): merchants served by consumers of their own beside the shared consumer's backlog, rather than behind it."},
		func() float64 { return float64(worker.Lanes()) }))
	worker.SetPropagator(prop)
	if tp != nil {
		worker.SetTracer(tp)
	}

	// The admin listener outlives the worker's drain, so /readyz can say 503
	// while in-flight payments finish.
	schema := &schemaGate{store: store, log: log}
	adminCtx, stopAdmin := context.WithCancel(context.WithoutCancel(ctx))
	defer stopAdmin()
	g, gctx := errgroup.WithContext(ctx)
	if w.adminAddr != "" {
		admin, err := ops.NewAdmin(w.adminAddr, reg, log)
		if err != nil {
			return err
		}
		admin.AddCheck("nats", func(context.Context) error {
			if !nc.IsConnected() {
				return fmt.Errorf("not connected (%s)", nc.Status())
			}
			return nil
		})
		admin.AddCheck("postgres", store.Ping)
		admin.AddCheck("paused", proc.Paused)
		admin.AddCheck("schema", schema.Check)
		admin.AddCheck("draining", func(context.Context) error {
			if worker.Draining() {
				return errors.New("shutting down")
			}
			return nil
		})
		log.Info("admin listener", "addr", admin.Addr())
		g.Go(func() error { return admin.Serve(adminCtx) })
	}
	// Migrations first: nothing is consumed or reconciled against a schema
	// older than this code, and /readyz says why meanwhile.
	if err := schema.Wait(gctx); err != nil {
		// Stopped (SIGTERM) or the admin listener failed: g says which.
		stopAdmin()
		return g.Wait()
	}
	if w.reconcile {
		rec, err := reconciler.New(store, budgeted, w.rec.config(w.prov, log, metrics))
		if err != nil {
			return err
		}
		if err := rec.Start(gctx); err != nil {
			return err
		}
		defer rec.Stop()
	}
	// Every worker relays the outcome events the store commits with each
	// outcome to the outcomes stream, and the commands publishers commit
	// in the intake to the payments stream.
	istore, err := intake.NewStore(pool, 0)
	if err != nil {
		return err
	}
	relay, err := startRelay(gctx, nc, store, istore, cfg.Stream, cfg.KeyRetention, log, reg)
	if err != nil {
		return err
	}
	defer relay.Stop()
	g.Go(func() error {
		defer stopAdmin()
		return worker.Run(gctx)
	})
	return g.Wait()
}

// openStore connects to Postgres and returns the store.
func openStore(ctx context.Context, url string, retention time.Duration) (*dedup.Store, func(), error) {
	pool, err := pg.Connect(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	store, err := dedup.New(pool, dedup.Config{Retention: retention})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return store, pool.Close, nil
}

// watchPause exports the worker's pause: paydedup_worker_paused is 1 for
// the cause of a pause (the API key refused, the provider or PostgreSQL
// unavailable) and 0 for the others; paydedup_worker_held_messages counts
// the messages held meanwhile, neither nakked nor fetched again.
func watchPause(reg prometheus.Registerer, proc *consumer.Processor) {
	for _, cause := range consumer.PauseCauses {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "paydedup_worker_paused",
			Help:        "1 while the worker is paused (fetching nothing, holding the messages in hand) for this cause, else 0.",
			ConstLabels: prometheus.Labels{"cause": cause},
		}, func() float64 {
			if proc.PauseCause() == cause {
				return 1
			}
			return 0
		}))
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "paydedup_worker_held_messages",
		Help: "Messages the worker holds through a pause, to run again when it ends.",
	}, func() float64 { return float64(proc.Held()) }))
}

// watchCallLimit reports the adaptive limit of provider calls in flight:
// where it stands, the calls in flight, and the latencies it moves by.
func watchCallLimit(reg prometheus.Registerer, proc *consumer.Processor) {
	for _, g := range []struct {
		name, help string
		value      func(consumer.CallLimit) float64
	}{
		{"paydedup_provider_call_limit", "Provider calls the worker lets be in flight now; it adapts to the provider's latency and answers, between the floor (16) and PAYDEDUP_CONCURRENCY.",
			func(c consumer.CallLimit) float64 { return float64(c.Limit) }},
		{"paydedup_provider_call_limit_ceiling", "PAYDEDUP_CONCURRENCY: the most provider calls the worker lets be in flight.",
			func(c consumer.CallLimit) float64 { return float64(c.Ceiling) }},
		{"paydedup_provider_calls_in_flight", "Provider calls in flight now.",
			func(c consumer.CallLimit) float64 { return float64(c.InFlight) }},
		{"paydedup_provider_calls_waiting", "Claimed payments waiting for a provider call slot.",
			func(c consumer.CallLimit) float64 { return float64(c.Waiting) }},
		{"paydedup_provider_merchants_waiting", "Merchants with claimed payments waiting for a provider call slot; the slots are granted round robin between them.",
			func(c consumer.CallLimit) float64 { return float64(c.MerchantsWaiting) }},
		{"paydedup_provider_call_latency_seconds", "Mean latency of the provider calls answered in the call limit's last window (about one round trip).",
			func(c consumer.CallLimit) float64 { return c.Latency.Seconds() }},
		{"paydedup_provider_call_noload_latency_seconds", "The provider's latency without queueing, as the call limit estimates it (the least window mean); above 1.5 times it the limit shrinks.",
			func(c consumer.CallLimit) float64 { return c.NoLoad.Seconds() }},
	} {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: g.name, Help: g.help},
			func() float64 { return g.value(proc.CallLimit()) }))
	}
}
