package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/console"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/reconciler"
)

// consoleTokenEnv is the operator token's variable: never a flag, which
// would show it in ps and --help.
const consoleTokenEnv = "PAYDEDUP_CONSOLE_TOKEN"

type consoleCmd struct {
	app        *app
	db         databaseFlag
	nats       natsFlags
	streams    streamFlags
	addr       string
	grace      time.Duration
	retention  time.Duration
	hosts      []string
	sessionTTL time.Duration
	secure     string
}

func newConsoleCmd(a *app) *cobra.Command {
	c := &consoleCmd{app: a}
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the operator's web page: backlog, stuck rows, dead letters, replay, payment lookup",
		Long: `console serves a web page that shows the stream's backlog and the consumer's
lag, pending and stuck idempotency rows, the dead letters grouped by reason
(with their headers and bodies, and whether each verifies with
PAYDEDUP_DLQ_KEY or one of PAYDEDUP_DLQ_PREVIOUS_KEYS), and a payment lookup by merchant and key (the key's row,
its ledger row and the provider's stored outcome). Card data is masked.

Replay (of one letter or a selection, after a confirmation that shows what
would happen) needs PAYDEDUP_CONSOLE_TOKEN: log in with it on the page.
Without it the console is read-only. It listens on 127.0.0.1 by default; on
any other address it refuses to start without the token, and then every
page needs the login and the session cookie is Secure (a TLS proxy in front;
--secure-cookie false turns that off). The token must be hard to guess:
about 128 bits by its length and the variety of its characters, with
sequences, repeats and keyboard walks counting for nothing; "paydedup
console token" prints one of 256 random bits. A session lasts --session-ttl and ends at logout;
wrong logins are throttled.

The console answers only to localhost, IP addresses, the --addr host and
the names in --host / PAYDEDUP_CONSOLE_HOSTS: any other Host header is
refused with 421, so a web page that rebinds its own name to this address
(DNS rebinding) reads nothing. Add the name your browser or proxy uses.`,
		Example: `  PAYDEDUP_CONSOLE_TOKEN=$(paydedup console token) paydedup console
  paydedup console --addr 127.0.0.1:9000   # read-only without the token
  PAYDEDUP_CONSOLE_HOSTS=console.ops.example paydedup console --addr 0.0.0.0:8089`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return c.Run(cmd.Context()) },
	}
	c.db.bind(cmd, a)
	c.nats.bind(cmd, a)
	c.streams.bind(cmd, a)
	cmd.AddCommand(newConsoleTokenCmd(a))
	f := cmd.Flags()
	f.StringVar(&c.addr, "addr", envOr(a.getenv, "PAYDEDUP_CONSOLE_ADDR", "127.0.0.1:8089"), "listen address; not loopback needs PAYDEDUP_CONSOLE_TOKEN (PAYDEDUP_CONSOLE_ADDR)")
	f.DurationVar(&c.grace, "grace", a.envDuration("PAYDEDUP_RECONCILE_GRACE", reconciler.DefaultGrace), "a pending row is stuck when pending longer than this (PAYDEDUP_RECONCILE_GRACE)")
	f.DurationVar(&c.retention, "key-retention", a.envDuration("PAYDEDUP_KEY_RETENTION", dlq.DefaultKeyRetention), "the idempotency store's key retention: replay refuses older dead letters (PAYDEDUP_KEY_RETENTION)")
	f.StringSliceVar(&c.hosts, "host", splitList(a.getenv(consoleHostsEnv)), "a host name the console answers to besides localhost, IP addresses and the --addr host; repeat or comma-separate ("+consoleHostsEnv+")")
	f.DurationVar(&c.sessionTTL, "session-ttl", a.envDuration(consoleSessionTTLEnv, console.DefaultSessionTTL), "how long a login lasts; logout ends it sooner ("+consoleSessionTTLEnv+")")
	f.StringVar(&c.secure, "secure-cookie", envOr(a.getenv, consoleSecureEnv, "auto"), "mark the session cookie Secure: true, false, or auto (true off loopback) ("+consoleSecureEnv+")")
	return cmd
}

// newConsoleTokenCmd is `paydedup console token`: a token of
// console.NewTokenBytes random bytes (crypto/rand) in hex, on a line of its
// own, for PAYDEDUP_CONSOLE_TOKEN.
func newConsoleTokenCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "token",
		Short: "Print a new console token (256 random bits, hex) for PAYDEDUP_CONSOLE_TOKEN",
		Long: `token prints a new operator token for PAYDEDUP_CONSOLE_TOKEN: 32 bytes from
the operating system's cryptographic random source, in hex. The console
refuses a token estimated at less than 128 bits; this one has 256. It is
printed only: keep it in your secret store, and restart the console with
it to log everyone out.`,
		Example: `  PAYDEDUP_CONSOLE_TOKEN=$(paydedup console token) paydedup console`,
		Args:    cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			tok, err := console.NewToken()
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(a.out, tok)
			return err
		},
	}
}

// The console's other variables.
const (
	consoleHostsEnv      = "PAYDEDUP_CONSOLE_HOSTS"
	consoleSessionTTLEnv = "PAYDEDUP_CONSOLE_SESSION_TTL"
	consoleSecureEnv     = "PAYDEDUP_CONSOLE_SECURE_COOKIE"
)

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// validate checks the settings before anything is connected: a bad token
// stops the console at start, naming the variable and the rule.
func (c *consoleCmd) validate(token string) (secure bool, err error) {
	errs := []error{c.db.validate(), c.nats.validate(), c.streams.validate()}
	loopback := console.Loopback(c.addr)
	if !loopback && token == "" {
		errs = append(errs, fmt.Errorf("--addr / PAYDEDUP_CONSOLE_ADDR %q is not a loopback address: set %s (make one with `paydedup console token`) to serve beyond this machine, or listen on 127.0.0.1", c.addr, consoleTokenEnv))
	}
	if token != "" {
		if err := console.ValidateToken(token); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", consoleTokenEnv, err))
		}
	}
	if err := console.ValidateHosts(c.hosts); err != nil {
		errs = append(errs, fmt.Errorf("--host / %s: %w", consoleHostsEnv, err))
	}
	if c.sessionTTL <= 0 {
		errs = append(errs, fmt.Errorf("--session-ttl / %s must be a positive duration such as 8h, got %v", consoleSessionTTLEnv, c.sessionTTL))
	}
	switch strings.ToLower(c.secure) {
	case "auto":
		secure = !loopback
	case "true", "1", "yes":
		secure = true
	case "false", "0", "no":
	default:
		errs = append(errs, fmt.Errorf("--secure-cookie / %s must be true, false or auto, got %q", consoleSecureEnv, c.secure))
	}
	return secure, errors.Join(errs...)
}

// Run serves the console until ctx ends.
func (c *consoleCmd) Run(ctx context.Context) error {
	token := c.app.getenv(consoleTokenEnv)
	secure, err := c.validate(token)
	if err != nil {
		return err
	}
	hosts := c.hosts
	if h, _, err := net.SplitHostPort(c.addr); err == nil && h != "" && net.ParseIP(h) == nil {
		hosts = append(hosts, h) // the name it listens on is its own
	}
	cfg := c.streams.cfg
	if key, err := c.app.dlqKey(); err == nil {
		cfg.DLQKey = key
	} else {
		c.app.logger.Warn("dead letters cannot be verified or replayed", "error", err)
	}
	if cfg.DLQPreviousKeys, err = c.app.dlqPreviousKeys(); err != nil {
		return err
	}
	pool, err := pg.Connect(ctx, c.db.url)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		return err
	}
	// A payment's captures, cancels and refunds: the gateway store's
	// reads, which its GET shows a payment by.
	lives, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		return err
	}
	nc, err := c.nats.connect("paydedup-console")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	con, err := console.New(js, store, console.Config{Stream: cfg, Token: token, ReadNeedsLogin: !console.Loopback(c.addr), Lifecycles: lives,
		Grace: c.grace, KeyRetention: c.retention, SessionTTL: c.sessionTTL, Hosts: hosts, SecureCookie: secure, Logger: c.app.logger})
	if err != nil {
		return fmt.Errorf("%s: %w", consoleTokenEnv, err)
	}
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return fmt.Errorf("--addr / PAYDEDUP_CONSOLE_ADDR: %w", err)
	}
	mode := "replay after login"
	if con.ReadOnly() {
		mode = "read-only"
	}
	fmt.Fprintf(c.app.out, "paydedup console on http://%s (%s)\n", ln.Addr(), mode)
	return con.Serve(ctx, ln)
}
