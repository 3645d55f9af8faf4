package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/audit"
	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/ops"
)

type auditCmd struct {
	app       *app
	db        databaseFlag
	prov      providerFlags
	since     string
	until     string
	merchant  string
	margin    time.Duration
	json      bool
	every     time.Duration
	timeout   time.Duration
	adminAddr string
}

func newAuditCmd(a *app) *cobra.Command {
	c := &auditCmd{app: a, prov: providerFlags{reader: "audit"}}
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Check the ledger against the provider's own records: exit non-zero on any drift",
		Long: `audit lists the payment intents the provider created in a window (Stripe's list
API, every page), matches them with the payments ledger by their metadata
(merchant_id, idempotency_key), and reports every disagreement, each with a
severity (critical: money moved or may still move that the ledger does not
show, or the ledger shows money that did not move; warning: the ledger lags
the provider, or a request moved no money). A processing intent is money
that may still move: it counts as a possible charge.

  double_charge               two or more charged intents for one key
  possible_double_charge      two or more intents for one key that charged or may
                              still charge (one succeeded, another processing)
  lost_charge                 the ledger says declined or failed, its intent charged
  unrecorded_charge           a charged intent the ledger row does not name
  possible_lost_charge        the ledger says declined or failed, its intent is processing
  possible_unrecorded_charge  a processing intent the ledger row does not name
  missing_ledger              intents with our metadata and no ledger row (the detail
                              says what the key's idempotency row is: pending, failed, none)
  missing_intent              a ledger row whose intent the provider does not have
  success_not_charged         the ledger says succeeded, its intent moved no money
  success_unsettled           the ledger says succeeded, its intent is still processing
  amount_mismatch, currency_mismatch
  unrecorded_capture          the ledger says authorized, its intent was captured
                              (succeeded) or is processing
  canceled_but_charged        the ledger says canceled, its intent was captured, still
                              holds the money for capture, or is processing
  unsettled_charge (warning)  the ledger says processing, its intent succeeded
  unsettled_failure (warning) the ledger says processing, its intent ended without money
  unsettled_cancel (warning)  the ledger says authorized, its intent holds no money
                              (voided at the provider, or its capture window ran out)
  extra_intent (warning)      a second intent for one payment that moved no money

The refunds of every payment the ledger holds as succeeded are compared with
the provider's refunds of its intent (keyed by the refund's own key; the
account's refunds are listed once, 100 a page, from the earliest audited
intent, not once per payment):

  double_refund               two or more provider refunds for one refund key
  unrecorded_refund           a provider refund (pending or succeeded) the ledger lacks
  missing_refund              a ledger refund the provider does not list
  refund_mismatch             amounts, refund ids or outcomes that differ
  unsettled_refund (warning)  the ledger says processing, the provider's refund ended

The window is [--since, --until) by creation time: each a duration before now
(24h) or an RFC 3339 time. --until defaults to 15m ago, so that payments in
flight, or left pending by a crash the reconciler is about to resolve, have
their ledger row. The list reaches --margin past both ends; a ledger row whose
intent lies further out is retrieved by id, so the margin saves calls, not
findings. Stripe's created is in whole seconds: an intent is the window's
when its second overlaps the window. Intents without our metadata (another
system's) are counted and left alone. audit only reads: the worker's database role suffices.

It reads Stripe with STRIPE_SECRET_KEY, the secret key of the account that
charged the ledger's payments (STRIPE_API_BASE when they were charged at a
Stripe stand-in). Never audit a real ledger against the in-process simulator
(PAYDEDUP_PROVIDER=sim): it starts empty, so every row would be missing_intent.

It exits 0 when the ledger and the provider agree, and non-zero with
"audit: DRIFT: ..." when they do not (or with another error when it could not
read everything: a partial list is never reported). With --every it runs
until stopped, one audit per period over the window that ends --until ago,
and serves paydedup_audit_findings{kind} on the admin listener instead of
exiting.`,
		Example: `  paydedup audit --since 24h
  paydedup audit --since 2025-06-01T00:00:00Z --until 2025-06-02T00:00:00Z --merchant m_acme
  paydedup audit --since 1h --until 0 --json | jq '.findings[] | select(.kind == "double_charge")'
  paydedup audit --every 1h --since 25h --admin-addr :9090`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return c.Run(cmd.Context()) },
	}
	c.db.bind(cmd, a)
	c.prov.bind(cmd, a)
	f := cmd.Flags()
	f.StringVar(&c.since, "since", "24h", "start of the window: a duration before now (24h) or an RFC 3339 time")
	f.StringVar(&c.until, "until", audit.DefaultSettle.String(), "end of the window, excluded: a duration before now (0 for now) or an RFC 3339 time")
	f.StringVar(&c.merchant, "merchant", "", "audit only this merchant")
	f.DurationVar(&c.margin, "margin", audit.DefaultMargin, "how far past both ends of the window the provider's intents are listed")
	f.BoolVar(&c.json, "json", false, "print the report as one JSON object")
	f.DurationVar(&c.every, "every", 0, "run an audit every this long until stopped, serving its gauges on --admin-addr (0: once, exit status says)")
	f.DurationVar(&c.timeout, "timeout", 10*time.Minute, "bound on one audit")
	f.StringVar(&c.adminAddr, "admin-addr", a.getenv("PAYDEDUP_ADMIN_ADDR"), "with --every: address of the /metrics, /livez, /readyz listener; empty disables it (PAYDEDUP_ADMIN_ADDR)")
	return cmd
}

// parseWhen reads a window end: a duration before now, or an RFC 3339
// time.
func parseWhen(flag, v string, now time.Time) (time.Time, error) {
	if v == "0" || v == "now" {
		return now, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("--%s %s: a duration counts back from now and must not be negative", flag, v)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("--%s %q is neither a duration before now (24h) nor an RFC 3339 time (2025-06-01T00:00:00Z)", flag, v)
	}
	return t, nil
}

// window is the audit's configuration at now.
func (c *auditCmd) window(now time.Time) (audit.Config, error) {
	since, err := parseWhen("since", c.since, now)
	if err != nil {
		return audit.Config{}, err
	}
	until, err := parseWhen("until", c.until, now)
	if err != nil {
		return audit.Config{}, err
	}
	cfg := audit.Config{Since: since, Until: until, MerchantID: c.merchant, Margin: c.margin}
	if c.margin <= 0 {
		return cfg, fmt.Errorf("--margin must be positive, got %v", c.margin)
	}
	if !since.Before(until) {
		return cfg, fmt.Errorf("--since %s is not before --until %s: the window is empty", since.UTC().Format(time.RFC3339), until.UTC().Format(time.RFC3339))
	}
	return cfg, nil
}

// Run audits once (the exit status says whether the ledger and the provider
// agree) or, with --every, until ctx ends.
func (c *auditCmd) Run(ctx context.Context) error {
	_, werr := c.window(time.Now())
	var everyErr error
	if c.every < 0 {
		everyErr = fmt.Errorf("--every must not be negative, got %v", c.every)
	}
	if c.timeout <= 0 {
		everyErr = errors.Join(everyErr, fmt.Errorf("--timeout must be positive, got %v", c.timeout))
	}
	if err := errors.Join(c.db.validate(), c.prov.validate(), werr, everyErr); err != nil {
		return err
	}
	store, closeDB, err := openStore(ctx, c.db.url, consumer.DefaultKeyRetention)
	if err != nil {
		return err
	}
	defer closeDB()
	prov, stopSim, err := c.prov.build(ctx)
	if err != nil {
		return err
	}
	defer stopSim()

	if c.every == 0 {
		rep, err := c.once(ctx, prov, store)
		if err != nil {
			return err
		}
		if err := c.print(rep); err != nil {
			return err
		}
		return rep.DriftError()
	}

	reg := prometheus.NewRegistry()
	metrics := audit.NewMetrics(reg)
	if c.adminAddr != "" {
		admin, err := ops.NewAdmin(c.adminAddr, reg, c.app.logger)
		if err != nil {
			return err
		}
		admin.AddCheck("postgres", store.Ping)
		go func() { _ = admin.Serve(ctx) }()
	}
	t := time.NewTicker(c.every)
	defer t.Stop()
	for {
		rep, err := c.once(ctx, prov, store)
		metrics.Observe(rep, err, time.Now())
		c.log(rep, err)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (c *auditCmd) once(ctx context.Context, prov audit.Provider, ledger audit.Ledger) (*audit.Report, error) {
	cfg, err := c.window(time.Now())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return audit.Run(ctx, prov, ledger, cfg)
}

// log reports one audit of --every.
func (c *auditCmd) log(rep *audit.Report, err error) {
	log := c.app.logger
	if err != nil {
		log.Error("audit failed", "error", err)
		return
	}
	for _, f := range rep.Findings {
		log.Error("audit drift", "kind", f.Kind, "severity", f.Severity, "merchant_id", f.MerchantID, "idempotency_key", f.IdempotencyKey,
			"intent_ids", f.IntentIDs, "charge_id", f.ChargeID, "detail", f.Detail)
	}
	log.Info("audit done", "since", rep.Since, "until", rep.Until, "intents", rep.Intents, "ledger_rows", rep.LedgerRows,
		"keys", rep.Keys, "findings", len(rep.Findings), "summary", rep.Summary())
}

func (c *auditCmd) print(rep *audit.Report) error {
	out := c.app.out
	if c.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	who := "all merchants"
	if rep.MerchantID != "" {
		who = "merchant " + rep.MerchantID
	}
	fmt.Fprintf(out, "audit: window %s to %s (listed %s past each end), %s\n",
		rep.Since.UTC().Format(time.RFC3339), rep.Until.UTC().Format(time.RFC3339), time.Duration(rep.MarginSeconds*float64(time.Second)), who)
	fmt.Fprintf(out, "audit: %d intents of ours, %d of other systems, %d ledger rows, %d keys, %d intents retrieved by id\n",
		rep.Intents, rep.Foreign, rep.LedgerRows, rep.Keys, rep.Retrieved)
	if rep.Drift() {
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "KIND\tSEVERITY\tMERCHANT\tKEY\tINTENTS\tDETAIL")
		for _, f := range rep.Findings {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", f.Kind, f.Severity, f.MerchantID, f.IdempotencyKey, strings.Join(f.IntentIDs, ","), f.Detail)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "audit: %s\n", rep.Summary())
	return nil
}
