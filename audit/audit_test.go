package audit_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/paydedup/paydedup/audit"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
)

const (
	merchant = "m_audit"
	apiKey   = "sk_test_audit"
)

var t0 = time.Date(2031, 5, 6, 7, 0, 0, 0, time.UTC)

type bundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	clk    *clock.Fake
	store  *dedup.Store
	sim    *stripesim.Simulator
	stripe *stripe.Client
}

// setup gives a test a migrated schema, a store on a fake clock and the
// simulator on the same clock behind the real Stripe adapter.
func setup(t *testing.T) *bundle {
	t.Helper()
	pool := testenv.Pool(t)
	clk := clock.NewFake(t0)
	store, err := dedup.New(pool, dedup.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	sim := stripesim.New(stripesim.Config{Seed: 7, Now: clk.Now})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	st, err := stripe.New(stripe.Config{SecretKey: apiKey, APIBase: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.CloseIdleConnections)
	return &bundle{ctx: t.Context(), pool: pool, clk: clk, store: store, sim: sim, stripe: st}
}

func command(merchantID, key string, amount int64, pm string) *payment.Command {
	return &payment.Command{MerchantID: merchantID, IdempotencyKey: key, Amount: amount, Currency: "usd", PaymentMethod: pm}
}

// claim takes the key as a worker does and returns its lease.
func (b *bundle) claim(t *testing.T, cmd *payment.Command) *ledger.Lease {
	t.Helper()
	res, err := b.store.Claim(b.ctx, "w1", time.Minute, ledger.NewClaimRequest(cmd))
	if err != nil || res.Lease == nil {
		t.Fatalf("claim %s: %+v %v", cmd.IdempotencyKey, res, err)
	}
	return res.Lease
}

func chargeRequest(cmd *payment.Command, providerKey string) provider.ChargeRequest {
	return provider.ChargeRequest{ProviderKey: providerKey, MerchantID: cmd.MerchantID, IdempotencyKey: cmd.IdempotencyKey,
		Amount: cmd.Amount, Currency: cmd.Currency, PaymentMethod: cmd.PaymentMethod}
}

// pay runs a payment as the worker does: claim, charge under the row's
// provider key, complete with the ledger row. It returns the intent id.
func (b *bundle) pay(t *testing.T, cmd *payment.Command) string {
	t.Helper()
	l := b.claim(t, cmd)
	out, err := b.stripe.Charge(b.ctx, chargeRequest(cmd, l.ProviderKey))
	if err != nil {
		t.Fatalf("charge %s: %v", cmd.IdempotencyKey, err)
	}
	if err := b.store.Complete(b.ctx, *l, ledger.Completion{ChargeID: out.ChargeID, Declined: out.Declined,
		ResponseStatus: out.HTTPStatus, Response: out.Response}); err != nil {
		t.Fatalf("complete %s: %v", cmd.IdempotencyKey, err)
	}
	return out.ChargeID
}

// straight charges at the simulator, bypassing paydedup, under providerKey,
// with cmd's metadata.
func (b *bundle) straight(t *testing.T, cmd *payment.Command, providerKey string) string {
	t.Helper()
	out, err := b.sim.Client(apiKey).Charge(b.ctx, chargeRequest(cmd, providerKey))
	if err != nil {
		t.Fatal(err)
	}
	return out.ChargeID
}

func (b *bundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// tamper plants drift in the ledger, which refuses every update but
// processing → settled (migration 00009's trigger): the statement runs with
// triggers off for its transaction (session_replication_role, superuser).
func (b *bundle) tamper(t *testing.T, sql string, args ...any) {
	t.Helper()
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx) //nolint:errcheck // after Commit, a no-op
	if _, err := tx.Exec(b.ctx, `SET LOCAL session_replication_role = replica`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(b.ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) run(t *testing.T, cfg audit.Config) *audit.Report {
	t.Helper()
	if cfg.Since.IsZero() {
		cfg.Since, cfg.Until = t0.Add(-time.Minute), t0.Add(time.Hour)
	}
	rep, err := audit.Run(b.ctx, b.stripe, b.store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// payMany runs n payments a second apart, every fourth declined.
func (b *bundle) payMany(t *testing.T, prefix string, n int) {
	t.Helper()
	for i := range n {
		pm := "pm_card_visa"
		if i%4 == 3 {
			pm = "pm_card_chargeDeclined"
		}
		b.pay(t, command(merchant, fmt.Sprintf("%s-%02d", prefix, i), int64(1000+i), pm))
		b.clk.Advance(time.Second)
	}
}

func kinds(rep *audit.Report) []string {
	var out []string
	for _, f := range rep.Findings {
		out = append(out, string(f.Kind)+" "+f.MerchantID+":"+f.IdempotencyKey)
	}
	slices.Sort(out)
	return out
}

// TestAuditCleanRun: payments run as the worker runs them, and an intent of
// another system on the same account, audit clean.
func TestAuditCleanRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.payMany(t, "clean", 20)
	// Another system's charge: no metadata of ours.
	if _, err := b.sim.Client(apiKey).Charge(b.ctx, provider.ChargeRequest{ProviderKey: "theirs-1", Amount: 5, Currency: "usd", PaymentMethod: "pm_card_visa"}); err != nil {
		t.Fatal(err)
	}
	rep := b.run(t, audit.Config{})
	if rep.Drift() || rep.DriftError() != nil {
		t.Fatalf("clean run found drift: %v", kinds(rep))
	}
	if rep.Intents != 20 || rep.LedgerRows != 20 || rep.Keys != 20 || rep.Foreign != 1 {
		t.Errorf("report = %+v, want 20 intents, 20 ledger rows, 20 keys, 1 foreign", rep)
	}
	if rep.Summary() != "no drift" {
		t.Errorf("summary %q", rep.Summary())
	}
}

// TestAuditFindsPlantedDrift plants each kind of drift the audit exists to
// find, beside clean payments, and wants exactly those findings.
func TestAuditFindsPlantedDrift(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.payMany(t, "ok", 8)

	// A double charge: a second intent made straight at the simulator,
	// under another provider key, with our metadata.
	double := command(merchant, "double", 1500, "pm_card_visa")
	first := b.pay(t, double)
	second := b.straight(t, double, "another-provider-key")
	// A ledger row whose intent the provider does not have.
	b.exec(t, `INSERT INTO payments (merchant_id, idempotency_key, provider_key, charge_id, status, amount, currency, created_at)
		VALUES ($1, 'ghost', 'pk_ghost', 'pi_notattheprovider', 'succeeded', 700, 'usd', $2)`, merchant, t0.Add(30*time.Second))
	// An intent with our metadata and no ledger row, nor any record of its
	// key.
	orphan := b.straight(t, command(merchant, "orphan", 900, "pm_card_visa"), "pdk-orphan")
	// An intent whose key is claimed and never completed.
	stuck := command(merchant, "stuck", 800, "pm_card_visa")
	l := b.claim(t, stuck)
	if _, err := b.stripe.Charge(b.ctx, chargeRequest(stuck, l.ProviderKey)); err != nil {
		t.Fatal(err)
	}
	// The ledger and the intent disagree on the amount.
	b.pay(t, command(merchant, "amount", 1200, "pm_card_visa"))
	b.tamper(t, `UPDATE payments SET amount = 1201 WHERE idempotency_key = 'amount'`)
	// A decline in the ledger whose intent charged.
	b.pay(t, command(merchant, "status", 1300, "pm_card_chargeDeclined"))
	b.straight(t, command(merchant, "status", 1300, "pm_card_visa"), "pdk-status-2")

	rep := b.run(t, audit.Config{})
	want := []string{
		"amount_mismatch m_audit:amount",
		"double_charge m_audit:double",
		"missing_intent m_audit:ghost",
		"missing_ledger m_audit:orphan",
		"missing_ledger m_audit:stuck",
		"unrecorded_charge m_audit:status",
	}
	if got := kinds(rep); !slices.Equal(got, want) {
		t.Fatalf("findings:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	for _, f := range rep.Findings {
		switch f.IdempotencyKey {
		case "double":
			if !slices.Equal(f.IntentIDs, []string{first, second}) && !slices.Equal(f.IntentIDs, []string{second, first}) {
				t.Errorf("double charge names %v, want %s and %s", f.IntentIDs, first, second)
			}
		case "orphan":
			if !slices.Equal(f.IntentIDs, []string{orphan}) || !strings.Contains(f.Detail, "no idempotency row") {
				t.Errorf("orphan finding %+v", f)
			}
		case "stuck":
			if !strings.Contains(f.Detail, "pending") {
				t.Errorf("stuck finding %+v does not say the row is pending", f)
			}
		case "amount":
			if !strings.Contains(f.Detail, "1201") || !strings.Contains(f.Detail, "1200") {
				t.Errorf("amount finding %+v", f)
			}
		}
	}
	err := rep.DriftError()
	if !errors.Is(err, audit.ErrDrift) || !strings.Contains(err.Error(), "1 double_charge") {
		t.Errorf("DriftError = %v", err)
	}

	// Only one merchant's drift when asked for one merchant.
	if rep := b.run(t, audit.Config{Since: t0.Add(-time.Minute), Until: t0.Add(time.Hour), MerchantID: "m_other"}); rep.Drift() || rep.Intents != 0 {
		t.Errorf("m_other: %v, %d intents", kinds(rep), rep.Intents)
	}

	// The gauges say what the last audit found.
	reg := prometheus.NewRegistry()
	m := audit.NewMetrics(reg)
	m.Observe(rep, nil, t0)
	if got := findingsGauge(t, reg, audit.DoubleCharge); got != 1 {
		t.Errorf("paydedup_audit_findings{kind=double_charge} = %v, want 1", got)
	}
	if got := findingsGauge(t, reg, audit.ExtraIntent); got != 0 {
		t.Errorf("paydedup_audit_findings{kind=extra_intent} = %v, want 0", got)
	}
}

// TestAuditWindowEdges: a ledger row in the window whose intent was created
// long before it (the reconciler resolved a crash late) is matched by a
// retrieve, not reported; an intent in the window whose row was written
// after the window ended is matched by key; and the window's edges decide
// which keys are audited.
func TestAuditWindowEdges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Intent at t0; its row completed three hours later.
	late := command(merchant, "late-row", 1000, "pm_card_visa")
	l := b.claim(t, late)
	out, err := b.stripe.Charge(b.ctx, chargeRequest(late, l.ProviderKey))
	if err != nil {
		t.Fatal(err)
	}
	b.clk.Advance(3 * time.Hour)
	if err := b.store.Complete(b.ctx, *l, ledger.Completion{ChargeID: out.ChargeID, ResponseStatus: 200, Response: out.Response}); err != nil {
		t.Fatal(err)
	}
	margin := 10 * time.Minute
	// The window of the intent: the row lies past it and its margin.
	rep := b.run(t, audit.Config{Since: t0.Add(-time.Minute), Until: t0.Add(time.Hour), Margin: margin})
	if rep.Drift() || rep.Intents != 1 || rep.LedgerRows != 0 {
		t.Fatalf("intent's window: %v, %+v", kinds(rep), rep)
	}
	// The window of the row: the intent lies before it and its margin.
	rep = b.run(t, audit.Config{Since: t0.Add(2 * time.Hour), Until: t0.Add(4 * time.Hour), Margin: margin})
	if rep.Drift() || rep.LedgerRows != 1 || rep.Intents != 0 || rep.Retrieved != 1 {
		t.Fatalf("row's window: %v, %+v", kinds(rep), rep)
	}
	// A window that holds neither audits nothing.
	rep = b.run(t, audit.Config{Since: t0.Add(time.Hour), Until: t0.Add(2 * time.Hour), Margin: margin})
	if rep.Keys != 0 {
		t.Fatalf("empty window audited %d keys", rep.Keys)
	}
	// A second charge just before the window, for a key whose first is
	// inside it, is a double charge rather than two separate stories.
	edge := command(merchant, "edge", 1000, "pm_card_visa")
	b.clk.Set(t0.Add(5*time.Hour - 30*time.Second))
	b.straight(t, edge, "pdk-edge-early")
	b.clk.Set(t0.Add(5*time.Hour + 30*time.Second))
	b.pay(t, edge)
	rep = b.run(t, audit.Config{Since: t0.Add(5 * time.Hour), Until: t0.Add(6 * time.Hour), Margin: margin})
	if got := kinds(rep); !slices.Equal(got, []string{"double_charge m_audit:edge"}) {
		t.Fatalf("edge: %v", got)
	}
	if err := (audit.Config{Since: t0, Until: t0}).Validate(); err == nil {
		t.Error("an empty window validated")
	}
}

// TestAuditWithholdsPartialReports: when a page of the list fails, the
// audit returns an error, never a report built on part of the list.
func TestAuditWithholdsPartialReports(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.payMany(t, "p", 3)
	if err := b.sim.SetFaults(stripesim.Faults{Rate5xx: 1}); err != nil {
		t.Fatal(err)
	}
	rep, err := audit.Run(b.ctx, b.stripe, b.store, audit.Config{Since: t0.Add(-time.Minute), Until: t0.Add(time.Hour), RetryWait: time.Millisecond})
	if err == nil || rep != nil {
		t.Fatalf("Run through a failing provider = %+v, %v; want an error and no report", rep, err)
	}
	reg := prometheus.NewRegistry()
	m := audit.NewMetrics(reg)
	m.Observe(nil, err, t0)
}

// findingsGauge reads paydedup_audit_findings{kind} from reg.
func findingsGauge(t *testing.T, reg *prometheus.Registry, kind audit.Kind) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "paydedup_audit_findings" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == string(kind) {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no paydedup_audit_findings{kind=%q}", kind)
	return 0
}

// TestAuditRidesOutProviderFaults: pages answered 500 or 429 are asked
// again, the list resuming after the last intent received, so a flaky
// provider still gets a whole, clean audit (and no intent twice).
func TestAuditRidesOutProviderFaults(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.payMany(t, "flaky", 230)
	// A ledger row beyond the list's reach, to be retrieved through faults.
	b.clk.Advance(3 * time.Hour)
	b.tamper(t, `UPDATE payments SET created_at = $1 WHERE idempotency_key = 'flaky-00'`, b.clk.Now())
	if err := b.sim.SetFaults(stripesim.Faults{Rate5xx: 0.3, Rate429: 0.2}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct{ since, until time.Time }{
		{t0.Add(-time.Minute), t0.Add(time.Hour)},
		{t0.Add(2 * time.Hour), t0.Add(4 * time.Hour)},
	} {
		rep, err := audit.Run(b.ctx, b.stripe, b.store, audit.Config{Since: w.since, Until: w.until, Margin: time.Minute, Tries: 20, RetryWait: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Drift() {
			t.Fatalf("faults made drift: %v", kinds(rep))
		}
		if w.since == t0.Add(-time.Minute) && (rep.Intents != 230 || rep.LedgerRows != 229) {
			t.Errorf("report %+v, want 230 intents and 229 ledger rows", rep)
		}
	}
}

// TestAuditWindowStartingMidSecond: Stripe's created is in whole seconds,
// so an intent made in the window's first second, after it started, reads
// as created before the window. It is still the window's: an orphan there
// is reported, and the window's intents are counted. (The demo's window
// starts when it does, and most of its payments run in that first second.)
func TestAuditWindowStartingMidSecond(t *testing.T) {
	t.Parallel()
	b := setup(t)
	since := t0.Add(100 * time.Millisecond)
	// In the second before the window's: outside it.
	b.clk.Set(t0.Add(-500 * time.Millisecond))
	b.straight(t, command(merchant, "before", 900, "pm_card_visa"), "pdk-before")
	b.clk.Set(t0.Add(300 * time.Millisecond))
	b.pay(t, command(merchant, "first-second", 1000, "pm_card_visa"))
	orphan := b.straight(t, command(merchant, "first-second-orphan", 900, "pm_card_visa"), "pdk-first-second-orphan")
	rep := b.run(t, audit.Config{Since: since, Until: t0.Add(time.Hour), Margin: time.Minute})
	if got, want := kinds(rep), []string{"missing_ledger m_audit:first-second-orphan"}; !slices.Equal(got, want) {
		t.Fatalf("findings %v, want %v (orphan %s)", got, want, orphan)
	}
	if rep.Intents != 2 || rep.LedgerRows != 1 || rep.Keys != 2 {
		t.Errorf("report %+v, want 2 intents, 1 ledger row, 2 keys", rep)
	}
}

// intentWith creates, straight at the simulator, an intent with our
// metadata for key under providerKey, paid with pm (on-session when asked),
// checks that the provider holds it with status want, and returns its id.
func (b *bundle) intentWith(t *testing.T, key, pm, providerKey string, onSession bool, want string) string {
	t.Helper()
	req := chargeRequest(command(merchant, key, 1000, pm), providerKey)
	req.OnSession = onSession
	out, err := b.sim.Client(apiKey).Charge(b.ctx, req)
	if err != nil {
		t.Fatalf("charge %s with %s: %v", key, pm, err)
	}
	in, err := b.stripe.GetIntent(b.ctx, out.ChargeID)
	if err != nil || in.Status != want {
		t.Fatalf("intent %s of %s with %s is %q (%v), want %q", out.ChargeID, key, pm, in.Status, err, want)
	}
	return out.ChargeID
}

// ledgerRow writes key's ledger row with status, naming chargeID, as the
// worker (or a settle) would have written it.
func (b *bundle) ledgerRow(t *testing.T, key, status, chargeID string) {
	t.Helper()
	var settled *time.Time
	if status == ledger.PaymentFailed {
		at := b.clk.Now()
		settled = &at
	}
	b.exec(t, `INSERT INTO payments (merchant_id, idempotency_key, provider_key, charge_id, status, amount, currency, created_at, settled_at)
		VALUES ($1, $2, $3, NULLIF($4, ''), $5, 1000, 'usd', $6, $7)`, merchant, key, "pk_"+key, chargeID, status, b.clk.Now(), settled)
}

// intentSpec is an intent status and how the simulator produces it.
type intentSpec struct {
	status, pm string
	onSession  bool
}

// The intent statuses the simulator produces, and how.
var matrixIntents = []intentSpec{
	{"succeeded", "pm_card_visa", false},
	{"processing", "pm_usBankAccount_success", false},
	{"requires_payment_method", "pm_card_chargeDeclined", false},
	{"canceled", "pm_card_authenticationRequired", true}, // requires_action, canceled by the adapter
}

// TestAuditStatusMatrix: for every ledger status and every intent status
// the simulator produces, a ledger row naming its intent finds the
// matrix's finding, and nothing where the two agree. A row that says
// failed or processing beside an intent that succeeded is found, and so is
// money that may still move (processing) beside a row that says it did not.
func TestAuditStatusMatrix(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// ledger status → intent status → the finding ("" where they agree).
	want := map[string]map[string]string{
		ledger.PaymentSucceeded:  {"succeeded": "", "processing": "success_unsettled", "requires_payment_method": "success_not_charged", "canceled": "success_not_charged"},
		ledger.PaymentDeclined:   {"succeeded": "lost_charge", "processing": "possible_lost_charge", "requires_payment_method": "", "canceled": ""},
		ledger.PaymentFailed:     {"succeeded": "lost_charge", "processing": "possible_lost_charge", "requires_payment_method": "", "canceled": ""},
		ledger.PaymentProcessing: {"succeeded": "unsettled_charge", "processing": "", "requires_payment_method": "unsettled_failure", "canceled": "unsettled_failure"},
	}
	var wantKinds []string
	for ledger, cells := range want {
		for _, in := range matrixIntents {
			key := ledger + "-" + in.status
			id := b.intentWith(t, key, in.pm, "pdk-"+key, in.onSession, in.status)
			b.ledgerRow(t, key, ledger, id)
			if k, ok := cells[in.status]; !ok {
				t.Fatalf("no expectation for ledger %s, intent %s", ledger, in.status)
			} else if k != "" {
				wantKinds = append(wantKinds, k+" "+merchant+":"+key)
			}
		}
	}
	slices.Sort(wantKinds)
	rep := b.run(t, audit.Config{})
	if got := kinds(rep); !slices.Equal(got, wantKinds) {
		t.Fatalf("findings:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(wantKinds, "\n  "))
	}
	if rep.Keys != 16 || rep.Intents != 16 || rep.LedgerRows != 16 {
		t.Errorf("report %+v, want 16 keys, intents and ledger rows", rep)
	}
	for _, f := range rep.Findings {
		want := audit.Critical
		if f.Kind == audit.UnsettledCharge || f.Kind == audit.UnsettledFailure {
			want = audit.Warning
		}
		if f.Severity != want {
			t.Errorf("%s %s: severity %q, want %q", f.Kind, f.IdempotencyKey, f.Severity, want)
		}
	}
}

// TestStatusFindingMatrix: the whole matrix, every ledger status the
// schema allows against every status of a Stripe PaymentIntent (and one
// Stripe may add), including those the simulator does not produce.
func TestStatusFindingMatrix(t *testing.T) {
	t.Parallel()
	statuses := []string{"succeeded", "requires_capture", "processing", "requires_payment_method",
		"requires_confirmation", "requires_action", "canceled", "some_future_status"}
	// One row per ledger status, one column per intent status above.
	want := map[string][]audit.Kind{
		ledger.PaymentSucceeded: {"", "", audit.SuccessUnsettled, audit.SuccessNotCharged,
			audit.SuccessNotCharged, audit.SuccessNotCharged, audit.SuccessNotCharged, audit.SuccessUnsettled},
		ledger.PaymentDeclined: {audit.LostCharge, audit.LostCharge, audit.PossibleLostCharge, "",
			"", "", "", audit.PossibleLostCharge},
		ledger.PaymentFailed: {audit.LostCharge, audit.LostCharge, audit.PossibleLostCharge, "",
			"", "", "", audit.PossibleLostCharge},
		ledger.PaymentProcessing: {audit.UnsettledCharge, audit.UnsettledCharge, "", audit.UnsettledFailure,
			audit.UnsettledFailure, audit.UnsettledFailure, audit.UnsettledFailure, ""},
		ledger.PaymentAuthorized: {audit.UnrecordedCapture, "", audit.UnrecordedCapture, audit.UnsettledCancel,
			audit.UnsettledCancel, audit.UnsettledCancel, audit.UnsettledCancel, audit.UnrecordedCapture},
		ledger.PaymentCanceled: {audit.CanceledButCharged, audit.CanceledButCharged, audit.CanceledButCharged, "",
			"", "", "", audit.CanceledButCharged},
	}
	for ledger, row := range want {
		for i, st := range statuses {
			if got := audit.StatusFinding(ledger, st); got != row[i] {
				t.Errorf("ledger %s, intent %s: %q, want %q", ledger, st, got, row[i])
			}
		}
	}
	for _, k := range audit.Kinds {
		if s := k.Severity(); s != audit.Critical && s != audit.Warning {
			t.Errorf("%s: severity %q", k, s)
		}
	}
}

// TestAuditPossibleCharges: two intents under one key of which one
// succeeded and another is still processing (or both processing) are a
// possible double charge, with a ledger row or without; a processing
// intent the ledger row does not name is a possible unrecorded charge; an
// intent that moved no money beside the row's is only an extra intent.
func TestAuditPossibleCharges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	visa, bank, declined := matrixIntents[0], matrixIntents[1], matrixIntents[2]
	for _, c := range []struct {
		key string
		// row is the ledger status naming the first intent; "" for no row.
		row     string
		intents []intentSpec
		want    []string
	}{
		{"succeeded-and-processing", ledger.PaymentSucceeded, []intentSpec{visa, bank}, []string{"possible_double_charge"}},
		{"processing-and-succeeded", ledger.PaymentProcessing, []intentSpec{bank, visa}, []string{"possible_double_charge"}},
		{"processing-twice-no-row", "", []intentSpec{bank, bank}, []string{"missing_ledger", "possible_double_charge"}},
		{"succeeded-twice", ledger.PaymentSucceeded, []intentSpec{visa, visa}, []string{"double_charge"}},
		{"declined-and-processing", ledger.PaymentDeclined, []intentSpec{declined, bank}, []string{"possible_unrecorded_charge"}},
		{"succeeded-and-declined", ledger.PaymentSucceeded, []intentSpec{visa, declined}, []string{"extra_intent"}},
	} {
		var first string
		for i, in := range c.intents {
			id := b.intentWith(t, c.key, in.pm, fmt.Sprintf("pdk-%s-%d", c.key, i), in.onSession, in.status)
			if i == 0 {
				first = id
			}
		}
		if c.row != "" {
			b.ledgerRow(t, c.key, c.row, first)
		}
		rep := b.run(t, audit.Config{MerchantID: merchant, Since: t0.Add(-time.Minute), Until: t0.Add(time.Hour)})
		var got []string
		for _, f := range rep.Findings {
			if f.IdempotencyKey == c.key {
				got = append(got, string(f.Kind))
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: findings %v, want %v", c.key, got, c.want)
		}
	}
}

// TestAuditAuthorizations: the ledger's authorized and canceled payments
// (manual capture) are checked against their intents, planted at the
// simulator: an authorization the provider still holds, and one voided
// there and in the ledger, agree; a capture the ledger lacks (its row
// still authorized) and money charged or held for a payment the ledger
// says was canceled are critical; an authorization voided at the provider
// (its capture window ran out) while the ledger still says authorized is
// the ledger lagging, a warning.
func TestAuditAuthorizations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	authorize := func(key string) string {
		t.Helper()
		req := chargeRequest(command(merchant, key, 1000, "pm_card_visa"), "pdk-"+key)
		req.ManualCapture = true
		out, err := b.stripe.Charge(b.ctx, req)
		if err != nil || !out.Authorized {
			t.Fatalf("authorize %s: %+v %v", key, out, err)
		}
		return out.ChargeID
	}
	capture := func(key, id string) {
		t.Helper()
		out, err := b.stripe.Capture(b.ctx, provider.CaptureRequest{ProviderKey: "pdc-" + key, ChargeID: id})
		if err != nil || out.Refused || out.Status != "succeeded" {
			t.Fatalf("capture %s: %+v %v", key, out, err)
		}
	}
	void := func(key, id string) {
		t.Helper()
		out, err := b.stripe.Cancel(b.ctx, provider.CancelRequest{ProviderKey: "pdv-" + key, ChargeID: id})
		if err != nil || out.Refused || out.Status != "canceled" {
			t.Fatalf("cancel %s: %+v %v", key, out, err)
		}
	}
	for _, c := range []struct {
		key, ledger string
		// act is what happened at the provider after the authorization.
		act  func(key, id string)
		want string // the finding; "" where they agree
	}{
		{"auth-held", ledger.PaymentAuthorized, nil, ""},
		{"auth-captured", ledger.PaymentAuthorized, capture, "unrecorded_capture"},
		{"auth-voided", ledger.PaymentAuthorized, void, "unsettled_cancel"},
		{"cancel-voided", ledger.PaymentCanceled, void, ""},
		{"cancel-captured", ledger.PaymentCanceled, capture, "canceled_but_charged"},
		{"cancel-held", ledger.PaymentCanceled, nil, "canceled_but_charged"},
	} {
		id := authorize(c.key)
		if c.act != nil {
			c.act(c.key, id)
		}
		b.ledgerRow(t, c.key, c.ledger, id)
	}
	// A payment charged at once (automatic capture) whose row says
	// authorized: a capture the ledger lacks too.
	b.ledgerRow(t, "auth-charged", ledger.PaymentAuthorized, b.intentWith(t, "auth-charged", "pm_card_visa", "pdk-auth-charged", false, "succeeded"))

	rep := b.run(t, audit.Config{})
	want := []string{
		"canceled_but_charged m_audit:cancel-captured",
		"canceled_but_charged m_audit:cancel-held",
		"unrecorded_capture m_audit:auth-captured",
		"unrecorded_capture m_audit:auth-charged",
		"unsettled_cancel m_audit:auth-voided",
	}
	if got := kinds(rep); !slices.Equal(got, want) {
		t.Fatalf("findings:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if rep.Keys != 7 || rep.LedgerRows != 7 {
		t.Errorf("report %+v, want 7 keys and ledger rows", rep)
	}
	for _, f := range rep.Findings {
		want := audit.Critical
		if f.Kind == "unsettled_cancel" {
			want = audit.Warning
		}
		if f.Severity != want || len(f.IntentIDs) != 1 || !strings.Contains(f.Detail, f.IntentIDs[0]) {
			t.Errorf("%s %s: severity %q, intents %v, detail %q; want %q, naming its intent", f.Kind, f.IdempotencyKey, f.Severity, f.IntentIDs, f.Detail, want)
		}
	}
}
