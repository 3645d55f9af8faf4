package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/console"
	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/reconciler"
)

// consoleTokenEnv is the operator token's variable: never a flag, which
// would show it in ps and --help.
const consoleTokenEnv = "PAYDEDUP_CONSOLE_TOKEN"

type consoleCmd struct {
	app       *app
	db        databaseFlag
	nats      natsFlags
	streams   streamFlags
	addr      string
	grace     time.Duration
	retention time.Duration
}

func newConsoleCmd(a *app) *cobra.Command {
	c := &consoleCmd{app: a}
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the operator's web page: backlog, stuck rows, dead letters, replay, payment lookup",
		Long: `console serves a web page that shows the stream's backlog and the consumer's
lag, pending and stuck idempotency rows, the dead letters grouped by reason
(with their headers and bodies, and whether each verifies with
PAYDEDUP_DLQ_KEY), and a payment lookup by merchant and key (the key's row,
its ledger row and the provider's stored outcome). Card data is masked.

Replay (of one letter or a selection, after a confirmation that shows what
would happen) needs PAYDEDUP_CONSOLE_TOKEN: log in with it on the page.
Without it the console is read-only. It listens on 127.0.0.1 by default; on
any other address it refuses to start without the token, and then every
page needs the login.`,
		Example: `  PAYDEDUP_CONSOLE_TOKEN=$(openssl rand -hex 32) paydedup console
  paydedup console --addr 127.0.0.1:9000   # read-only without the token`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return c.Run(cmd.Context()) },
	}
	c.db.bind(cmd, a)
	c.nats.bind(cmd, a)
	c.streams.bind(cmd, a)
	f := cmd.Flags()
	f.StringVar(&c.addr, "addr", envOr(a.getenv, "PAYDEDUP_CONSOLE_ADDR", "127.0.0.1:8089"), "listen address; not loopback needs PAYDEDUP_CONSOLE_TOKEN (PAYDEDUP_CONSOLE_ADDR)")
	f.DurationVar(&c.grace, "grace", a.envDuration("PAYDEDUP_RECONCILE_GRACE", reconciler.DefaultGrace), "a pending row is stuck when pending longer than this (PAYDEDUP_RECONCILE_GRACE)")
	f.DurationVar(&c.retention, "key-retention", a.envDuration("PAYDEDUP_KEY_RETENTION", dlq.DefaultKeyRetention), "the idempotency store's key retention: replay refuses older dead letters (PAYDEDUP_KEY_RETENTION)")
	return cmd
}

// Run serves the console until ctx ends.
func (c *consoleCmd) Run(ctx context.Context) error {
	if err := errors.Join(c.db.validate(), c.nats.validate(), c.streams.validate()); err != nil {
		return err
	}
	token := c.app.getenv(consoleTokenEnv)
	if !console.Loopback(c.addr) && token == "" {
		return fmt.Errorf("--addr / PAYDEDUP_CONSOLE_ADDR %q is not a loopback address: set %s (e.g. openssl rand -hex 32) to serve beyond this machine, or listen on 127.0.0.1", c.addr, consoleTokenEnv)
	}
	cfg := c.streams.cfg
	if key, err := c.app.dlqKey(); err == nil {
		cfg.DLQKey = key
	} else {
		c.app.logger.Warn("dead letters cannot be verified or replayed", "error", err)
	}
	store, closeDB, err := openStore(ctx, c.db.url, 0)
	if err != nil {
		return err
	}
	defer closeDB()
	nc, err := c.nats.connect("paydedup-console")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	con, err := console.New(js, store, console.Config{Stream: cfg, Token: token, ReadNeedsLogin: !console.Loopback(c.addr),
		Grace: c.grace, KeyRetention: c.retention, Logger: c.app.logger})
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
