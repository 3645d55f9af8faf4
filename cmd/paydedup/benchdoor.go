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

func newBenchDoorCmd(a *app) *cobra.Command {
	var c shipbench.DoorConfig
	cmd := &cobra.Command{
		Use:   "door",
		Short: "Measure the gateway as deployed under wrk, then POST to charged with the worker",
		Long: `bench door measures the product's door as users run it: this binary's own
"gateway" command, in its own process with its defaults, on a free loopback
port, with an API key made by "apikey create --merchant m_bench", loaded by
wrk (Debian's wrk, not our client) with POST /v1/payments, a fresh
Idempotency-Key per request. It runs three phases:

  door             wrk for --seconds with no worker: accepted/s (202s),
                   latency p50/p99/max, gateway and PostgreSQL CPU per POST
                   (from /proc, the gateway's backends by application_name);
  worker           this binary's "worker" drains what the door accepted:
                   payments/s, the figure the door is compared with;
  post-to-charged  wrk again with the worker running, then until every
                   accepted payment is completed: charged/s (completions
                   over the time from the first POST to the last
                   completion) and POST to charged p50/p99, from the
                   database's times (gateway_intake.created_at to
                   idempotency_keys.completed_at).

At the end no key may be charged twice (the simulator's ledger) and every
202 must be completed; otherwise the command fails. NATS, PostgreSQL and
--provider are as for "bench shipped". It needs wrk on PATH: install
Debian's wrk (apt-get install -y wrk) or run make bench-door.`,
		Example: `  paydedup bench door --json
  paydedup bench door --seconds 30 --connections 256`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if c.Binary == "" {
				bin, err := os.Executable()
				if err != nil {
					return fmt.Errorf("bench door: find this binary: %w", err)
				}
				c.Binary = bin
			}
			c.Out, c.ErrOut = a.out, a.errOut
			c.AdminURL = envOr(a.getenv, localPostgresEnv, localpg.AdminURL)
			_, err := shipbench.RunDoor(cmd.Context(), c)
			return err
		},
	}
	f := cmd.Flags()
	f.IntVar(&c.Seconds, "seconds", shipbench.DefaultDoorSeconds, "length of each wrk phase, in seconds")
	f.IntVar(&c.Connections, "connections", shipbench.DefaultDoorConnections, "wrk's open connections (-c)")
	f.IntVar(&c.Threads, "threads", shipbench.DefaultDoorThreads, "wrk's threads (-t)")
	f.StringVar(&c.Provider, "provider", shipbench.ProviderStripe, "stripe (the adapter calling provider-sim in its own process) or sim (PAYDEDUP_PROVIDER=sim, the simulator inside the worker)")
	f.StringVar(&c.Binary, "binary", "", "the paydedup binary whose commands are measured (default: this one)")
	f.BoolVar(&c.JSON, "json", false, "print one JSON object on the last line of stdout")
	f.DurationVar(&c.Timeout, "timeout", 10*time.Minute, "give up after this long")
	c.NATSURL = a.getenv("NATS_URL")
	c.DatabaseURL = a.getenv("DATABASE_URL")
	return cmd
}
