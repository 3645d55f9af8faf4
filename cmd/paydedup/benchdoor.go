//go:build !nolab

package main

import (
	"github.com/spf13/cobra"

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
                   payments/s, the figure the door is compared with, and
                   CPU per payment of the worker, its PostgreSQL backends,
                   provider-sim and the idle gateway;
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
			if err := resolveSetup(a, &c.Setup, "bench door"); err != nil {
				return err
			}
			_, err := shipbench.RunDoor(cmd.Context(), c)
			return err
		},
	}
	f := cmd.Flags()
	f.IntVar(&c.Seconds, "seconds", shipbench.DefaultDoorSeconds, "length of each wrk phase, in seconds")
	f.IntVar(&c.Connections, "connections", shipbench.DefaultDoorConnections, "wrk's open connections (-c)")
	f.IntVar(&c.Threads, "threads", shipbench.DefaultDoorThreads, "wrk's threads (-t)")
	bindSetup(cmd, a, &c.Setup)
	return cmd
}
