package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	budgetstore "github.com/paydedup/paydedup/budget/pgstore"
	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/ops"
	"github.com/paydedup/paydedup/reconciler"
)

// reconcileFlags configure the reconciler, in `reconcile` and in `worker`.
type reconcileFlags struct {
	interval  time.Duration
	grace     time.Duration
	searchLag time.Duration
	// The pause before a row's next lookup after a failed one, doubling up
	// to backoffMax.
	backoff, backoffMax time.Duration
}

// bind binds the flags, named with prefix ("" in reconcile, "reconcile-"
// in worker).
func (r *reconcileFlags) bind(cmd *cobra.Command, a *app, prefix string) {
	f := cmd.Flags()
	f.DurationVar(&r.interval, prefix+"interval", a.envDuration("PAYDEDUP_RECONCILE_INTERVAL", reconciler.DefaultInterval), "pause between reconciler passes (PAYDEDUP_RECONCILE_INTERVAL)")
	f.DurationVar(&r.grace, prefix+"grace", a.envDuration("PAYDEDUP_RECONCILE_GRACE", reconciler.DefaultGrace), "how long a lease must have expired before the reconciler takes the row (PAYDEDUP_RECONCILE_GRACE)")
	f.DurationVar(&r.searchLag, prefix+"search-lag", a.envDuration("PAYDEDUP_SEARCH_LAG", reconciler.DefaultSearchLag),
		"how long after a row's last lease ended a provider's not-found counts: the provider's execution of a request our call gave up on, plus its search lag; at least "+
			reconciler.StripeMinSearchLag.String()+" with Stripe (PAYDEDUP_SEARCH_LAG)")
	f.DurationVar(&r.backoff, prefix+"lookup-backoff", a.envDuration("PAYDEDUP_LOOKUP_BACKOFF", reconciler.DefaultLookupBackoff),
		"pause before a stuck row's next provider lookup after a failed one, doubled on each consecutive failure (PAYDEDUP_LOOKUP_BACKOFF)")
	f.DurationVar(&r.backoffMax, prefix+"lookup-backoff-max", a.envDuration("PAYDEDUP_LOOKUP_BACKOFF_MAX", reconciler.DefaultLookupBackoffMax),
		"longest pause between a stuck row's lookups (PAYDEDUP_LOOKUP_BACKOFF_MAX)")
}

// minSearchLag is the floor of the search lag with the provider: Stripe
// itself may still charge after our call gave up, and its search lags. A
// STRIPE_API_BASE (a proxy, the simulator) or the in-process simulator sets
// no floor: whoever points paydedup there knows that endpoint's lags.
func minSearchLag(p providerFlags) time.Duration {
	if p.kind == "stripe" && p.apiBase == "" {
		return reconciler.StripeMinSearchLag
	}
	return 0
}

// validate checks the flags for the provider.
func (r *reconcileFlags) validate(p providerFlags) error {
	if r.backoff <= 0 {
		return fmt.Errorf("PAYDEDUP_LOOKUP_BACKOFF / --lookup-backoff must be positive, got %v", r.backoff)
	}
	if r.backoffMax < r.backoff {
		return fmt.Errorf("PAYDEDUP_LOOKUP_BACKOFF_MAX / --lookup-backoff-max %v is shorter than PAYDEDUP_LOOKUP_BACKOFF %v", r.backoffMax, r.backoff)
	}
	if floor := minSearchLag(p); r.searchLag < floor {
		return fmt.Errorf("PAYDEDUP_SEARCH_LAG / --search-lag %v is shorter than %v: Stripe may still charge up to %v after our call gave up, and its search shows a charge up to %v later, so a not-found before then proves nothing",
			r.searchLag, floor, reconciler.StripeExecution, reconciler.StripeIndexLag)
	}
	return nil
}

// config is the reconciler configuration with the given logger and metrics.
func (r *reconcileFlags) config(p providerFlags, log *slog.Logger, m reconciler.Metrics) reconciler.Config {
	return reconciler.Config{Interval: r.interval, Grace: r.grace, SearchLag: r.searchLag,
		MinSearchLag: minSearchLag(p), LookupBackoff: r.backoff, LookupBackoffMax: r.backoffMax, Logger: log, Metrics: m}
}

type reconcileCmd struct {
	app       *app
	db        databaseFlag
	prov      providerFlags
	rec       reconcileFlags
	once      bool
	retention time.Duration
	adminAddr string
}

func newReconcileCmd(a *app) *cobra.Command {
	r := &reconcileCmd{app: a, prov: providerFlags{reader: "reconcile"}}
	cmd := &cobra.Command{
		Use:   "reconcile",
		Short: "Resolve payments a crash left pending, and purge expired keys",
		Long: `reconcile finds idempotency rows left pending (their lease expired more than a
grace period ago), asks the provider what happened under the row's provider
key with a non-charging lookup, and completes the row (charged or declined),
marks it failed when the provider provably has nothing, or leaves it for the
next pass (a failed lookup backs the row off: 1 min, doubling to 30 min). A
"nothing" counts only once --search-lag has passed since the row's last
lease: the provider may still be executing a request our call gave up on,
and its search lags behind its charges. It also applies the key retention:
it creates the keys table's coming day partitions and drops, whole, each day
older than --key-retention that holds no pending row (a pending row keeps
its day until it is resolved), and purges the finished rows of the
pre-partitioning and default partitions past their retention. Any number may
run at once. paydedup worker runs it in-process by default; this command runs
it alone.`,
		Example: `  paydedup reconcile --once            # one pass, then exit
  PAYDEDUP_PROVIDER=stripe STRIPE_SECRET_KEY=sk_... paydedup reconcile --interval 30s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return r.Run(cmd.Context()) },
	}
	r.db.bind(cmd, a)
	r.prov.bind(cmd, a)
	f := cmd.Flags()
	r.rec.bind(cmd, a, "")
	f.BoolVar(&r.once, "once", false, "run one pass and exit")
	f.DurationVar(&r.retention, "key-retention", a.envDuration("PAYDEDUP_KEY_RETENTION", consumer.DefaultKeyRetention), "how long finished keys are kept (PAYDEDUP_KEY_RETENTION)")
	f.StringVar(&r.adminAddr, "admin-addr", a.getenv("PAYDEDUP_ADMIN_ADDR"), "address of the /metrics, /livez, /readyz listener; empty disables it (PAYDEDUP_ADMIN_ADDR)")
	return cmd
}

// Run runs one pass (--once) or passes until ctx ends.
func (r *reconcileCmd) Run(ctx context.Context) error {
	if err := errors.Join(r.db.validate(), r.prov.validate(), r.rec.validate(r.prov)); err != nil {
		return err
	}
	pool, err := pg.Connect(ctx, r.db.url)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := dedup.New(pool, dedup.Config{Retention: r.retention})
	if err != nil {
		return err
	}
	prov, stopSim, err := r.prov.build(ctx)
	if err != nil {
		return err
	}
	defer stopSim()
	reg := prometheus.NewRegistry()
	metrics := ops.NewMetrics(reg, version)
	// Its lookups draw on the fleet's provider budget, as the workers' do.
	bstore, err := budgetstore.New(pool, budgetstore.Config{})
	if err != nil {
		return err
	}
	budgeted, err := r.prov.budgeted(bstore, prov, r.app.logger, reg)
	if err != nil {
		return err
	}
	rec, err := reconciler.New(store, budgeted, r.rec.config(r.prov, r.app.logger, metrics))
	if err != nil {
		return err
	}
	if r.once {
		res, err := rec.RunOnce(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(r.app.out, "reconcile: examined=%d completed=%d declined=%d failed=%d left=%d lease_lost=%d errors=%d purged=%d\n",
			res.Examined, res.Completed, res.Declined, res.Failed, res.Left, res.LeaseLost, res.Errors, res.Purged)
		return nil
	}
	if r.adminAddr != "" {
		admin, err := ops.NewAdmin(r.adminAddr, reg, r.app.logger)
		if err != nil {
			return err
		}
		admin.AddCheck("postgres", store.Ping)
		go func() { _ = admin.Serve(ctx) }()
	}
	if err := rec.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	rec.Stop()
	return nil
}
