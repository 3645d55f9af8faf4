package reconciler_test

import (
	"testing"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/reconciler"
)

// authorizedPayment authorizes under key at the simulator (the intent
// left requires_capture) and records it, as the worker does.
func (b *bundle) authorizedPayment(t *testing.T, key string) *provider.Outcome {
	t.Helper()
	cmd := command(key)
	cmd.Kind = payment.KindAuthorize
	res, err := b.store.Claim(b.ctx, "worker", workerLease, ledger.NewClaimRequest(cmd))
	if err != nil || res.Outcome != ledger.Claimed {
		t.Fatalf("claim %s: %+v %v", key, res, err)
	}
	out, err := b.stripe.Charge(b.ctx, provider.ChargeRequest{ProviderKey: res.Lease.ProviderKey, MerchantID: merchant, IdempotencyKey: key,
		Amount: amount, Currency: "usd", PaymentMethod: "pm_card_visa", ManualCapture: true})
	if err != nil || !out.Authorized {
		t.Fatalf("authorize %s: %+v %v", key, out, err)
	}
	if err := b.store.Complete(b.ctx, *res.Lease, ledger.CompletionFor(payment.KindAuthorize, out, ledger.ProviderBodyOnly)); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReconcilerConfirmsReportedCancel: an authorization an event said
// the provider canceled (stamped by the webhook) is recorded canceled
// only when the retrieve of its intent finds it canceled: one the
// provider still holds requires_capture, or captured, stays authorized and
// its stamp is cleared; one canceled at the provider moves to canceled
// with one canceled event. A retrieve never acts: the intents are as
// they were.
func TestReconcilerConfirmsReportedCancel(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{})
	held := b.authorizedPayment(t, "held")
	voided := b.authorizedPayment(t, "voided")
	captured := b.authorizedPayment(t, "captured")
	if _, err := b.stripe.Cancel(b.ctx, provider.CancelRequest{ProviderKey: "void-1", ChargeID: voided.ChargeID, MerchantID: merchant}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.stripe.Capture(b.ctx, provider.CaptureRequest{ProviderKey: "cap-1", ChargeID: captured.ChargeID, MerchantID: merchant}); err != nil {
		t.Fatal(err)
	}
	for key, id := range map[string]string{"held": held.ChargeID, "voided": voided.ChargeID, "captured": captured.ChargeID} {
		if ok, status, err := b.store.RequestCancelRecheck(b.ctx, merchant, key, id); !ok || status != ledger.PaymentAuthorized || err != nil {
			t.Fatalf("request cancel recheck of %s: %v %q %v", key, ok, status, err)
		}
	}
	r := b.reconciler(t, b.stripe, reconciler.Config{})
	if res := runOnce(t, r); res.CancelsConfirmed != 1 || res.Errors != 0 {
		t.Fatalf("pass: %+v, want 1 cancel confirmed, no errors", res)
	}
	for key, want := range map[string]string{"held": ledger.PaymentAuthorized, "captured": ledger.PaymentAuthorized, "voided": ledger.PaymentCanceled} {
		if p, err := b.store.GetPayment(b.ctx, merchant, key); err != nil || p.Status != want {
			t.Fatalf("payment %s after the pass: %+v %v, want %s", key, p, err, want)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM payment_cancel_rechecks`); n != 0 {
		t.Fatalf("%d stamps left, want 0", n)
	}
	if n := b.count(t, `SELECT count(*) FROM outcome_events WHERE kind = 'canceled'`); n != 1 {
		t.Fatalf("%d canceled events, want 1 (voided)", n)
	}
	if got, err := b.stripe.RetrieveIntent(b.ctx, provider.RetrieveIntentRequest{ChargeID: held.ChargeID, MerchantID: merchant}); err != nil || got.Status != provider.StatusRequiresCapture {
		t.Fatalf("the held intent after the pass: %+v %v, want requires_capture", got, err)
	}
	if res := runOnce(t, r); res.CancelsConfirmed != 0 || res.Errors != 0 {
		t.Fatalf("second pass: %+v, want nothing", res)
	}
}
