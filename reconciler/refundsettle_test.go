package reconciler_test

import (
	"sync"
	"sync/atomic"
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

// TestRefundSettleRaces: two reconcilers and the webhook's call settling
// one failed refund at once settle it once, with one event.
func TestRefundSettleRaces(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{ProcessingDelay: processingDelay, Faults: stripesim.Faults{RateRefundFail: 1}})
	pay := b.chargedPayment(t, "pay")
	re := b.pendingRefund(t, "r-1", "pay", pay.ChargeID)
	b.clk.Advance(processingDelay)
	found, err := b.stripe.LookupRefund(b.ctx, provider.RefundLookupRequest{ChargeID: pay.ChargeID, MerchantID: merchant,
		IdempotencyKey: "r-1", Amount: amount})
	if err != nil || !found.Found || found.Outcome.RefundID != re.RefundID || found.Outcome.Status != provider.RefundFailed {
		t.Fatalf("lookup %+v %v, want the refund failed", found, err)
	}
	recs := []*reconciler.Reconciler{b.reconciler(t, b.stripe, reconciler.Config{}), b.reconciler(t, b.stripe, reconciler.Config{})}
	var (
		wg       sync.WaitGroup
		settled  atomic.Int64
		hookSaid atomic.Value
	)
	for _, r := range recs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := r.RunOnce(b.ctx)
			if err != nil || res.Errors != 0 {
				t.Errorf("pass: %+v %v", res, err)
			}
			settled.Add(int64(res.RefundsSettled))
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		ok, status, err := b.store.SettleRefund(b.ctx, merchant, "r-1", ledger.RefundCompletionOf(found.Outcome))
		if err != nil {
			t.Errorf("webhook's settle: %v", err)
		}
		hookSaid.Store(status)
		if ok {
			settled.Add(1)
		}
	}()
	wg.Wait()
	if n := settled.Load(); n != 1 {
		t.Fatalf("%d settles of one refund, want 1", n)
	}
	if st := hookSaid.Load(); st != ledger.RefundFailed {
		t.Fatalf("the webhook's settle saw %v, want failed", st)
	}
	if n := b.count(t, `SELECT count(*) FROM outcome_events WHERE merchant_id = $1 AND idempotency_key = 'r-1'`, merchant); n != 1 {
		t.Fatalf("%d events, want 1", n)
	}
}
