//go:build !nolab

package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/lab/localpg"
	"github.com/paydedup/paydedup/lab/shipbench"
)

func newBenchShippedCmd(a *app) *cobra.Command {
	var c shipbench.Config
	cmd := &cobra.Command{
		Use:   "shipped",
		Short: "Measure the worker as deployed: paydedup worker in its own process, over TCP",
		Long: `bench shipped measures what users run: it publishes a backlog with this
binary's own "publish --generate", then times this binary's "worker" command,
in its own process with its defaults, draining it through a NATS server and
a provider in processes of their own, over TCP.

--provider stripe-tls (the default) is production's path: the Stripe adapter
(stripe-go) calling "paydedup provider-sim" in its own process over HTTPS
and HTTP/2, as it calls api.stripe.com, with a certificate made for the run
that the worker trusts through SSL_CERT_FILE; the simulator's CPU is counted
apart, as Stripe's servers would be. --provider stripe is the same over
plain HTTP/1.1, which leaves the worker's TLS and HTTP/2 cost out. --provider
sim is PAYDEDUP_PROVIDER=sim: the simulator served inside the worker's
process, whose CPU then counts as the worker's.

CPU per payment is read from /proc for each process apart: the worker, its
PostgreSQL backends (by application_name), provider-sim, and the NATS
server when this command started it (no NATS_URL: nats-server from PATH on
a free loopback port), and the whole PostgreSQL server over the drain
(through its postmaster, when the server runs on this machine: background
workers included). The simulator's ledger is checked at the end: no key
charged twice, every payment settled.

The worker's admin listener is on, as the deploy tree runs it
(PAYDEDUP_ADMIN_ADDR on a free loopback port, or the one --worker-env
gives), and the worker's mean batches are read from its /metrics at the
end: messages per claim statement, completions per group commit.

PostgreSQL: DATABASE_URL, or the paydedup_bench database on the local
server (PAYDEDUP_LOCAL_POSTGRES_URL); each run works in a fresh schema and
fresh streams and removes them at the end. --worker-env passes settings to
the worker (repeatable), e.g. --worker-env PAYDEDUP_CONCURRENCY=256.`,
		Example: `  paydedup bench shipped --payments 60000 --json
  paydedup bench shipped --provider sim
  paydedup bench shipped --worker-env PAYDEDUP_LOG_LEVEL=warn`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := resolveSetup(a, &c.Setup, "bench shipped"); err != nil {
				return err
			}
			_, err := shipbench.Run(cmd.Context(), c)
			return err
		},
	}
	f := cmd.Flags()
	f.IntVar(&c.Payments, "payments", 60000, "distinct payments published, then drained")
	f.StringArrayVar(&c.WorkerEnv, "worker-env", nil, "KEY=VALUE setting for the worker (repeatable)")
	bindSetup(cmd, a, &c.Setup)
	return cmd
}

// bindSetup binds the flags and variables every bench of the shipped binary
// shares (bench shipped, bench door).
func bindSetup(cmd *cobra.Command, a *app, s *shipbench.Setup) {
	f := cmd.Flags()
	f.StringVar(&s.Provider, "provider", shipbench.ProviderStripeTLS, "stripe-tls (the adapter calling provider-sim in its own process over HTTPS and HTTP/2), stripe (the same over plain HTTP/1.1) or sim (PAYDEDUP_PROVIDER=sim, the simulator inside the worker)")
	f.StringVar(&s.Binary, "binary", "", "the paydedup binary whose commands are measured (default: this one)")
	f.BoolVar(&s.JSON, "json", false, "print one JSON object on the last line of stdout")
	f.DurationVar(&s.Timeout, "timeout", 10*time.Minute, "give up after this long")
	s.NATSURL = a.getenv("NATS_URL")
	s.DatabaseURL = a.getenv("DATABASE_URL")
}

// resolveSetup fills in what bindSetup leaves to the run: this binary
// unless --binary, the outputs, the local PostgreSQL's admin URL.
func resolveSetup(a *app, s *shipbench.Setup, name string) error {
	if s.Binary == "" {
		bin, err := os.Executable()
		if err != nil {
			return fmt.Errorf("%s: find this binary: %w", name, err)
		}
		s.Binary = bin
	}
	s.Out, s.ErrOut = a.out, a.errOut
	s.AdminURL = envOr(a.getenv, localPostgresEnv, localpg.AdminURL)
	return nil
}
