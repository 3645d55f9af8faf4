package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/paydedup/paydedup/budget"
	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
	"github.com/paydedup/paydedup/stream"
)

// natsFlags are the NATS connection settings every command shares, named
// as the nats CLI names them (NATS_URL, NATS_CREDS, NATS_NKEY, NATS_CA,
// NATS_CERT, NATS_KEY, NATS_USER, NATS_PASSWORD). Secrets come from the
// environment or files only: NATS_PASSWORD has no flag, and NATS_URL
// (which may carry user:password@ or a token) is read after parsing rather
// than as --nats-url's default, which --help would print.
type natsFlags struct {
	url      string
	creds    string
	nkey     string
	user     string
	password string
	tlsCA    string
	tlsCert  string
	tlsKey   string
	getenv   func(string) string
	errOut   io.Writer
	warned   bool
}

// deprecatedNATSEnv maps the old TLS variables to the nats CLI's names;
// the old ones still work, with a warning.
var deprecatedNATSEnv = [][2]string{{"NATS_TLS_CA", "NATS_CA"}, {"NATS_TLS_CERT", "NATS_CERT"}, {"NATS_TLS_KEY", "NATS_KEY"}}

func (n *natsFlags) bind(cmd *cobra.Command, a *app) {
	f := cmd.Flags()
	n.getenv, n.errOut = a.getenv, a.errOut
	tls := func(key string) string {
		if v := a.getenv(key); v != "" {
			return v
		}
		for _, d := range deprecatedNATSEnv {
			if d[1] == key {
				return a.getenv(d[0])
			}
		}
		return ""
	}
	f.StringVar(&n.url, "nats-url", "", "NATS server URL(s), comma-separated (default: $NATS_URL, else "+nats.DefaultURL+")")
	f.StringVar(&n.creds, "nats-creds", a.getenv("NATS_CREDS"), "path of a NATS credentials file (NATS_CREDS)")
	f.StringVar(&n.nkey, "nats-nkey", a.getenv("NATS_NKEY"), "path of a NATS nkey seed file (NATS_NKEY)")
	f.StringVar(&n.user, "nats-user", a.getenv("NATS_USER"), "NATS user (NATS_USER); the password comes from NATS_PASSWORD only")
	f.StringVar(&n.tlsCA, "nats-ca", tls("NATS_CA"), "CA file to verify the NATS server (NATS_CA)")
	f.StringVar(&n.tlsCert, "nats-cert", tls("NATS_CERT"), "client certificate file for NATS (NATS_CERT)")
	f.StringVar(&n.tlsKey, "nats-key", tls("NATS_KEY"), "client key file for NATS (NATS_KEY)")
	// The old flag names still work, hidden, with cobra's deprecation note.
	for _, old := range []struct {
		name string
		v    *string
		now  string
	}{{"nats-tls-ca", &n.tlsCA, "nats-ca"}, {"nats-tls-cert", &n.tlsCert, "nats-cert"}, {"nats-tls-key", &n.tlsKey, "nats-key"}} {
		f.StringVar(old.v, old.name, *old.v, "")
		_ = f.MarkDeprecated(old.name, "use --"+old.now)
	}
	n.password = a.getenv("NATS_PASSWORD")
}

// resolve fills the URL from NATS_URL, else the default, when no flag set it.
func (n *natsFlags) resolve() {
	if n.url == "" && n.getenv != nil {
		n.url = n.getenv("NATS_URL")
	}
	if n.url == "" {
		n.url = nats.DefaultURL
	}
}

func (n *natsFlags) validate() error {
	n.resolve()
	if n.getenv != nil && n.errOut != nil && !n.warned {
		n.warned = true
		for _, d := range deprecatedNATSEnv {
			if n.getenv(d[0]) != "" {
				fmt.Fprintf(n.errOut, "paydedup: %s is deprecated: set %s instead (the nats CLI's name)\n", d[0], d[1])
			}
		}
	}
	var errs []error
	for _, file := range []struct{ what, path string }{{"NATS_CREDS / --nats-creds", n.creds}, {"NATS_NKEY / --nats-nkey", n.nkey}} {
		if file.path != "" {
			if _, err := os.Stat(file.path); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", file.what, err))
			}
		}
	}
	if (n.tlsCert == "") != (n.tlsKey == "") {
		errs = append(errs, errors.New("NATS_CERT and NATS_KEY (--nats-cert, --nats-key) must be set together"))
	}
	if n.password != "" && n.user == "" {
		errs = append(errs, errors.New("NATS_PASSWORD is set without NATS_USER"))
	}
	return errors.Join(errs...)
}

// connect opens the NATS connection; name identifies it in server monitoring.
func (n *natsFlags) connect(name string, opts ...nats.Option) (*nats.Conn, error) {
	n.resolve()
	opts = append([]nats.Option{nats.Name(name), nats.Timeout(5 * time.Second), nats.MaxReconnects(-1)}, opts...)
	if n.creds != "" {
		opts = append(opts, nats.UserCredentials(n.creds))
	}
	if n.nkey != "" {
		opt, err := nats.NkeyOptionFromSeed(n.nkey)
		if err != nil {
			return nil, fmt.Errorf("NATS_NKEY / --nats-nkey: %w", err)
		}
		opts = append(opts, opt)
	}
	if n.user != "" {
		opts = append(opts, nats.UserInfo(n.user, n.password))
	}
	if n.tlsCA != "" {
		opts = append(opts, nats.RootCAs(n.tlsCA))
	}
	if n.tlsCert != "" {
		opts = append(opts, nats.ClientCert(n.tlsCert, n.tlsKey))
	}
	nc, err := nats.Connect(n.url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", redact.URLs(n.url), err)
	}
	return nc, nil
}

// providerFlags choose and configure the payment provider.
type providerFlags struct {
	kind      string
	secretKey string
	apiBase   string
	timeout   time.Duration
	// rate is PAYDEDUP_PROVIDER_RATE as given: the fleet's requests/s to
	// the provider; "" or 0 for no configured ceiling.
	rate string
	// reader names a command that reads back payments the provider already
	// holds (audit, reconcile): the in-process simulator starts empty and
	// has none of them, so its messages never suggest it.
	reader string
}

func (p *providerFlags) bind(cmd *cobra.Command, a *app) {
	f := cmd.Flags()
	f.StringVar(&p.kind, "provider", envOr(a.getenv, "PAYDEDUP_PROVIDER", "stripe"), "payment provider: stripe, or sim for the in-process simulator (PAYDEDUP_PROVIDER)")
	f.StringVar(&p.apiBase, "stripe-api-base", a.getenv("STRIPE_API_BASE"), "Stripe API base URL, to point at a proxy or the simulator (STRIPE_API_BASE)")
	f.DurationVar(&p.timeout, "provider-timeout", a.envDuration("PAYDEDUP_PROVIDER_TIMEOUT", provider.DefaultAttemptTimeout), "timeout of one provider call (PAYDEDUP_PROVIDER_TIMEOUT)")
	f.StringVar(&p.rate, "provider-rate", a.getenv("PAYDEDUP_PROVIDER_RATE"),
		"requests/s to the provider for the whole fleet (every worker, reconciler and audit): the account's limit less what other services use; empty or 0 for no configured ceiling (still learned from 429s) (PAYDEDUP_PROVIDER_RATE)")
	p.secretKey = a.getenv("STRIPE_SECRET_KEY") // never a flag: flags show in process listings
}

// providerRate is PAYDEDUP_PROVIDER_RATE as a number; 0 when unset.
func (p *providerFlags) providerRate() (float64, error) {
	if strings.TrimSpace(p.rate) == "" {
		return 0, nil
	}
	r, err := strconv.ParseFloat(strings.TrimSpace(p.rate), 64)
	if err != nil || r < 0 || math.IsNaN(r) || math.IsInf(r, 0) {
		return 0, fmt.Errorf("PAYDEDUP_PROVIDER_RATE / --provider-rate: %q is not a number of requests per second: give e.g. 80 (or 0 for no ceiling)", p.rate)
	}
	return r, nil
}

// budgeted puts prov behind the fleet's provider budget, kept in s (the
// PostgreSQL row of migration 00020, budget/pgstore), its metrics on reg.
func (p *providerFlags) budgeted(s budget.Store, prov provider.Provider, log *slog.Logger, reg prometheus.Registerer) (provider.Provider, error) {
	r, err := p.providerRate()
	if err != nil {
		return nil, err
	}
	b, err := budget.New(s, budget.Config{Rate: r, Logger: log, Registerer: reg})
	if err != nil {
		return nil, err
	}
	log.Info("provider budget", "rate", r, "learned_from_429s", true)
	return b.Wrap(prov), nil
}

func (p *providerFlags) validate() error {
	switch p.kind {
	case "stripe":
		if p.secretKey == "" {
			return p.missingKey()
		}
	case "sim":
		if !labBuild {
			return errors.New("PAYDEDUP_PROVIDER=sim needs the simulator, which this build leaves out (-tags nolab): use stripe, or the lab build")
		}
	default:
		return fmt.Errorf("PAYDEDUP_PROVIDER / --provider: %q is not stripe or sim", p.kind)
	}
	if p.timeout <= 0 {
		return fmt.Errorf("PAYDEDUP_PROVIDER_TIMEOUT / --provider-timeout must be positive, got %v", p.timeout)
	}
	if _, err := p.providerRate(); err != nil {
		return err
	}
	return nil
}

// missingKey says what to set when STRIPE_SECRET_KEY is not: for a command
// that reads back the ledger's payments, the key of the account that
// charged them, never the simulator (it would report them all missing).
func (p *providerFlags) missingKey() error {
	if p.reader != "" {
		return fmt.Errorf("%s reads the payments back from Stripe: set STRIPE_SECRET_KEY to the secret key of the account that charged them (sk_live_... or sk_test_...), and STRIPE_API_BASE to the stand-in's URL if they were charged at a Stripe stand-in (stripe-mock, provider-sim)", p.reader)
	}
	return errors.New("PAYDEDUP_PROVIDER=stripe needs STRIPE_SECRET_KEY, the Stripe account's secret key (sk_test_... in test mode; STRIPE_API_BASE points it at a Stripe stand-in), or use PAYDEDUP_PROVIDER=sim for the in-process simulator")
}

// describe is what the worker logs at start about its provider: which one,
// its API base, and whether the key is a live or a test one (its prefix:
// sk_live_/rk_live_, sk_test_/rk_test_), never the key.
func (p *providerFlags) describe() []any {
	if p.kind == "sim" {
		return []any{"provider", "sim", "api_base", "in-process simulator", "mode", "sim"}
	}
	mode := "unknown key prefix"
	switch {
	case strings.HasPrefix(p.secretKey, "sk_live_"), strings.HasPrefix(p.secretKey, "rk_live_"):
		mode = "live"
	case strings.HasPrefix(p.secretKey, "sk_test_"), strings.HasPrefix(p.secretKey, "rk_test_"):
		mode = "test"
	}
	return []any{"provider", p.kind, "api_base", cmp.Or(p.apiBase, stripe.DefaultAPIBase), "mode", mode}
}

// build returns the provider: the Stripe adapter, pointed for sim at an
// in-process simulator (lab builds only) that stop shuts down.
func (p *providerFlags) build(ctx context.Context) (prov *stripe.Client, stop func(), err error) {
	return p.buildTraced(ctx, nil, nil)
}

// buildTraced is build whose Stripe calls are client spans from tp (when
// not nil), each a child of the span in the call's context, whose context
// prop writes into the request's headers (the simulator's calls are not
// traced).
func (p *providerFlags) buildTraced(ctx context.Context, tp trace.TracerProvider, prop propagation.TextMapPropagator) (prov *stripe.Client, stop func(), err error) {
	if p.kind == "sim" {
		return simulated(ctx, p.timeout)
	}
	cfg := stripe.Config{SecretKey: p.secretKey, APIBase: p.apiBase, Timeout: p.timeout}
	if tp != nil {
		cfg.HTTPClient = &http.Client{Transport: otelhttp.NewTransport(stripe.NewTransport(),
			otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(prop))}
	}
	prov, err = stripe.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	return prov, func() {}, nil
}

// workerFlags are the consumer settings of `worker`.
type workerFlags struct {
	cfg        consumer.Config
	maxTries   int
	backoffRaw string
	poolSize   int
	maxAgeSet  bool // PAYDEDUP_STREAM_MAX_AGE is set: refused
}

func (w *workerFlags) bind(cmd *cobra.Command, a *app) {
	f := cmd.Flags()
	c := &w.cfg
	f.IntVar(&c.Concurrency, "concurrency", a.envInt("PAYDEDUP_CONCURRENCY", consumer.DefaultConcurrency), "ceiling of the provider calls in flight per process, which adapt to the provider's latency between 16 and it; up to two fetch batches more are claimed or committed meanwhile (PAYDEDUP_CONCURRENCY)")
	f.IntVar(&c.FetchBatch, "fetch-batch", a.envInt("PAYDEDUP_FETCH_BATCH", consumer.DefaultFetchBatch), "messages per fetch, claimed in one round trip (PAYDEDUP_FETCH_BATCH)")
	f.IntVar(&c.CommitBatch, "commit-batch", a.envInt("PAYDEDUP_COMMIT_BATCH", consumer.DefaultCommitBatch), "completions per group commit at most; 1 commits each alone (PAYDEDUP_COMMIT_BATCH)")
	f.DurationVar(&c.CommitWait, "commit-wait", a.envDuration("PAYDEDUP_COMMIT_WAIT", consumer.DefaultCommitWait), "how long a group commit waits for more completions (PAYDEDUP_COMMIT_WAIT)")
	f.DurationVar(&c.Lease, "lease", a.envDuration("PAYDEDUP_LEASE", consumer.DefaultLease), "claim lease; must exceed the provider retry budget (PAYDEDUP_LEASE)")
	f.DurationVar(&c.Stream.AckWait, "ack-wait", a.envDuration("PAYDEDUP_ACK_WAIT", stream.DefaultAckWait), "JetStream AckWait; must exceed the lease (PAYDEDUP_ACK_WAIT)")
	f.IntVar(&c.Stream.MaxDeliver, "max-deliver", a.envInt("PAYDEDUP_MAX_DELIVER", stream.DefaultMaxDeliver), "deliveries before a message is dead-lettered as max_deliveries (PAYDEDUP_MAX_DELIVER)")
	f.IntVar(&c.NetRequeues, "net-requeues", a.envInt("PAYDEDUP_NET_REQUEUES", consumer.DefaultNetRequeues), "times a message whose deliveries ran out without an outcome (its workers killed or stopped holding it, or its last delivery a 429, a 5xx or a held lease) is published again, with deliveries of its own, before it is dead-lettered as max_deliveries; 0 files it at once (PAYDEDUP_NET_REQUEUES)")
	f.IntVar(&c.Lanes, "lanes", a.envInt("PAYDEDUP_LANES", consumer.DefaultLanes), "per-merchant consumers (lanes) the workers open beside the shared one while it has a backlog, so that merchants behind another's backlog are served meanwhile; 0 opens none (PAYDEDUP_LANES)")
	f.IntVar(&c.Stream.MaxAckPending, "max-ack-pending", a.envInt("PAYDEDUP_MAX_ACK_PENDING", stream.DefaultMaxAckPending), "JetStream MaxAckPending of the consumer (PAYDEDUP_MAX_ACK_PENDING)")
	f.StringVar(&w.backoffRaw, "backoff", a.getenv("PAYDEDUP_BACKOFF"), "optional JetStream redelivery backoff, e.g. 1m,2m,5m; each step must exceed the lease (PAYDEDUP_BACKOFF)")
	f.DurationVar(&c.PauseFirst, "pause-first", a.envDuration("PAYDEDUP_PAUSE_FIRST", consumer.AuthPauseFirst), "while the provider or PostgreSQL is out (or the API key refused), the pause before the first probe, doubled after each failed probe (PAYDEDUP_PAUSE_FIRST)")
	f.DurationVar(&c.PauseLongest, "pause-longest", a.envDuration("PAYDEDUP_PAUSE_LONGEST", consumer.AuthPauseLongest), "the longest pause between probes of a paused worker (PAYDEDUP_PAUSE_LONGEST)")
	f.DurationVar(&c.DrainTimeout, "drain-timeout", a.envDuration("PAYDEDUP_DRAIN_TIMEOUT", consumer.DefaultDrainTimeout), "on SIGTERM, how long in-flight work may finish before it is released and nakked (PAYDEDUP_DRAIN_TIMEOUT)")
	f.Int64Var(&c.Stream.StreamMaxBytes, "stream-max-bytes", a.envInt64("PAYDEDUP_STREAM_MAX_BYTES", stream.DefaultStreamMaxBytes), "bound of the PAYMENTS stream in bytes; when full it refuses publishes (the client gets 503), it never deletes a stored command; size it for the longest provider outage at the publish rate; it only ever grows on an existing stream (PAYDEDUP_STREAM_MAX_BYTES)")
	f.Int64Var(&c.Stream.StreamMaxMsgs, "stream-max-msgs", a.envInt64("PAYDEDUP_STREAM_MAX_MSGS", stream.DefaultStreamMaxMsgs), "bound of the PAYMENTS stream in messages, like --stream-max-bytes (PAYDEDUP_STREAM_MAX_MSGS)")
	w.maxAgeSet = a.getenv("PAYDEDUP_STREAM_MAX_AGE") != ""
	f.DurationVar(&c.Stream.DLQMaxAge, "dlq-max-age", a.envDuration("PAYDEDUP_DLQ_MAX_AGE", stream.DefaultDLQMaxAge), "MaxAge of the PAYMENTS_DLQ stream (PAYDEDUP_DLQ_MAX_AGE)")
	f.DurationVar(&c.Stream.DuplicateWindow, "duplicate-window", a.envDuration("PAYDEDUP_DUPLICATE_WINDOW", stream.DefaultDuplicateWindow), "duplicate window of the PAYMENTS stream (PAYDEDUP_DUPLICATE_WINDOW)")
	f.IntVar(&c.Stream.Replicas, "stream-replicas", a.envInt("PAYDEDUP_STREAM_REPLICAS", 1), "replicas of the streams and consumers the worker creates or updates: 3 on a NATS cluster; every worker must say the same (PAYDEDUP_STREAM_REPLICAS)")
	f.DurationVar(&c.KeyRetention, "key-retention", a.envDuration("PAYDEDUP_KEY_RETENTION", consumer.DefaultKeyRetention), "how long finished keys are kept (PAYDEDUP_KEY_RETENTION)")
	f.Int64Var(&c.Stream.Limits.MaxAmount, "max-amount", a.envInt64("PAYDEDUP_MAX_AMOUNT", 99_999_999), "largest accepted amount in minor units (PAYDEDUP_MAX_AMOUNT)")
	f.IntVar(&c.Stream.Limits.MaxBodyBytes, "max-body-bytes", a.envInt("PAYDEDUP_MAX_BODY_BYTES", 64<<10), "largest accepted message body (PAYDEDUP_MAX_BODY_BYTES)")
	f.IntVar(&w.maxTries, "provider-tries", a.envInt("PAYDEDUP_PROVIDER_TRIES", provider.DefaultMaxTries), "provider attempts per delivery (PAYDEDUP_PROVIDER_TRIES)")
	f.StringVar(&c.Holder, "holder", a.getenv("PAYDEDUP_HOLDER"), "lease holder id; default host name, pid and a random suffix (PAYDEDUP_HOLDER)")
	f.IntVar(&w.poolSize, "pool-size", a.envInt("PAYDEDUP_PG_POOL_SIZE", consumer.DefaultPoolSize()), "PostgreSQL connections, unless DATABASE_URL sets pool_max_conns: each statement holds one, so more only lets the server work on more at once (PAYDEDUP_PG_POOL_SIZE)")
}

// config returns the validated consumer configuration.
func (w *workerFlags) config(p providerFlags) (consumer.Config, error) {
	c := w.cfg
	c.ProviderTry = provider.RetryPolicy{MaxTries: w.maxTries, AttemptTimeout: p.timeout}
	if w.maxAgeSet {
		// A max age deletes commands a paused worker has not settled: a
		// pause (a key refused on a Friday evening) has no bound a max age
		// could be checked against.
		return c, fmt.Errorf("PAYDEDUP_STREAM_MAX_AGE is no longer supported: the PAYMENTS stream keeps every command until it is settled, however long the provider is out; unset it and bound the stream with PAYDEDUP_STREAM_MAX_BYTES / PAYDEDUP_STREAM_MAX_MSGS")
	}
	if w.maxTries < 1 {
		return c, fmt.Errorf("PAYDEDUP_PROVIDER_TRIES / --provider-tries must be at least 1, got %d", w.maxTries)
	}
	if w.poolSize < 1 || w.poolSize > 10000 {
		return c, fmt.Errorf("PAYDEDUP_PG_POOL_SIZE / --pool-size must be within 1..10000, got %d", w.poolSize)
	}
	if r := c.Stream.Replicas; r < 1 || r > 5 {
		return c, fmt.Errorf("PAYDEDUP_STREAM_REPLICAS / --stream-replicas must be 1 to 5 (JetStream's limit), got %d", r)
	}
	if w.backoffRaw != "" {
		for _, s := range strings.Split(w.backoffRaw, ",") {
			d, err := time.ParseDuration(strings.TrimSpace(s))
			if err != nil {
				return c, fmt.Errorf("PAYDEDUP_BACKOFF / --backoff: %w", err)
			}
			c.Stream.BackOff = append(c.Stream.BackOff, d)
		}
	}
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("invalid worker configuration (see paydedup worker --help):\n%w", err)
	}
	return c, nil
}

// dlqKeyEnv is the dead-letter authentication key's variable. It is read
// from the environment only: a flag would show the secret in ps and --help.
const dlqKeyEnv = "PAYDEDUP_DLQ_KEY"

// dlqKey returns PAYDEDUP_DLQ_KEY's bytes, and an error naming the variable
// when it is missing or too short.
func (a *app) dlqKey() ([]byte, error) {
	key := []byte(a.getenv(dlqKeyEnv))
	if err := stream.ValidateDLQKey(key); err != nil {
		if len(key) == 0 {
			return nil, fmt.Errorf("%s is not set: dead letters are authenticated with it; set the same secret of at least %d bytes on every worker and wherever dlq replay runs (e.g. openssl rand -hex 32)",
				dlqKeyEnv, stream.MinDLQKeyLen)
		}
		return nil, fmt.Errorf("%s: %w", dlqKeyEnv, err)
	}
	return key, nil
}

// dlqPreviousKeysEnv lists the DLQ keys PAYDEDUP_DLQ_KEY replaced: they
// verify dead letters and never sign (the rotation in docs/operations.md).
const dlqPreviousKeysEnv = "PAYDEDUP_DLQ_PREVIOUS_KEYS"

// dlqPreviousKeys returns PAYDEDUP_DLQ_PREVIOUS_KEYS's keys, comma-separated
// with blanks around each ignored (none when unset), and an error naming
// the variable and the key's position when one is empty or too short.
func (a *app) dlqPreviousKeys() ([][]byte, error) {
	raw := a.getenv(dlqPreviousKeysEnv)
	if strings.TrimSpace(raw) == "" {
		return nil, nil
	}
	var keys [][]byte
	for _, k := range strings.Split(raw, ",") {
		keys = append(keys, []byte(strings.TrimSpace(k)))
	}
	if err := stream.ValidateDLQPreviousKeys(keys); err != nil {
		return nil, fmt.Errorf("%s (comma-separated keys that %s had before, each of at least %d bytes): %w",
			dlqPreviousKeysEnv, dlqKeyEnv, stream.MinDLQKeyLen, err)
	}
	return keys, nil
}

// dlqKeys sets cfg's current and previous DLQ keys from the environment:
// those that are valid, and an error naming each variable that is not.
func (a *app) dlqKeys(cfg *stream.Config) error {
	key, kerr := a.dlqKey()
	prev, perr := a.dlqPreviousKeys()
	cfg.DLQKey, cfg.DLQPreviousKeys = key, prev
	return errors.Join(kerr, perr)
}

// Environment parsing: a variable is a flag's default, so --help shows the
// value in effect. A malformed one keeps the built-in default and is
// remembered in app.envErrs; only a command with a flag that names the
// variable in its usage reports it (commandEnvErrs), before it runs.

func (a *app) envDuration(key string, def time.Duration) time.Duration {
	return envParse(a, key, def, time.ParseDuration, "a duration: give a number with a unit, e.g. 45s, 2m or 1h30m")
}

func (a *app) envInt(key string, def int) int {
	return envParse(a, key, def, strconv.Atoi, "an integer: give digits only, e.g. 32")
}

func (a *app) envInt64(key string, def int64) int64 {
	return envParse(a, key, def, func(v string) (int64, error) { return strconv.ParseInt(v, 10, 64) }, "an integer: give digits only, e.g. 32")
}

func (a *app) envBool(key string, def bool) bool {
	return envParse(a, key, def, strconv.ParseBool, "a boolean: give true or false")
}

// envParse reads key with parse; unset, it is def, and malformed, def with
// an error remembered in a.envErrs that says what the value must be.
func envParse[T any](a *app, key string, def T, parse func(string) (T, error), fix string) T {
	v := a.getenv(key)
	if v == "" {
		return def
	}
	x, err := parse(v)
	if err != nil {
		if a.envErrs == nil {
			a.envErrs = map[string]error{}
		}
		a.envErrs[key] = fmt.Errorf("%s=%q is not %s", key, v, fix)
		return def
	}
	return x
}
