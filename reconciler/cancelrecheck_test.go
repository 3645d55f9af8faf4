package reconciler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
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

// failingRetrieve is the Stripe adapter whose retrieve of one intent
// always fails.
type failingRetrieve struct {
	*stripe.Client
	fail string
}

func (f failingRetrieve) RetrieveIntent(ctx context.Context, req provider.RetrieveIntentRequest) (*provider.IntentOutcome, error) {
	if req.ChargeID == f.fail {
		return nil, errors.New("retrieve failed")
	}
	return f.Client.RetrieveIntent(ctx, req)
}

// TestFailingCancelRecheckLetsNewerThrough: a stamp whose retrieve keeps
// failing is pushed back after each pass, so a newer stamp (one per pass
// here) gets its turn instead of waiting behind it for good; the failing
// one is listed again once its backoff has passed.
func TestFailingCancelRecheckLetsNewerThrough(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{})
	stuck := b.authorizedPayment(t, "stuck")
	voided := b.authorizedPayment(t, "voided")
	if _, err := b.stripe.Cancel(b.ctx, provider.CancelRequest{ProviderKey: "void-1", ChargeID: voided.ChargeID, MerchantID: merchant}); err != nil {
		t.Fatal(err)
	}
	for key, id := range map[string]string{"stuck": stuck.ChargeID, "voided": voided.ChargeID} {
		if key == "voided" {
			b.clk.Advance(time.Second)
		}
		if ok, _, err := b.store.RequestCancelRecheck(b.ctx, merchant, key, id); !ok || err != nil {
			t.Fatalf("request cancel recheck of %s: %v %v", key, ok, err)
		}
	}
	r := b.reconciler(t, failingRetrieve{Client: b.stripe, fail: stuck.ChargeID}, reconciler.Config{BatchSize: 1})
	if res := runOnce(t, r); res.CancelsConfirmed != 0 || res.LookupErrors != 1 {
		t.Fatalf("first pass: %+v, want the stuck retrieve failed", res)
	}
	if res := runOnce(t, r); res.CancelsConfirmed != 1 || res.LookupErrors != 0 {
		t.Fatalf("second pass: %+v, want the newer stamp confirmed", res)
	}
	if p, err := b.store.GetPayment(b.ctx, merchant, "voided"); err != nil || p.Status != ledger.PaymentCanceled {
		t.Fatalf("voided after the passes: %+v %v, want canceled", p, err)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_cancel_rechecks WHERE idempotency_key = 'stuck' AND attempts = 1`); n != 1 {
		t.Fatalf("%d stuck stamps with one attempt, want 1", n)
	}
	b.clk.Advance(time.Minute)
	if res := runOnce(t, r); res.LookupErrors != 1 {
		t.Fatalf("pass after the backoff: %+v, want the stuck stamp tried again", res)
	}
}

// TestCancelConfirmedDuringCaptureIsRecordedAfterIt: the provider voided
// an authorization while a capture of it was claimed (pending): the pass
// that retrieves the intent finds it canceled but moves nothing (the
// capture's outcome decides) and keeps the stamp. The capture, refused by
// the simulator payment_intent_unexpected_state (not intent_canceled),
// leaves the payment authorized; the next pass records it canceled, with
// one canceled event.
func TestCancelConfirmedDuringCaptureIsRecordedAfterIt(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{})
	auth := b.authorizedPayment(t, "auth")
	c, err := b.store.ClaimPaymentOp(b.ctx, "worker", workerLease, ledger.NewPaymentOpRequest(&payment.Command{MerchantID: merchant,
		IdempotencyKey: "cap-1", PaymentKey: "auth", Kind: payment.KindCapture}))
	if err != nil || c.Outcome != ledger.Claimed {
		t.Fatalf("claim capture: %+v %v", c, err)
	}
	if _, err := b.stripe.Cancel(b.ctx, provider.CancelRequest{ProviderKey: "void-1", ChargeID: auth.ChargeID, MerchantID: merchant}); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := b.store.RequestCancelRecheck(b.ctx, merchant, "auth", auth.ChargeID); !ok || err != nil {
		t.Fatalf("request cancel recheck: %v %v", ok, err)
	}
	r := b.reconciler(t, b.stripe, reconciler.Config{})
	if res := runOnce(t, r); res.CancelsConfirmed != 0 || res.Errors != 0 {
		t.Fatalf("pass with the capture pending: %+v, want nothing recorded", res)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_cancel_rechecks`); n != 1 {
		t.Fatalf("%d stamps after the pass, want 1 (kept)", n)
	}
	out, err := b.stripe.Capture(b.ctx, provider.CaptureRequest{ProviderKey: c.Lease.ProviderKey, ChargeID: auth.ChargeID, MerchantID: merchant})
	if err != nil || !out.Refused || out.RefusalCode != "payment_intent_unexpected_state" {
		t.Fatalf("capture of the voided intent: %+v %v, want refused payment_intent_unexpected_state", out, err)
	}
	done, ok := ledger.PaymentOpCompletionOf(payment.KindCapture, out)
	if !ok {
		t.Fatalf("no completion of %+v", out)
	}
	if err := b.store.CompletePaymentOp(b.ctx, *c.Lease, done); err != nil {
		t.Fatal(err)
	}
	b.clk.Advance(time.Minute)
	if res := runOnce(t, r); res.CancelsConfirmed != 1 {
		t.Fatalf("pass after the capture: %+v, want the cancel recorded", res)
	}
	if p, err := b.store.GetPayment(b.ctx, merchant, "auth"); err != nil || p.Status != ledger.PaymentCanceled {
		t.Fatalf("payment after the passes: %+v %v, want canceled", p, err)
	}
	if n := b.count(t, `SELECT count(*) FROM outcome_events WHERE kind = 'canceled'`); n != 1 {
		t.Fatalf("%d canceled events, want 1", n)
	}
}
