package reconciler_test

import (
	"testing"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/reconciler"
)

// chargedPayment records a charged payment under key, as the worker does.
func (b *bundle) chargedPayment(t *testing.T, key string) *provider.Outcome {
	t.Helper()
	l := b.claim(t, key)
	out := b.charge(t, l, "pm_card_visa")
	if err := b.store.Complete(b.ctx, l, ledger.CompletionOf(out, ledger.ProviderBodyOnly)); err != nil {
		t.Fatal(err)
	}
	return out
}

// claimRefund claims a refund of amount of the payment under payKey.
func (b *bundle) claimRefund(t *testing.T, key, payKey string, amt int64) ledger.RefundClaim {
	t.Helper()
	res, err := b.store.ClaimRefund(b.ctx, "worker", workerLease, ledger.NewRefundRequest(&payment.Command{
		MerchantID: merchant, IdempotencyKey: key, PaymentKey: payKey, Amount: amt, Kind: payment.KindRefund}))
	if err != nil {
		t.Fatalf("claim refund %s: %v", key, err)
	}
	return res
}

// pendingRefund makes, as the worker does, a refund of the whole payment
// that the provider answers pending, recorded processing.
func (b *bundle) pendingRefund(t *testing.T, key, payKey string, chargeID string) *provider.RefundOutcome {
	t.Helper()
	res := b.claimRefund(t, key, payKey, amount)
	if res.Outcome != ledger.Claimed {
		t.Fatalf("claim refund %s: %+v", key, res)
	}
	out, err := b.stripe.Refund(b.ctx, provider.RefundRequest{ProviderKey: res.Lease.ProviderKey, ChargeID: chargeID,
		Amount: amount, MerchantID: merchant, IdempotencyKey: key})
	if err != nil || out.Status != provider.RefundPending {
		t.Fatalf("refund %s: %+v %v, want pending", key, out, err)
	}
	if err := b.store.CompleteRefund(b.ctx, *res.Lease, ledger.RefundCompletionOf(out)); err != nil {
		t.Fatal(err)
	}
	if r, err := b.store.GetRefund(b.ctx, merchant, key); err != nil || r.Status != ledger.RefundProcessing {
		t.Fatalf("refund %s recorded %+v %v, want processing", key, r, err)
	}
	return out
}

// TestReconcilerSettlesPendingRefundThatFails: a refund the provider holds
// pending holds its amount while it is pending; once the provider fails
// it, a pass settles it failed with one refund_failed event, its amount is
// free again (a new refund of it is claimed), and later passes change
// nothing.
func TestReconcilerSettlesPendingRefundThatFails(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{ProcessingDelay: processingDelay, Faults: stripesim.Faults{RateRefundFail: 1}})
	pay := b.chargedPayment(t, "pay")
	re := b.pendingRefund(t, "r-1", "pay", pay.ChargeID)
	if got := b.claimRefund(t, "r-2", "pay", amount); got.Outcome != ledger.Refused || got.Reason != ledger.RefuseOverRefundable {
		t.Fatalf("a second refund while the first is pending: %+v, want refused over_refundable", got)
	}
	r := b.reconciler(t, b.stripe, reconciler.Config{})
	if res := runOnce(t, r); res.RefundsSettled != 0 || res.Errors != 0 {
		t.Fatalf("pass while pending: %+v", res)
	}
	b.clk.Advance(processingDelay)
	if res := runOnce(t, r); res.RefundsSettled != 1 || res.Errors != 0 {
		t.Fatalf("pass after the refund failed: %+v", res)
	}
	got, err := b.store.GetRefund(b.ctx, merchant, "r-1")
	if err != nil || got.Status != ledger.RefundFailed || got.RefundID != re.RefundID || got.Reason == "" {
		t.Fatalf("refund %+v %v, want failed with the provider's reason", got, err)
	}
	events := `SELECT count(*) FROM outcome_events WHERE merchant_id = $1 AND idempotency_key = $2 AND kind = 'refund_failed' AND status = 'failed'`
	if n := b.count(t, events, merchant, "r-1"); n != 1 {
		t.Fatalf("%d refund_failed events, want 1", n)
	}
	if res := runOnce(t, r); res.RefundsSettled != 0 || res.Errors != 0 {
		t.Fatalf("pass after settling: %+v", res)
	}
	if n := b.count(t, events, merchant, "r-1"); n != 1 {
		t.Fatalf("%d refund_failed events after another pass, want 1", n)
	}
	if got := b.claimRefund(t, "r-2", "pay", amount); got.Outcome != ledger.Claimed || got.Refundable != amount {
		t.Fatalf("a refund of the failed refund's amount: %+v, want claimed", got)
	}
}
