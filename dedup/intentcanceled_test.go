package dedup_test

import (
	"encoding/json"
	"testing"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// TestCaptureOfCanceledIntentCancelsPayment: a capture recorded refused
// intent_canceled (its lookup found the intent canceled by the provider,
// the worker's or the reconciler's completion alike) moves the payment
// from authorized to canceled in the same transaction, with one canceled
// event under the payment's key; the provider's cancel told again
// (the webhook) changes nothing. A capture refused for another reason
// leaves the payment authorized.
func TestCaptureOfCanceledIntentCancelsPayment(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.authorizedPayment(t, "m_1", "auth", 100)
	c := b.claimOp(t, "w", opReq(payment.KindCapture, "m_1", "c-1", "auth", 0))
	if c.Outcome != ledger.Claimed {
		t.Fatalf("capture: %+v", c)
	}
	gone := ledger.PaymentOpCompletion{Status: ledger.OpRefused, Reason: ledger.OpIntentCanceled, ResponseStatus: 200,
		Response: json.RawMessage(`{"id":"pi_auth","status":"canceled"}`)}
	if err := b.store.CompletePaymentOp(b.ctx, *c.Lease, gone); err != nil {
		t.Fatal(err)
	}
	if pay, err := b.store.GetPayment(b.ctx, "m_1", "auth"); err != nil || pay.Status != ledger.PaymentCanceled || pay.SettledAt.IsZero() {
		t.Fatalf("payment after its intent was found canceled: %+v %v, want canceled", pay, err)
	}
	events := `SELECT count(*) FROM outcome_events WHERE event_id = 'm_1:auth:canceled' AND seq = 2 AND kind = 'canceled' AND status = 'canceled'`
	if n := b.count(t, events); n != 1 {
		t.Fatalf("%d canceled events of the payment, want 1", n)
	}
	if ok, status, err := b.store.CancelAuthorizedPayment(b.ctx, "m_1", "auth", "pi_auth", "canceled by the provider"); ok || err != nil || status != ledger.PaymentCanceled {
		t.Fatalf("cancel told again: %v %q %v, want nothing changed", ok, status, err)
	}
	if n := b.count(t, events); n != 1 {
		t.Fatalf("%d canceled events after the cancel told again, want 1", n)
	}

	b.authorizedPayment(t, "m_1", "auth2", 100)
	c = b.claimOp(t, "w", opReq(payment.KindCapture, "m_1", "c-2", "auth2", 0))
	no := ledger.PaymentOpCompletion{Status: ledger.OpRefused, Reason: "charge_expired_for_capture", ResponseStatus: 400,
		Response: json.RawMessage(`{"error":{"code":"charge_expired_for_capture"}}`)}
	if err := b.store.CompletePaymentOp(b.ctx, *c.Lease, no); err != nil {
		t.Fatal(err)
	}
	if pay, err := b.store.GetPayment(b.ctx, "m_1", "auth2"); err != nil || pay.Status != ledger.PaymentAuthorized {
		t.Fatalf("payment after a refused capture: %+v %v, want authorized", pay, err)
	}
}

// TestRolesRecheckAndCancel: the gateway's role stamps a refund, or an
// authorization an event said the provider canceled, for a recheck,
// through their functions only, and never cancels the authorization
// itself (00034); the worker's role (the reconciler, after its lookup)
// reverses a stamped refund, a stale succeeded answer never moving it
// back, and records the stamped authorization canceled.
func TestRolesRecheckAndCancel(t *testing.T) {
	t.Parallel()
	ownerURL := testenv.PostgresURL(t)
	worker, err := dedup.New(asWorker(t, ownerURL), dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	gwPool := testenv.AsRole(t, ownerURL, "paydedup_gateway")
	gateway, err := dedup.New(gwPool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{store: worker, ctx: t.Context()}
	b.chargedPayment(t, "m_1", "pay", 100)
	b.processingRefund(t, "r-1", "pay", 60, "re_1")
	if ok, _, err := worker.SettleRefund(b.ctx, "m_1", "r-1", refunded("re_1")); !ok || err != nil {
		t.Fatalf("settle: %v %v", ok, err)
	}
	if ok, status, err := gateway.RequestRefundRecheck(b.ctx, "m_1", "r-1", "re_1"); !ok || status != ledger.RefundSucceeded || err != nil {
		t.Fatalf("stamp as the gateway: %v %q %v", ok, status, err)
	}
	if _, _, err := gateway.RecheckRefund(b.ctx, "m_1", "r-1", refundFailed("re_1")); err == nil {
		t.Fatal("the gateway reversed a refund itself")
	}
	if rs, err := worker.RefundsToRecheck(b.ctx, 10); err != nil || len(rs) != 1 {
		t.Fatalf("refunds to recheck as the worker: %+v %v", rs, err)
	}
	if ok, status, err := worker.RecheckRefund(b.ctx, "m_1", "r-1", refundFailed("re_1")); !ok || status != ledger.RefundFailed || err != nil {
		t.Fatalf("reverse as the worker: %v %q %v", ok, status, err)
	}
	if ok, status, err := worker.RecheckRefund(b.ctx, "m_1", "r-1", refunded("re_1")); ok || status != ledger.RefundFailed || err != nil {
		t.Fatalf("a stale succeeded answer: %v %q %v, want the refund left failed", ok, status, err)
	}

	b.authorizedPayment(t, "m_1", "auth", 100)
	if _, _, err := gateway.CancelAuthorizedPayment(b.ctx, "m_1", "auth", "pi_auth", "canceled at the provider"); err == nil {
		t.Fatal("the gateway canceled an authorization on an event's word")
	}
	if ok, status, err := gateway.RequestCancelRecheck(b.ctx, "m_1", "auth", "pi_auth"); !ok || status != ledger.PaymentAuthorized || err != nil {
		t.Fatalf("stamp a cancel as the gateway: %v %q %v", ok, status, err)
	}
	if _, _, err := gateway.RecheckCancel(b.ctx, "m_1", "auth", "pi_auth", "canceled", "canceled at the provider"); err == nil {
		t.Fatal("the gateway recorded a cancel's recheck itself")
	}
	if ps, err := worker.CancelsToRecheck(b.ctx, 10); err != nil || len(ps) != 1 || ps[0].ChargeID != "pi_auth" {
		t.Fatalf("cancels to recheck as the worker: %+v %v", ps, err)
	}
	if ok, status, err := worker.RecheckCancel(b.ctx, "m_1", "auth", "pi_auth", "canceled", "canceled at the provider"); !ok || status != ledger.PaymentCanceled || err != nil {
		t.Fatalf("cancel as the worker after its lookup: %v %q %v", ok, status, err)
	}
	if _, err := gwPool.Exec(b.ctx, `INSERT INTO payment_cancel_rechecks VALUES ('m_1', 'x', 'pi_x', now())`); err == nil {
		t.Fatal("the gateway wrote a cancel recheck itself")
	}
	if _, err := gwPool.Exec(b.ctx, `UPDATE refunds SET recheck_requested_at = now()`); err == nil {
		t.Fatal("the gateway updated refunds itself")
	}
}
