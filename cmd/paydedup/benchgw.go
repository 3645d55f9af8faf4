//go:build !nolab

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/lab/gwbench"
	"github.com/paydedup/paydedup/lab/localpg"
)

type benchGatewayCmd struct {
	app *app
	cfg gwbench.Config
}

func newBenchGatewayCmd(a *app) *cobra.Command {
	b := &benchGatewayCmd{app: a}
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Measure the HTTP gateway's intake through real NATS and PostgreSQL",
		Long: `bench gateway starts the gateway in process over real PostgreSQL and NATS
JetStream (no worker: it measures what the door takes in) and drives it with
--connections concurrent HTTP/1.1 keep-alive clients: --requests distinct
payments with unique Idempotency-Keys, a share (--retries) sent again with
the same key, a share (--duplicates) sent twice at the same moment. At the
end every accepted (202) payment must be published in the gateway's intake
and on the stream exactly once, and nothing else on the stream; otherwise
the command exits non-zero.

It measures the gateway as shipped: its batched intake, the only way a
POST is taken in (there is no --mode any more: the per-request path it
was compared with is gone), on --pool-size connections.

Figures: requests_per_sec counts every POST, accepted the 202s; latencies
are per POST as the client sees them; pg_round_trips_per_request counts
statements and pipelined batches sent to PostgreSQL; cpu_ms_per_request is
this process's CPU (clients, gateway and an embedded NATS server).

CPU per POST over the load, in µs, split as "paydedup bench" splits the
worker's: pg_cpu_us_per_request from /proc/<pid>/schedstat (ns) of the
PostgreSQL backends serving the gateway's pool (-1 when the server is not
on this machine; the cluster's WAL writer and checkpointer are not
counted); this process's CPU (getrusage) split by a CPU profile's pprof
labels and frames into client_cpu_us_per_request (the load's HTTP clients
and their transport), nats_cpu_us_per_request (the embedded NATS server; 0
with NATS_URL, whose server is out of process) and
gateway_cpu_us_per_request, the rest: the gateway's HTTP server, handlers,
batches, pgx and nats.go, and the runtime's background GC (so an upper
bound).

NATS: NATS_URL, or an embedded server. PostgreSQL: DATABASE_URL, or the
paydedup_bench database on the local server, as "paydedup bench".
The last line with --json is one JSON object.`,
		Example: `  paydedup bench gateway --connections 128 --json
  paydedup bench gateway --requests 100000 --worker`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return b.Run(cmd.Context()) },
	}
	f := cmd.Flags()
	c := &b.cfg
	f.IntVar(&c.Connections, "connections", 128, "concurrent keep-alive HTTP clients")
	f.IntVar(&c.Requests, "requests", 30000, "distinct payments")
	f.Float64Var(&c.Retries, "retries", 0.05, "fraction of payments sent again with the same key after the answer (0..1)")
	f.Float64Var(&c.Duplicates, "duplicates", 0.02, "fraction of payments sent twice at the same moment (0..1)")
	f.IntVar(&c.Merchants, "merchants", 4, "merchants (one API key each) the payments are spread over")
	f.IntVar(&c.PoolSize, "pool-size", gateway.DefaultPoolSize, "the gateway's PostgreSQL pool")
	f.IntVar(&c.BatchSize, "batch-size", gateway.DefaultBatchSize, "POSTs per batch")
	f.DurationVar(&c.BatchWindow, "batch-window", gateway.DefaultBatchWindow, "how long a batch waits for one more POST while another batch is being settled")
	f.IntVar(&c.Flushers, "flushers", gateway.DefaultFlushers, "batches settled at once")
	f.BoolVar(&c.Worker, "worker", false, "run the worker in process too (charging the Stripe simulator) and report POST→charged rate and latency, double charges and lost payments")
	f.BoolVar(&c.JSON, "json", false, "print one JSON object on the last line")
	f.DurationVar(&c.Timeout, "timeout", 10*time.Minute, "give up after this long")
	f.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of the load to this file (go tool pprof)")
	c.DatabaseURL = a.getenv("DATABASE_URL")
	c.NATSURL = a.getenv("NATS_URL")
	return cmd
}

// Run runs the gateway bench.
func (b *benchGatewayCmd) Run(ctx context.Context) error {
	c := b.cfg
	if err := c.Validate(); err != nil {
		return err
	}
	key, err := b.app.labDLQKey()
	if err != nil {
		return fmt.Errorf("bench gateway: %w", err)
	}
	c.DLQKey, c.Out, c.ErrOut = key, b.app.out, b.app.errOut
	c.AdminURL = envOr(b.app.getenv, localPostgresEnv, localpg.AdminURL)
	return gwbench.Run(ctx, c)
}
