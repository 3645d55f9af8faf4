//go:build !nolab

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/lab/growth"
	"github.com/paydedup/paydedup/lab/localpg"
)

// DefaultGrowthWarmup is bench growth's warm-up per run: payments timed
// right after the preload measure a cold cache, not tables in service
// (docs/performance.md, "As the tables grow").
const DefaultGrowthWarmup = 60000

type benchGrowthCmd struct {
	app  *app
	cfg  growth.Config
	json bool
}

func newBenchGrowthCmd(a *app) *cobra.Command {
	g := &benchGrowthCmd{app: a}
	cmd := &cobra.Command{
		Use:   "growth",
		Short: "Run the bench with the tables already full: payments/s and CPU per payment against the rows present",
		Long: `bench growth runs paydedup bench once per --rows value, each in a fresh schema
preloaded with that many finished payments (bench --preload-rows; the key
rows capped at 10,000,000, over the last 48 h), the other settings the
bench's defaults, and writes payments/s, worker_cpu_us_per_payment and
pg_cpu_us_per_payment against the rows present as a PNG plot (--png) and a
Markdown table (--table). --timeout is per run and covers its preload.

Each run times --payments after a warm-up of --warmup payments of their own
(bench --warmup), so that the curve is of the steady state: right after a
bulk load the first payments pay once for reading the loaded pages and
writing their hint bits, which a deployment's long-lived tables do not.
--warmup 0 times the payments right after the preload.`,
		Example: `  paydedup bench growth --rows 0,1000000,3000000,10000000 --payments 60000
  make bench-growth ROWS=0,1000000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return g.Run(cmd.Context()) },
	}
	f := cmd.Flags()
	c := &g.cfg.Bench
	f.IntSliceVar(&g.cfg.Rows, "rows", growth.DefaultRows, "ledger rows preloaded, one run each")
	f.IntVar(&c.Payments, "payments", 60000, "distinct payments per run, timed")
	f.IntVar(&c.Warmup, "warmup", DefaultGrowthWarmup, "payments worked before the timed ones in each run, untimed (0: none)")
	f.DurationVar(&c.Timeout, "timeout", 2*time.Hour, "give up on a run (its preload included) after this long")
	f.StringVar(&g.cfg.PNG, "png", "docs/perf/growth.png", "write the plot here")
	f.StringVar(&g.cfg.Table, "table", "docs/perf/growth.md", "write the figures as a Markdown table here")
	f.BoolVar(&g.json, "json", false, "print the runs' results as one JSON array on the last line")
	c.DatabaseURL = a.getenv("DATABASE_URL")
	c.NATSURL = a.getenv("NATS_URL")
	return cmd
}

// Run runs the curve.
func (g *benchGrowthCmd) Run(ctx context.Context) error {
	c := &g.cfg.Bench
	c.Mode, c.Provider, c.Concurrency = "batched", "sim", 256
	c.FetchBatch, c.CommitBatch, c.CommitWait = consumer.DefaultFetchBatch, consumer.DefaultCommitBatch, consumer.DefaultCommitWait
	c.PoolSize, c.PreloadVacuum = consumer.DefaultPoolSize(), true
	key, err := g.app.labDLQKey()
	if err != nil {
		return fmt.Errorf("bench growth: %w", err)
	}
	c.DLQKey, c.Out, c.ErrOut = key, g.app.out, g.app.errOut
	c.AdminURL = envOr(g.app.getenv, localPostgresEnv, localpg.AdminURL)
	g.cfg.Out = g.app.errOut
	pts, err := growth.Run(ctx, g.cfg)
	if err != nil {
		return err
	}
	fmt.Fprint(g.app.out, growth.Table(pts))
	if g.json {
		out, _ := json.Marshal(pts)
		fmt.Fprintln(g.app.out, string(out))
	}
	return nil
}
