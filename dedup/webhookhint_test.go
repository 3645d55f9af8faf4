package dedup_test

import (
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/lab/testenv"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// TestGatewaySettlesRefundsSucceededOnly: the gateway's role (the
// webhook) may settle a processing refund to succeeded only, so even a
// forged event cannot free a pending refund's amount; settle_refund, which
// may fail one, is the worker's (the reconciler's, after a lookup).
func TestGatewaySettlesRefundsSucceededOnly(t *testing.T) {
	t.Parallel()
	ownerURL := testenv.PostgresURL(t)
	wPool := asWorker(t, ownerURL)
	worker, err := dedup.New(wPool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	gateway, err := dedup.New(testenv.AsRole(t, ownerURL, "paydedup_gateway"), dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{store: worker, pool: wPool, ctx: t.Context()}
	b.chargedPayment(t, "m_1", "pay", 100)
	b.processingRefund(t, "r-1", "pay", 60, "re_1")
	b.processingRefund(t, "r-2", "pay", 40, "re_2")
	if _, _, err := gateway.SettleRefund(b.ctx, "m_1", "r-1", refundFailed("re_1")); err == nil {
		t.Fatal("the gateway settled a pending refund failed")
	}
	if ok, status, err := gateway.SettleRefundSucceeded(b.ctx, "m_1", "r-1", refundFailed("re_1")); err == nil {
		t.Fatalf("the gateway's succeeded settle took a failed refund: %v %q", ok, status)
	}
	if n := b.count(t, `SELECT count(*) FROM refunds WHERE status = 'processing'`); n != 2 {
		t.Fatalf("%d refunds processing, want both", n)
	}
	if ok, status, err := gateway.SettleRefundSucceeded(b.ctx, "m_1", "r-1", refunded("re_1")); !ok || status != ledger.RefundSucceeded || err != nil {
		t.Fatalf("settle succeeded as the gateway: %v %q %v", ok, status, err)
	}
	if ok, status, err := gateway.SettleRefundSucceeded(b.ctx, "m_1", "r-1", refunded("re_1")); ok || status != ledger.RefundSucceeded || err != nil {
		t.Fatalf("settle succeeded again: %v %q %v, want nothing changed", ok, status, err)
	}
	if _, _, err := gateway.SettleRefundSucceeded(b.ctx, "m_1", "r-1", refunded("re_x")); err == nil {
		t.Fatal("settled another refund id")
	}
	if ok, status, err := worker.SettleRefund(b.ctx, "m_1", "r-2", refundFailed("re_2")); !ok || status != ledger.RefundFailed || err != nil {
		t.Fatalf("settle failed as the worker: %v %q %v", ok, status, err)
	}
	if ok, status, err := gateway.SettleRefundSucceeded(b.ctx, "m_1", "r-2", refunded("re_2")); ok || status != ledger.RefundFailed || err != nil {
		t.Fatalf("a succeeded report of a failed refund: %v %q %v, want it left failed", ok, status, err)
	}
}

// TestProviderCancelWaitsForCaptureInFlight: the provider's cancel, told
// by a webhook, does not move an authorized payment while a capture of it
// holds (claimed, unknown or succeeded): the capture's outcome decides.
// A succeeded capture that finds its payment no longer authorized fails
// loudly rather than recording money taken against a canceled payment.
func TestProviderCancelWaitsForCaptureInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.authorizedPayment(t, "m_1", "auth", 100)
	c := b.claimOp(t, "w", opReq(payment.KindCapture, "m_1", "c-1", "auth", 0))
	if c.Outcome != ledger.Claimed {
		t.Fatalf("capture: %+v", c)
	}
	if ok, status, err := b.store.CancelAuthorizedPayment(b.ctx, "m_1", "auth", "pi_auth", "canceled at the provider"); ok || status != ledger.PaymentAuthorized || err != nil {
		t.Fatalf("cancel while a capture is in flight: %v %q %v, want nothing changed", ok, status, err)
	}
	if err := b.store.CompletePaymentOp(b.ctx, *c.Lease, captured(100)); err != nil {
		t.Fatal(err)
	}
	if pay, err := b.store.GetPayment(b.ctx, "m_1", "auth"); err != nil || pay.Status != ledger.PaymentSucceeded {
		t.Fatalf("payment after its capture: %+v %v, want succeeded", pay, err)
	}
	if ok, status, err := b.store.CancelAuthorizedPayment(b.ctx, "m_1", "auth", "pi_auth", "canceled at the provider"); ok || status != ledger.PaymentSucceeded || err != nil {
		t.Fatalf("cancel after the capture: %v %q %v", ok, status, err)
	}

	// A payment moved off authorized behind a capture's back: the
	// capture's success is refused, the operation stays as it was.
	b.authorizedPayment(t, "m_1", "auth2", 100)
	c = b.claimOp(t, "w", opReq(payment.KindCapture, "m_1", "c-2", "auth2", 0))
	if _, err := b.pool.Exec(b.ctx, `UPDATE payments SET status = 'canceled', settled_at = now() WHERE idempotency_key = 'auth2'`); err != nil {
		t.Fatal(err)
	}
	err := b.store.CompletePaymentOp(b.ctx, *c.Lease, captured(100))
	if err == nil || !strings.Contains(err.Error(), "not authorized") {
		t.Fatalf("a capture's success against a canceled payment: %v, want an error", err)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_ops WHERE idempotency_key = 'c-2' AND status = 'pending'`); n != 1 {
		t.Fatal("the capture's operation moved")
	}
}
