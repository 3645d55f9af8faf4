//go:build !nolab

package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/lab/shipbench"
)

func newBenchProviderCmd(a *app) *cobra.Command {
	var c shipbench.ProviderConfig
	cmd := &cobra.Command{
		Use:   "provider",
		Short: "Measure the shipped worker against the provider as it really is: latency, rate limit, concurrency limit",
		Long: `bench provider measures what production sees: this binary's "worker"
command, --workers processes of it with their defaults, charging through
the Stripe adapter against "paydedup provider-sim" in its own process over
HTTP, which answers with a log-normal latency (--latency-median,
--latency-p99), limits the account's requests per second (--rate-limit,
answered 429 global-rate past it, as Stripe does) and in flight
(--concurrency-limit, 429 global-concurrency).

Once the workers are ready it publishes --payments payments (over
--merchants merchants; at --publish-rate per second, or all at once), waits
until every one is charged, checks provider-sim's ledger (each charged
exactly once), and reports payments/s, the calls in flight at the provider
(mean and peak), publish→charged p50/p99 beside the provider's own latency
p50/p99 and the overhead above it, each worker's peak RSS, the share of
requests answered 429, the workers' pause lines and the dead letters.

The fairness scenario: --merchant-a-backlog N publishes merchant A's N
payments at once, then --merchant-b-after later merchant B's
--merchant-b-payments (at --publish-rate, or at once), and reports B's
publish→charged p99 and max beside when A's backlog was drained.

PostgreSQL: DATABASE_URL, or the paydedup_bench database on the local
server (PAYDEDUP_LOCAL_POSTGRES_URL); NATS: NATS_URL, or nats-server from
PATH. Each run works in a fresh schema and fresh streams.`,
		Example: `  paydedup bench provider --payments 3000
  paydedup bench provider --workers 2 --rate-limit 100 --payments 3000 --json
  paydedup bench provider --rate-limit 1000 --merchant-a-backlog 20000 --merchant-b-payments 100 --merchant-b-after 2s
  paydedup bench provider --worker-env PAYDEDUP_CONCURRENCY=2000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if c.BacklogA > 0 && cmd.Flags().Changed("payments") {
				return errors.New("bench provider: --payments and --merchant-a-backlog exclude each other: the fairness scenario publishes A's backlog and B's payments")
			}
			if err := checkModelFlags(c.Model); err != nil {
				return fmt.Errorf("bench provider: %w", err)
			}
			if err := resolveSetup(a, &c.Setup, "bench provider"); err != nil {
				return err
			}
			_, err := shipbench.RunProvider(cmd.Context(), c)
			return err
		},
	}
	f := cmd.Flags()
	f.IntVar(&c.Payments, "payments", shipbench.DefaultProviderPayments, "distinct payments published once the workers are ready")
	f.IntVar(&c.Merchants, "merchants", 1, "merchants the payments are spread over, round robin")
	f.Float64Var(&c.PublishRate, "publish-rate", 0, "payments published per second (0: all at once, a backlog)")
	f.IntVar(&c.Workers, "workers", 1, "worker processes")
	f.StringArrayVar(&c.WorkerEnv, "worker-env", nil, "KEY=VALUE setting for every worker (repeatable)")
	f.DurationVar(&c.Model.LatencyMedian, "latency-median", shipbench.DefaultProviderLatencyMedian, "the provider's median latency (log-normal)")
	f.DurationVar(&c.Model.LatencyP99, "latency-p99", shipbench.DefaultProviderLatencyP99, "the provider's 99th percentile latency")
	f.Float64Var(&c.Model.RateLimit, "rate-limit", 0, "the account's requests per second, 429 past it (0: none; Stripe live mode 100)")
	f.IntVar(&c.Model.ConcurrencyLimit, "concurrency-limit", 0, "the account's requests in flight, 429 past it (0: none)")
	f.IntVar(&c.BacklogA, "merchant-a-backlog", 0, "fairness scenario: merchant A's payments, published first (0: not this scenario)")
	f.IntVar(&c.PaymentsB, "merchant-b-payments", shipbench.DefaultMerchantBPayments, "fairness scenario: merchant B's payments")
	f.DurationVar(&c.Warmup, "warmup", 0, "also report publish→charged over the payments published this long or more after the first (0: no; the call limit's slow start is paid in the first seconds)")
	f.DurationVar(&c.BAfter, "merchant-b-after", shipbench.DefaultMerchantBAfter, "fairness scenario: how long after A's first publish B's are published")
	f.StringVar(&c.Provider, "provider", shipbench.ProviderStripe, "stripe (the adapter over plain HTTP) or stripe-tls (over HTTPS and HTTP/2, as to api.stripe.com)")
	f.StringVar(&c.Binary, "binary", "", "the paydedup binary whose worker is measured (default: this one)")
	f.BoolVar(&c.JSON, "json", false, "print one JSON object on the last line of stdout")
	f.DurationVar(&c.Timeout, "timeout", 10*time.Minute, "give up after this long")
	c.NATSURL = a.getenv("NATS_URL")
	c.DatabaseURL = a.getenv("DATABASE_URL")
	return cmd
}
