//go:build !nolab

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/lab/bench"
	"github.com/paydedup/paydedup/lab/localpg"
)

type benchCmd struct {
	app *app
	cfg bench.Config
}

func newBenchCmd(a *app) *cobra.Command {
	b := &benchCmd{app: a}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure exactly-once throughput through real NATS and PostgreSQL",
		Long: `bench publishes payment commands first, then times one worker consuming them to
quiescence through real NATS JetStream and PostgreSQL, with the simulator
in-process (no network hop; --provider-latency adds latency per call), and
checks the simulator's ledger at the end: every payment charged exactly once.

NATS: NATS_URL, or an embedded server. PostgreSQL: DATABASE_URL, or the
paydedup_bench database (created if missing) on the local server
(PAYDEDUP_LOCAL_POSTGRES_URL, default 127.0.0.1:5432), else on a private
throwaway cluster from this machine's PostgreSQL binaries, else in a
container when a Docker engine answers. Each run works in a
fresh schema and fresh streams and removes them at the end.

--provider sim calls the simulator through its Go client (no HTTP), so the
figures are the service's own; --provider stripe goes through the Stripe
adapter as production does (stripe-go, form encoding, JSON), its HTTP
served in-process by the simulator, which adds that client library's CPU to
every charge.

--mode batched is the worker as shipped: batch fetch, one claim round trip
per batch, a bounded pool of provider calls, group-committed completions.
--mode naive is the seeds' per-message design: each message alone, claim
statement (autocommit), provider call, complete statement (autocommit), ack,
with --concurrency handlers in parallel (default 1). --compare-naive runs
the naive design after the batched run, at 1, 8 and 32 handlers with
--naive-payments each, and reports the best and the ratio batched/best.

--json also reports CPU time per payment over the consumption phase:
pg_cpu_us_per_payment from /proc/<pid>/schedstat (ns) of the Postgres
backends serving the bench's own connections (found by application_name;
the cluster's WAL writer and checkpointer and other clients are not
counted; -1 when the server is on another machine), and the bench
process's CPU time split by pprof labels into worker_cpu_us_per_payment,
sim_cpu_us_per_payment and nats_cpu_us_per_payment (with NATS_URL, the
server is out of process and not counted). The live heap at the end is
split the same way.

--preload-rows N fills the fresh schema, before publishing, with N finished
payments as the worker leaves them (set-based INSERT … SELECT, then VACUUM
(ANALYZE)): ledger rows, and for the newest --preload-keys of them their
completed idempotency-key rows, created over the last 48 h (the key
retention) in day partitions laid out as a deployment two days old has them;
the older ledger rows' keys are purged, as in production. Two days of keys
at the bench's rate would be billions of rows: --preload-keys is capped at
10,000,000 by default. --timeout covers the preload. --window N reports
payments/s and the resident set per window of N settled payments.

--warmup N first publishes N payments of their own and has a worker settle
them, untimed, then stops it and times --payments more: every figure is of
the timed payments. Right after a bulk load PostgreSQL pays once for what a
long-lived deployment does not (the loaded pages read for the first time,
their hint bits written); a warm-up measures the steady state.

--duplicates F republishes F×N of the commands with their own message ids, so
they reach the worker (they are not dropped by the stream's duplicate
window). --completed-duplicates then republishes all N again, every key
already completed, and times those separately.

The last line with --json is one JSON object.`,
		Example: `  paydedup bench --payments 20000 --mode batched --json
  paydedup bench --payments 2000 --mode naive --concurrency 32
  paydedup bench --payments 20000 --compare-naive --json
  paydedup bench --payments 20000 --provider-latency 50ms --concurrency 256
  paydedup bench --payments 20000 --completed-duplicates
  paydedup bench --payments 60000 --preload-rows 10000000 --timeout 2h --json
  paydedup bench --payments 1000000 --window 100000 --json
  paydedup bench --payments 60000 --warmup 60000 --preload-rows 10000000 --timeout 2h --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if b.cfg.Mode == "naive" && !cmd.Flags().Changed("concurrency") {
				b.cfg.Concurrency = 1 // the naive design's own default: one message at a time
			}
			return b.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	c := &b.cfg
	f.IntVar(&c.Payments, "payments", 20000, "distinct payments")
	f.Float64Var(&c.Duplicates, "duplicates", 0, "fraction of payments published a second time, interleaved (0..1)")
	f.DurationVar(&c.ProviderLatency, "provider-latency", 0, "latency of every provider call")
	f.IntVar(&c.Concurrency, "concurrency", 256, "provider calls in flight (batched mode); handlers in parallel (naive mode, default 1)")
	f.StringVar(&c.Mode, "mode", "batched", "batched or naive")
	f.BoolVar(&c.CompareNaive, "compare-naive", false, "afterwards, run the naive design at 1, 8 and 32 handlers and report batched/best")
	f.IntVar(&c.NaivePayments, "naive-payments", 3000, "payments per naive run of --compare-naive")
	f.StringVar(&c.Provider, "provider", "sim", "sim (the simulator's Go client) or stripe (the Stripe adapter over in-process HTTP)")
	f.IntVar(&c.FetchBatch, "fetch-batch", consumer.DefaultFetchBatch, "messages per fetch and claim (batched mode)")
	f.IntVar(&c.CommitBatch, "commit-batch", consumer.DefaultCommitBatch, "completions per group commit (batched mode)")
	f.DurationVar(&c.CommitWait, "commit-wait", consumer.DefaultCommitWait, "how long a group commit waits for more completions (batched mode)")
	f.IntVar(&c.PoolSize, "pool-size", consumer.DefaultPoolSize(), "the worker's PostgreSQL connections, as paydedup worker's --pool-size (batched mode; naive mode takes at least one per handler); pool_max_conns in DATABASE_URL wins")
	f.BoolVar(&c.CompletedDuplicates, "completed-duplicates", false, "afterwards, republish every payment (all completed) and time the duplicates")
	f.BoolVar(&c.JSON, "json", false, "print one JSON object on the last line")
	f.DurationVar(&c.Timeout, "timeout", 10*time.Minute, "give up after this long")
	f.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of the consumption phase to this file (go tool pprof); with --completed-duplicates, that phase's to FILE.duplicates")
	f.StringVar(&c.MemProfile, "memprofile", "", "write a heap profile at the end to this file (go tool pprof)")
	f.IntVar(&c.PreloadRows, "preload-rows", 0, "before publishing, fill the fresh schema with this many finished payments (ledger rows; see --preload-keys)")
	f.IntVar(&c.PreloadKeys, "preload-keys", -1, "of the preloaded payments, how many (the newest) keep their key rows, spread over the last 48 h; default min(--preload-rows, 10000000)")
	f.BoolVar(&c.PreloadVacuum, "preload-vacuum", true, "VACUUM (ANALYZE) the preloaded tables, as a long-lived table is vacuumed; false: ANALYZE only")
	f.IntVar(&c.Window, "window", 0, "also report payments/s and RSS per window of this many settled payments (0: none)")
	f.IntVar(&c.Warmup, "warmup", 0, "first work this many payments of their own, untimed (not with --duplicates or --compare-naive)")
	c.DatabaseURL = a.getenv("DATABASE_URL")
	c.NATSURL = a.getenv("NATS_URL")
	cmd.AddCommand(newBenchGatewayCmd(a))
	cmd.AddCommand(newBenchCompareCmd(a))
	cmd.AddCommand(newBenchGrowthCmd(a))
	cmd.AddCommand(newBenchShippedCmd(a))
	cmd.AddCommand(newBenchDoorCmd(a))
	cmd.AddCommand(newBenchProviderCmd(a))
	return cmd
}

// Run runs one benchmark.
func (b *benchCmd) Run(ctx context.Context) error {
	c := b.cfg
	if c.PreloadKeys < 0 {
		c.PreloadKeys = min(c.PreloadRows, bench.DefaultPreloadKeysCap)
	}
	if err := c.Validate(); err != nil {
		return err
	}
	key, err := b.app.labDLQKey()
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	c.DLQKey, c.Out, c.ErrOut = key, b.app.out, b.app.errOut
	c.AdminURL = envOr(b.app.getenv, localPostgresEnv, localpg.AdminURL)
	return bench.Run(ctx, c)
}
