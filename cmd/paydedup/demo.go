//go:build !nolab

package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/lab/demo"
	"github.com/paydedup/paydedup/lab/localpg"
	"github.com/paydedup/paydedup/stream"
)

type demoCmd struct {
	app     *app
	streams streamFlags
	cfg     demo.Config
}

func newDemoCmd(a *app) *cobra.Command {
	d := &demoCmd{app: a, cfg: demo.Config{AdminURL: localpg.AdminURL}}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the whole system on this machine and prove no payment is charged twice or lost",
		Long: `demo runs paydedup end to end in one process and checks the result against the
payment provider's own ledger:

  - NATS: NATS_URL, or else an embedded JetStream server (temporary store);
  - PostgreSQL: DATABASE_URL, or else the local server at 127.0.0.1:5432
    (PAYDEDUP_LOCAL_POSTGRES_URL names another), or else a private throwaway
    cluster from this machine's PostgreSQL binaries (initdb, pg_ctl), or
    else a container when a Docker engine answers; there, database
    paydedup_demo, created if missing, migrated;
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
	c := &d.cfg
	// URLs may hold passwords: the environment is read after parsing, never
	// as a flag default that --help would print.
	f.StringVar(&c.DatabaseURL, "database-url", "", "PostgreSQL URL (default: $DATABASE_URL, else the local server's database "+demo.Database+")")
	f.StringVar(&c.NATSURL, "nats-url", "", "NATS URL (default: $NATS_URL, else an embedded JetStream server)")
	d.streams.bindDefaults(cmd, a, stream.Config{
		Name: "PAYDEDUP_DEMO", SubjectPrefix: "paydedup_demo.requests",
		DLQStream: "PAYDEDUP_DEMO_DLQ", DLQPrefix: "paydedup_demo.dlq", Durable: "paydedup-demo",
		OutcomeStream: "PAYDEDUP_DEMO_OUTCOMES", OutcomePrefix: "paydedup_demo.outcomes",
	})
	f.IntVar(&c.Payments, "payments", 3000, "distinct payments to publish")
	f.IntVar(&c.Workers, "workers", 3, "workers to run (one of them is killed mid-run)")
	f.Uint64Var(&c.Seed, "seed", 0, "random seed of the workload and the simulator's faults (0: random)")
	f.Float64Var(&c.Duplicates, "duplicates", 0.4, "duplicate messages per payment, as a fraction")
	f.Float64Var(&c.Declines, "declines", 0.05, "fraction of payments with a card that is declined")
	f.DurationVar(&c.Timeout, "timeout", 3*time.Minute, "give up (and fail) if the messages have not settled by then")
	f.BoolVar(&c.Verbose, "verbose", false, "show the workers', reconciler's and simulator's logs (default: errors only)")
	return cmd
}

// Run fills the configuration from the environment and runs the demo.
func (d *demoCmd) Run(ctx context.Context) error {
	c := d.cfg
	if c.DatabaseURL == "" {
		c.DatabaseURL = d.app.getenv("DATABASE_URL")
	}
	if c.NATSURL == "" {
		c.NATSURL = d.app.getenv("NATS_URL")
	}
	c.AdminURL = envOr(d.app.getenv, localPostgresEnv, localpg.AdminURL)
	if err := errors.Join(d.streams.validate(), c.Validate()); err != nil {
		return err
	}
	key, err := d.app.labDLQKey()
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	c.Streams, c.DLQKey = d.streams.cfg, key
	c.Out, c.ErrOut, c.Logger = d.app.out, d.app.errOut, d.app.logger
	return demo.Run(ctx, c)
}
