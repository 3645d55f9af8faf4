package reconciler_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/reconciler"
)

// processingDelay is how long the simulator's bank debits stay processing.
const processingDelay = time.Hour

// completeProcessing records, as the worker does, a charge the provider
// left processing.
func (b *bundle) completeProcessing(t *testing.T, key, pm string) *provider.Outcome {
	t.Helper()
	l := b.claim(t, key)
	out := b.charge(t, l, pm)
	if !out.Processing {
		t.Fatalf("%s: charge %+v, want processing", key, out)
	}
	if err := b.store.Complete(b.ctx, l, ledger.Completion{ChargeID: out.ChargeID, Processing: true,
		ResponseStatus: out.HTTPStatus, Response: out.Response}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReconcilerSettlesProcessingPayments: a processing payment stays so in
// the ledger while the provider says so, then settles to succeeded or
// failed, retrieved by its intent id, and the key replays the final answer.
func TestReconcilerSettlesProcessingPayments(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{ProcessingDelay: processingDelay})
	ok := b.completeProcessing(t, "ach-ok", "pm_usBankAccount_success")
	closed := b.completeProcessing(t, "ach-closed", "pm_usBankAccount_accountClosed")
	r := b.reconciler(t, b.stripe, reconciler.Config{})

	res := runOnce(t, r)
	if res.StillProcessing != 2 || res.SettledSucceeded+res.SettledFailed != 0 || res.Errors != 0 {
		t.Fatalf("pass while processing: %+v", res)
	}
	b.clk.Advance(processingDelay)
	res = runOnce(t, r)
	if res.SettledSucceeded != 1 || res.SettledFailed != 1 || res.Errors != 0 {
		t.Fatalf("pass after the delay: %+v", res)
	}
	for key, want := range map[string]struct {
		charge, status string
		code           int
	}{
		"ach-ok":     {ok.ChargeID, ledger.PaymentSucceeded, http.StatusOK},
		"ach-closed": {closed.ChargeID, ledger.PaymentFailed, http.StatusPaymentRequired},
	} {
		p, err := b.store.GetPayment(b.ctx, merchant, key)
		if err != nil || p.Status != want.status || p.ChargeID != want.charge || p.SettledAt.IsZero() {
			t.Fatalf("%s: ledger %+v %v, want %s", key, p, err, want.status)
		}
		if rec := b.get(t, key); rec.ResponseStatus != want.code || responseID(t, rec.Response) != want.charge {
			t.Fatalf("%s: record answers %d %s, want %d", key, rec.ResponseStatus, rec.Response, want.code)
		}
	}
	if n := len(b.sim.Charges()); n != 1 {
		t.Fatalf("%d charges at the provider, want 1", n)
	}
	// Settled rows are never settled again, and nothing else changes them.
	if err := b.store.SettlePayment(b.ctx, ledger.Payment{MerchantID: merchant, IdempotencyKey: "ach-ok", ChargeID: ok.ChargeID},
		ledger.PaymentFailed, 402, []byte(`{}`)); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("settling a settled payment: %v, want ErrNotFound", err)
	}
	if res := runOnce(t, r); res.StillProcessing+res.SettledSucceeded+res.SettledFailed != 0 {
		t.Fatalf("pass after settling: %+v", res)
	}
}

// TestReconcilerResolvesStuckRowAsProcessing: a worker crashed after the
// provider accepted a bank debit; the reconciler finds it processing and
// completes the key as processing, never `failed`.
func TestReconcilerResolvesStuckRowAsProcessing(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{ProcessingDelay: 24 * time.Hour})
	l := b.claim(t, "ach-crash")
	out := b.charge(t, l, "pm_usBankAccount_success")
	b.clk.Advance(stuckFor)
	res := runOnce(t, b.reconciler(t, b.stripe, reconciler.Config{}))
	if res.Processing != 1 || res.Completed != 1 || res.Failed != 0 {
		t.Fatalf("pass: %+v", res)
	}
	rec := b.get(t, "ach-crash")
	p, err := b.store.GetPayment(b.ctx, merchant, "ach-crash")
	if rec.Status != ledger.StatusCompleted || rec.ResponseStatus != http.StatusAccepted || err != nil ||
		p.Status != ledger.PaymentProcessing || p.ChargeID != out.ChargeID {
		t.Fatalf("record %+v, ledger %+v %v", rec, p, err)
	}
}

// TestReconcilerNeverCompletesFromForeignIntent: an intent at the provider
// carries this key's metadata but another amount (someone else made it).
// The row is left pending for a person and counted, never completed from
// it and never marked not charged.
func TestReconcilerNeverCompletesFromForeignIntent(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{})
	b.claim(t, "foreign")
	if _, err := b.stripe.Charge(b.ctx, provider.ChargeRequest{ProviderKey: "someone-elses-key", MerchantID: merchant,
		IdempotencyKey: "foreign", Amount: 500, Currency: "usd", PaymentMethod: "pm_card_visa"}); err != nil {
		t.Fatal(err)
	}
	b.clk.Advance(stuckFor)
	res := runOnce(t, b.reconciler(t, b.stripe, reconciler.Config{}))
	if res.ForeignIntents != 1 || res.Left != 1 || res.Completed+res.Failed+res.Declined != 0 {
		t.Fatalf("pass: %+v", res)
	}
	if rec := b.get(t, "foreign"); rec.Status != ledger.StatusPending {
		t.Fatalf("record %+v, want pending", rec)
	}
	if n := b.count(t, `SELECT count(*) FROM payments`); n != 0 {
		t.Fatalf("%d ledger rows from someone else's intent", n)
	}
}
