package reconciler_test

import (
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/reconciler"
)

// succeededRefund makes, as the worker does, a refund of the whole
// payment that the provider answers succeeded.
func (b *bundle) succeededRefund(t *testing.T, key, payKey, chargeID string) *provider.RefundOutcome {
	t.Helper()
	res := b.claimRefund(t, key, payKey, amount)
	if res.Outcome != ledger.Claimed {
		t.Fatalf("claim refund %s: %+v", key, res)
	}
	out, err := b.stripe.Refund(b.ctx, provider.RefundRequest{ProviderKey: res.Lease.ProviderKey, ChargeID: chargeID,
		Amount: amount, MerchantID: merchant, IdempotencyKey: key})
	if err != nil || out.Status != provider.RefundSucceeded {
		t.Fatalf("refund %s: %+v %v, want succeeded", key, out, err)
	}
	if err := b.store.CompleteRefund(b.ctx, *res.Lease, ledger.RefundCompletionOf(out)); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReconcilerReversesRefundFailedAfterSucceeding: a refund recorded
// succeeded that the provider fails later, stamped for a recheck (as the
// webhook's refund.failed does), is looked up and moved to failed once,
// with one refund_failed event after its refunded one; its amount is free
// to refund again. A stamp the provider does not confirm (the refund
// still succeeded there) is cleared and changes nothing.
func TestReconcilerReversesRefundFailedAfterSucceeding(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{})
	pay := b.chargedPayment(t, "pay")
	re := b.succeededRefund(t, "r-1", "pay", pay.ChargeID)
	pay2 := b.chargedPayment(t, "pay-2")
	re2 := b.succeededRefund(t, "r-2", "pay-2", pay2.ChargeID)
	if err := b.sim.FailRefund(re.RefundID); err != nil {
		t.Fatal(err)
	}
	for key, id := range map[string]string{"r-1": re.RefundID, "r-2": re2.RefundID} {
		if ok, _, err := b.store.RequestRefundRecheck(b.ctx, merchant, key, id); !ok || err != nil {
			t.Fatalf("request recheck of %s: %v %v", key, ok, err)
		}
	}
	r := b.reconciler(t, b.stripe, reconciler.Config{})
	if res := runOnce(t, r); res.RefundsReversed != 1 || res.Errors != 0 {
		t.Fatalf("pass after the provider failed r-1: %+v, want 1 refund reversed", res)
	}
	got, err := b.store.GetRefund(b.ctx, merchant, "r-1")
	if err != nil || got.Status != ledger.RefundFailed || got.Reason == "" {
		t.Fatalf("r-1 %+v %v, want failed with the provider's reason", got, err)
	}
	if got, err := b.store.GetRefund(b.ctx, merchant, "r-2"); err != nil || got.Status != ledger.RefundSucceeded {
		t.Fatalf("r-2 %+v %v, want still succeeded", got, err)
	}
	failed := `SELECT count(*) FROM outcome_events WHERE merchant_id = $1 AND idempotency_key = $2 AND kind = 'refund_failed' AND seq = 4`
	stamped := `SELECT count(*) FROM refunds WHERE recheck_requested_at IS NOT NULL`
	if n := b.count(t, failed, merchant, "r-1"); n != 1 {
		t.Fatalf("%d refund_failed events of r-1, want 1", n)
	}
	if n := b.count(t, stamped); n != 0 {
		t.Fatalf("%d refunds still stamped, want 0", n)
	}
	// Asked again (the event delivered again): a failed refund is not
	// stamped, and a pass changes nothing.
	if ok, status, err := b.store.RequestRefundRecheck(b.ctx, merchant, "r-1", re.RefundID); ok || err != nil || status != ledger.RefundFailed {
		t.Fatalf("recheck of a failed refund: %v %q %v, want not requested", ok, status, err)
	}
	if res := runOnce(t, r); res.RefundsReversed != 0 || res.Errors != 0 {
		t.Fatalf("pass after the reversal: %+v", res)
	}
	if n := b.count(t, failed, merchant, "r-1") + b.count(t, failed, merchant, "r-2"); n != 1 {
		t.Fatalf("%d refund_failed events after another pass, want 1", n)
	}
	if got := b.claimRefund(t, "r-3", "pay", amount); got.Outcome != ledger.Claimed {
		t.Fatalf("a refund of the reversed refund's amount: %+v, want claimed", got)
	}
}

// lookupOnly is a provider that looks payments up and nothing else.
type lookupOnly struct{ reconciler.Looker }

// TestReconcilerSaysWhenItCannotSettleRefunds: a reconciler whose
// provider cannot look refunds up, over a ledger with a refund the
// provider holds pending, counts an error each pass and logs it once.
func TestReconcilerSaysWhenItCannotSettleRefunds(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{ProcessingDelay: processingDelay, Faults: stripesim.Faults{RateRefundFail: 1}})
	pay := b.chargedPayment(t, "pay")
	b.pendingRefund(t, "r-1", "pay", pay.ChargeID)
	var logs lockedBuffer
	r := b.reconciler(t, lookupOnly{b.stripe}, reconciler.Config{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	for range 2 {
		if res := runOnce(t, r); res.Errors != 1 {
			t.Fatalf("pass with a refund it cannot look up: %+v, want 1 error", res)
		}
	}
	if n := strings.Count(logs.String(), "cannot look refunds up"); n != 1 {
		t.Fatalf("logged %d times, want once:\n%s", n, logs.String())
	}
}

// lockedBuffer is a log sink safe for the reconciler's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
