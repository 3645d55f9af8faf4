package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/paydedup/paydedup/internal/pg"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/ops"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider/stripe"
	"github.com/paydedup/paydedup/stream"
)

// defaultHTTPAddr is where the gateway listens unless told otherwise.
const defaultHTTPAddr = ":8080"

type gatewayCmd struct {
	app       *app
	db        databaseFlag
	nats      natsFlags
	streams   streamFlags
	httpAddr  string
	adminAddr string
	retention time.Duration
	pubWait   time.Duration
	poolSize  int
	share     int // MerchantShare in percent
	cfg       gateway.Config
	// webhookSecret is STRIPE_WEBHOOK_SECRET, never a flag (flags show in
	// process listings); empty leaves POST /v1/stripe/webhooks off.
	webhookSecret string
}

func newGatewayCmd(a *app) *cobra.Command {
	g := &gatewayCmd{app: a}
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Serve the HTTP API: POST /v1/payments with Idempotency-Key",
		Long: `gateway serves paydedup's HTTP ingress. POST /v1/payments takes a payment
command as JSON (without merchant_id: the merchant is the API key's) and an
Idempotency-Key header, publishes it to the workers' stream once, and answers
202 Accepted (or, with Prefer: wait=N, the outcome once a worker completed
it). Retries with the same key replay the stored outcome (Idempotent-Replayed:
true), 409 while it is in flight, 422 when the payload differs.
GET /v1/payments/{idempotency_key} shows a payment's state and outcome.
Concurrent POSTs are taken in together, a batch sharing each statement and
commit (--batch-size, --batch-window, --flushers); beyond --queue-size
waiting POSTs it answers 503, beyond a merchant's --merchant-share 429.
A source address that failed to authenticate --auth-failures times is
answered 429 without an API key look-up until it earns them back over
--auth-failure-window; beyond --max-conns open connections one more is
answered 503 and closed.

Requests authenticate with Authorization: Bearer <API key>; create keys with
"paydedup apikey create". The gateway does not charge: run "paydedup worker"
against the same database and stream. It needs every migration this
binary carries (run "paydedup migrate up" as the owner; it is not ready
until then) and connects as the role paydedup_gateway, which reads API keys
and payments and writes only the gateway's guard rows. With STRIPE_WEBHOOK_SECRET (the endpoint's signing
secret, whsec_...; during a roll of the secret "new,old", an event verifying
with either) it also serves POST /v1/stripe/webhooks, which settles
processing payments from Stripe's payment_intent.succeeded, payment_failed
and canceled events (through the settle_payment function of migration
00011, its only write outside the guard rows); without it the route
is not served (404). On SIGTERM it fails /readyz, lets requests finish
within --drain-timeout (waiting requests answer 202) and exits 0.`,
		Example: `  DATABASE_URL=postgres://paydedup_gateway@127.0.0.1:5432/paydedup?sslmode=disable \
  PAYDEDUP_HTTP_ADDR=:8080 PAYDEDUP_ADMIN_ADDR=:9091 paydedup gateway`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return g.Run(cmd.Context()) },
	}
	g.db.bind(cmd, a)
	g.nats.bind(cmd, a)
	g.streams.bind(cmd, a)
	f := cmd.Flags()
	c := &g.cfg
	f.StringVar(&g.httpAddr, "http-addr", envOr(a.getenv, "PAYDEDUP_HTTP_ADDR", defaultHTTPAddr), "address of the HTTP API (PAYDEDUP_HTTP_ADDR)")
	f.StringVar(&g.adminAddr, "admin-addr", a.getenv("PAYDEDUP_ADMIN_ADDR"), "address of the /metrics, /livez, /readyz listener; empty disables it (PAYDEDUP_ADMIN_ADDR)")
	f.IntVar(&c.Limits.MaxBodyBytes, "max-body-bytes", a.envInt("PAYDEDUP_MAX_BODY_BYTES", payment.DefaultMaxBodyBytes), "largest accepted request body (PAYDEDUP_MAX_BODY_BYTES)")
	f.Int64Var(&c.Limits.MaxAmount, "max-amount", a.envInt64("PAYDEDUP_MAX_AMOUNT", payment.DefaultMaxAmount), "largest accepted amount in minor units (PAYDEDUP_MAX_AMOUNT)")
	f.IntVar(&c.MaxHeaderBytes, "max-header-bytes", a.envInt("PAYDEDUP_HTTP_MAX_HEADER_BYTES", gateway.DefaultMaxHeaderBytes), "largest accepted request header block (PAYDEDUP_HTTP_MAX_HEADER_BYTES)")
	f.DurationVar(&c.ReadHeaderTimeout, "read-header-timeout", a.envDuration("PAYDEDUP_HTTP_READ_HEADER_TIMEOUT", gateway.DefaultReadHeaderTimeout), "time to read a request's headers (PAYDEDUP_HTTP_READ_HEADER_TIMEOUT)")
	f.DurationVar(&c.ReadTimeout, "read-timeout", a.envDuration("PAYDEDUP_HTTP_READ_TIMEOUT", gateway.DefaultReadTimeout), "time to read a whole request (PAYDEDUP_HTTP_READ_TIMEOUT)")
	f.DurationVar(&c.RequestTimeout, "request-timeout", a.envDuration("PAYDEDUP_HTTP_REQUEST_TIMEOUT", gateway.DefaultRequestTimeout), "time to handle a request, not counting Prefer: wait (PAYDEDUP_HTTP_REQUEST_TIMEOUT)")
	f.DurationVar(&c.MaxWait, "max-wait", a.envDuration("PAYDEDUP_HTTP_MAX_WAIT", gateway.DefaultMaxWait), "longest Prefer: wait honoured (PAYDEDUP_HTTP_MAX_WAIT)")
	f.DurationVar(&c.RepublishAfter, "republish-after", a.envDuration("PAYDEDUP_REPUBLISH_AFTER", gateway.DefaultRepublishAfter), "after a publish, how long a retry that finds no worker record answers 409 without asking the stream; after it, the command is published again only if the stream no longer holds it (PAYDEDUP_REPUBLISH_AFTER)")
	f.DurationVar(&c.DrainTimeout, "drain-timeout", a.envDuration("PAYDEDUP_DRAIN_TIMEOUT", gateway.DefaultDrainTimeout), "on SIGTERM, how long in-flight requests may finish (PAYDEDUP_DRAIN_TIMEOUT)")
	f.DurationVar(&g.pubWait, "publish-timeout", a.envDuration("PAYDEDUP_PUBLISH_TIMEOUT", stream.DefaultPublishTimeout), "time to wait for the stream's PubAck (PAYDEDUP_PUBLISH_TIMEOUT)")
	f.IntVar(&c.BatchSize, "batch-size", a.envInt("PAYDEDUP_GATEWAY_BATCH_SIZE", gateway.DefaultBatchSize), "most POSTs one batch takes in (PAYDEDUP_GATEWAY_BATCH_SIZE)")
	f.DurationVar(&c.BatchWindow, "batch-window", a.envDuration("PAYDEDUP_GATEWAY_BATCH_WINDOW", gateway.DefaultBatchWindow), "how long a batch waits for one more POST while another batch is being settled; with none it is cut at once (PAYDEDUP_GATEWAY_BATCH_WINDOW)")
	f.IntVar(&c.Flushers, "flushers", a.envInt("PAYDEDUP_GATEWAY_FLUSHERS", gateway.DefaultFlushers), "batches settled at once, each on one database connection (PAYDEDUP_GATEWAY_FLUSHERS)")
	f.IntVar(&c.QueueSize, "queue-size", a.envInt("PAYDEDUP_GATEWAY_QUEUE_SIZE", gateway.DefaultQueueSize), "POSTs that may wait for a batch; beyond it they are answered 503 with Retry-After (PAYDEDUP_GATEWAY_QUEUE_SIZE)")
	f.IntVar(&g.share, "merchant-share", a.envInt("PAYDEDUP_GATEWAY_MERCHANT_SHARE", int(100*gateway.DefaultMerchantShare)), "percent of the queue one merchant may fill; beyond it its POSTs are 429 with Retry-After (PAYDEDUP_GATEWAY_MERCHANT_SHARE)")
	f.IntVar(&c.AuthFailures, "auth-failures", a.envInt("PAYDEDUP_GATEWAY_AUTH_FAILURES", gateway.DefaultAuthFailures), "failed authentications a source address may make at once, earned back over --auth-failure-window; beyond them it is answered 429 without a key look-up; 0 turns this off, as behind a proxy that hides client addresses (PAYDEDUP_GATEWAY_AUTH_FAILURES)")
	f.DurationVar(&c.AuthFailureWindow, "auth-failure-window", a.envDuration("PAYDEDUP_GATEWAY_AUTH_FAILURE_WINDOW", gateway.DefaultAuthFailureWindow), "how long a source takes to earn back --auth-failures failures (PAYDEDUP_GATEWAY_AUTH_FAILURE_WINDOW)")
	f.IntVar(&c.MaxConns, "max-conns", a.envInt("PAYDEDUP_GATEWAY_MAX_CONNS", gateway.DefaultMaxConns), "open connections at most; one more is answered 503 with Retry-After and closed (PAYDEDUP_GATEWAY_MAX_CONNS)")
	f.IntVar(&g.poolSize, "pool-size", a.envInt("PAYDEDUP_PG_POOL_SIZE", gateway.DefaultPoolSize), "PostgreSQL connections, unless DATABASE_URL sets pool_max_conns (PAYDEDUP_PG_POOL_SIZE)")
	g.webhookSecret = a.getenv("STRIPE_WEBHOOK_SECRET")
	f.DurationVar(&g.retention, "key-retention", a.envDuration("PAYDEDUP_KEY_RETENTION", consumer.DefaultKeyRetention), "how long finished keys (and the gateway's intake rows) are kept (PAYDEDUP_KEY_RETENTION)")
	return cmd
}

func (g *gatewayCmd) validate() (gateway.Config, error) {
	cfg := g.cfg
	cfg.IntakeRetention = g.retention
	cfg.PublishLease = max(gateway.DefaultPublishLease, 2*g.pubWait)
	cfg.Logger = g.app.logger
	cfg.MerchantShare = float64(g.share) / 100
	authFailures := cfg.AuthFailures
	if authFailures == 0 {
		cfg.AuthFailures = -1 // off, not the default
	}
	cfg = cfg.WithDefaults()
	errs := []error{g.db.validate(), g.nats.validate(), g.streams.validate()}
	if authFailures < 0 {
		errs = append(errs, fmt.Errorf("PAYDEDUP_GATEWAY_AUTH_FAILURES / --auth-failures must be at least 0 (0: off), got %d", authFailures))
	}

	if g.httpAddr == "" {
		errs = append(errs, errors.New("PAYDEDUP_HTTP_ADDR / --http-addr is empty"))
	}
	if g.poolSize < 1 || g.poolSize > 10000 {
		errs = append(errs, fmt.Errorf("PAYDEDUP_PG_POOL_SIZE / --pool-size must be within 1..10000, got %d", g.poolSize))
	}
	if g.share < 1 || g.share > 100 {
		errs = append(errs, fmt.Errorf("PAYDEDUP_GATEWAY_MERCHANT_SHARE / --merchant-share must be within 1..100 (percent), got %d", g.share))
	}
	if g.webhookSecret != "" {
		if _, err := stripe.ParseWebhookSecrets(g.webhookSecret); err != nil {
			errs = append(errs, fmt.Errorf("STRIPE_WEBHOOK_SECRET: %w", err))
		}
	}
	if g.pubWait <= 0 {
		errs = append(errs, fmt.Errorf("PAYDEDUP_PUBLISH_TIMEOUT / --publish-timeout must be positive, got %v", g.pubWait))
	}
	if err := cfg.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("invalid gateway configuration (see paydedup gateway --help):\n%w", err))
	}
	return cfg, errors.Join(errs...)
}

// Run serves the API (and the admin listener) until ctx ends and the drain
// is over.
func (g *gatewayCmd) Run(ctx context.Context) error {
	cfg, err := g.validate()
	if err != nil {
		return err
	}
	log := g.app.logger
	if v := g.app.getenv("PAYDEDUP_GATEWAY_INTAKE"); v != "" {
		log.Warn("PAYDEDUP_GATEWAY_INTAKE is ignored: every POST is taken in by the batched intake, the only one", "value", v)
	}
	gogc, memLimit := g.app.tuneGC()
	log.Info("garbage collector", "gogc", gogc, "gomemlimit", memLimit)
	tp, traced, stopTracing, err := g.app.tracing(ctx, "paydedup-gateway")
	if err != nil {
		return err
	}
	defer stopTracing()
	pool, err := pg.Connect(ctx, g.db.url, append(traced, pg.WithMaxConns(g.poolSize))...)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := dedup.New(pool, dedup.Config{Retention: g.retention})
	if err != nil {
		return err
	}
	// The worker's check, once: a gateway on a database not migrated (or
	// behind this build) would listen and then fail every request on a
	// missing table or column. It exits instead, naming the fix; started
	// beside the migrate Job, it is restarted until the Job is done.
	if err := store.CheckSchema(ctx); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	gwStore, err := pgstore.New(pool, pgstore.Config{Records: store})
	if err != nil {
		return err
	}
	comp, err := pgstore.NewListener(pool, pgstore.ListenerConfig{Logger: log})
	if err != nil {
		return err
	}
	nc, err := g.nats.connect("paydedup-gateway")
	if err != nil {
		return err
	}
	defer nc.Close()
	// The publisher checks each message against the worker's limits, which
	// read the same PAYDEDUP_MAX_BODY_BYTES and PAYDEDUP_MAX_AMOUNT.
	pcfg := g.streams.cfg
	pcfg.Limits = cfg.Limits
	pub, err := stream.NewCommandPublisher(nc, pcfg, g.pubWait)
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cfg.Idle = func(ctx context.Context) (bool, time.Time, error) {
		return stream.Idle(ctx, js, g.streams.cfg, time.Now())
	}

	reg := prometheus.NewRegistry()
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "paydedup_build_info", Help: "Build information.", ConstLabels: prometheus.Labels{"version": version},
	})
	build.Set(1)
	reg.MustRegister(build, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ops.WatchPool(reg, func() ops.PoolStat { return pool.Stat() })
	cfg.Registerer = reg
	if cfg.Propagator, err = g.app.propagator(); err != nil {
		return err
	}
	if tp != nil {
		cfg.TracerProvider = tp
	}
	if g.webhookSecret != "" {
		v, err := stripe.NewWebhookVerifier(g.webhookSecret, 0)
		if err != nil {
			return fmt.Errorf("STRIPE_WEBHOOK_SECRET: %w", err)
		}
		cfg.Webhooks = gateway.Webhooks{Verifier: v, Ledger: store}
		log.Info("Stripe webhooks on", "path", gateway.PathStripeWebhooks, "secrets", v.Secrets())
	} else {
		log.Info("STRIPE_WEBHOOK_SECRET is unset: Stripe webhooks are off", "path", gateway.PathStripeWebhooks)
	}
	gw, err := gateway.New(store, gwStore, comp, pub, cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", g.httpAddr)
	if err != nil {
		return fmt.Errorf("listen on PAYDEDUP_HTTP_ADDR / --http-addr %s: %w", g.httpAddr, err)
	}

	// The completion listener and the admin listener outlive the drain:
	// waiting requests still hear completions, and /readyz says 503.
	bgCtx, stopBg := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBg()
	var bg errgroup.Group
	bg.Go(func() error { return comp.Run(bgCtx) })
	if g.adminAddr != "" {
		admin, err := ops.NewAdmin(g.adminAddr, reg, log)
		if err != nil {
			_ = ln.Close()
			stopBg()
			_ = bg.Wait()
			return err
		}
		admin.AddCheck("postgres", store.Ping)
		admin.AddCheck("schema", (&schemaGate{store: store, log: log}).Check)
		admin.AddCheck("nats", func(context.Context) error {
			if !nc.IsConnected() {
				return fmt.Errorf("not connected (%s)", nc.Status())
			}
			return nil
		})
		admin.AddCheck("stream", pub.Ready)
		admin.AddCheck("completions", comp.Ready)
		admin.AddCheck("draining", func(context.Context) error {
			if gw.Draining() {
				return errors.New("shutting down")
			}
			return nil
		})
		log.Info("admin listener", "addr", admin.Addr())
		bg.Go(func() error { return admin.Serve(bgCtx) })
	}
	serveErr := gw.Serve(ctx, ln)
	stopBg()
	return errors.Join(serveErr, bg.Wait())
}
