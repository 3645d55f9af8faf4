//go:build !nolab

package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/lab/benchcompare"
	"github.com/paydedup/paydedup/lab/localpg"
)

type benchCompareCmd struct {
	app      *app
	payments int
	rounds   int
	river    string
	riverURL string
	json     bool
	timeout  time.Duration
}

func newBenchCompareCmd(a *app) *cobra.Command {
	b := &benchCompareCmd{app: a}
	cmd := &cobra.Command{
		Use:   "compare",
		Short: "Compare the worker's rate with River's on the same PostgreSQL, interleaved",
		Long: `bench compare runs this binary's "bench --payments N --json" and River's own
benchmark, "river bench --num-total-jobs N", in turn on the same machine and
PostgreSQL server, A B A B (--rounds each), and reports every run, each
one's best, and the ratio: paydedup's best payments/s over River's best
jobs/s. Both time only the work of a backlog made beforehand: paydedup from
published commands to quiescence (claim, simulator charge, completion,
ack), River from inserted jobs to all worked by a no-op worker.

River works in its own database, paydedup_river, on the local server
(PAYDEDUP_LOCAL_POSTGRES_URL, default 127.0.0.1:5432), created when missing
and migrated with "river migrate-up"; --river-database-url names another.
paydedup's bench uses DATABASE_URL and NATS_URL as "paydedup bench" does.
"make bench-compare" builds River's CLI into bin/river and runs this.

The per-run process CPU is each command's own (user+system, setup
included) per item. PostgreSQL's is the whole server's over the same
command (every backend, those a pool opened and closed included, and its
background workers: autovacuum, the WAL writer, the checkpointer), read
from /proc through the postmaster when the server runs on this machine;
"both" is the two added, what one item cost the machine. When the server
is elsewhere, or paydedup's DATABASE_URL names another server than
River's, PostgreSQL's columns say "-" (-1 in the JSON), and a line on
standard error says why. The last line with --json is one JSON object.`,
		Example: `  make bench-compare N=20000
  paydedup bench compare --river bin/river --payments 60000 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return b.Run(cmd.Context()) },
	}
	f := cmd.Flags()
	f.IntVar(&b.payments, "payments", 60000, "payments for paydedup, jobs for River, per run")
	f.IntVar(&b.rounds, "rounds", benchcompare.DefaultRounds, "runs of each, interleaved; the best counts")
	f.StringVar(&b.river, "river", "river", "River's CLI (path, or a name on PATH)")
	f.StringVar(&b.riverURL, "river-database-url", "", "River's database (default: paydedup_river on the local server, created when missing)")
	f.BoolVar(&b.json, "json", false, "print one JSON object on the last line")
	f.DurationVar(&b.timeout, "timeout", time.Hour, "give up after this long")
	return cmd
}

// Run checks River's CLI is there, finds its database, and runs the comparison.
func (b *benchCompareCmd) Run(ctx context.Context) error {
	if b.payments < 1 || b.rounds < 1 {
		return fmt.Errorf("bench compare: --payments and --rounds must be at least 1, got %d and %d", b.payments, b.rounds)
	}
	river, err := exec.LookPath(b.river)
	if err != nil {
		return fmt.Errorf("bench compare: no River CLI: %w; %s", err, benchcompare.RiverInstall)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench compare: find this binary: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	dbURL := b.riverURL
	if dbURL == "" {
		admin := envOr(b.app.getenv, localPostgresEnv, localpg.AdminURL)
		if dbURL, err = benchcompare.RiverDatabaseURL(ctx, admin); err != nil {
			return fmt.Errorf("bench compare: River's database: %w", err)
		}
	}
	_, err = benchcompare.Compare(ctx, benchcompare.Config{
		ServerCPU: b.serverMeter(ctx, dbURL),
		Contestants: []benchcompare.Contestant{
			benchcompare.Paydedup(self, b.payments),
			benchcompare.River(river, dbURL, b.payments),
		},
		Rounds:   b.rounds,
		Baseline: "river",
		JSON:     b.json,
		Out:      b.app.out,
		ErrOut:   b.app.errOut,
	})
	if err != nil {
		return fmt.Errorf("bench compare: %w", err)
	}
	return nil
}

// serverMeter returns the reader of the PostgreSQL server's CPU time that
// both contestants use: River's database's server, when it runs on this
// machine and paydedup's bench uses the same one. nil, with a line on
// standard error saying why, when it cannot be metered.
func (b *benchCompareCmd) serverMeter(ctx context.Context, riverURL string) func() (time.Duration, error) {
	river, err := localpg.MeterServer(ctx, riverURL)
	if err == nil {
		ours := cmp.Or(b.app.getenv("DATABASE_URL"), envOr(b.app.getenv, localPostgresEnv, localpg.AdminURL))
		var m localpg.ServerMeter
		if m, err = localpg.MeterServer(ctx, ours); err == nil && m != river {
			err = fmt.Errorf("paydedup's DATABASE_URL is served by postmaster %d, River's database by %d", m.Postmaster, river.Postmaster)
		}
	}
	if err != nil {
		fmt.Fprintf(b.app.errOut, "bench compare: PostgreSQL's CPU is not metered: %v\n", err)
		return nil
	}
	return river.CPU
}
