package audit_test

import (
	"slices"
	"testing"

	"github.com/paydedup/paydedup/audit"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
)

// refund runs a refund of amount of the payment under payKey as the worker
// does (claim, refund under the row's provider key, complete), and returns
// the provider's refund id.
func (b *bundle) refund(t *testing.T, key, payKey, chargeID string, amount int64) string {
	t.Helper()
	c, err := b.store.ClaimRefund(b.ctx, "w1", 60e9, ledger.NewRefundRequest(&payment.Command{MerchantID: merchant,
		IdempotencyKey: key, PaymentKey: payKey, Amount: amount, Kind: payment.KindRefund}))
	if err != nil || c.Outcome != ledger.Claimed {
		t.Fatalf("claim refund %s: %+v %v", key, c, err)
	}
	out, err := b.stripe.Refund(b.ctx, provider.RefundRequest{ProviderKey: c.Lease.ProviderKey, ChargeID: chargeID, Amount: amount,
		MerchantID: merchant, IdempotencyKey: key})
	if err != nil {
		t.Fatalf("refund %s: %v", key, err)
	}
	if err := b.store.CompleteRefund(b.ctx, *c.Lease, ledger.RefundCompletionOf(out)); err != nil {
		t.Fatal(err)
	}
	return out.RefundID
}

// straightRefund refunds at the provider, bypassing the ledger, under
// providerKey with the metadata of the refund key.
func (b *bundle) straightRefund(t *testing.T, key, providerKey, chargeID string, amount int64) string {
	t.Helper()
	out, err := b.stripe.Refund(b.ctx, provider.RefundRequest{ProviderKey: providerKey, ChargeID: chargeID, Amount: amount,
		MerchantID: merchant, IdempotencyKey: key})
	if err != nil || out.Refused {
		t.Fatalf("refund %s at the provider: %+v %v", key, out, err)
	}
	return out.RefundID
}

// TestAuditFindsRefundDrift: refunds made as the worker makes them audit
// clean; a refund made twice at the provider for one ledger refund (a
// double refund), a refund the ledger lacks, one whose amount or outcome
// the ledger records otherwise, and one the provider does not have are
// each found, and nothing else is.
func TestAuditFindsRefundDrift(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pays := map[string]string{}
	for _, key := range []string{"p-clean", "p-double", "p-unrecorded", "p-amount", "p-status", "p-missing"} {
		pays[key] = b.pay(t, command(merchant, key, 1000, "pm_card_visa"))
	}
	b.refund(t, "r-clean-1", "p-clean", pays["p-clean"], 300)
	b.refund(t, "r-clean-2", "p-clean", pays["p-clean"], 700)
	if rep := b.run(t, audit.Config{}); rep.Drift() || rep.Refunds != 2 || rep.LedgerRefunds != 2 {
		t.Fatalf("refunds run as the worker runs them: %v, %d provider and %d ledger refunds, want no drift, 2 and 2",
			kinds(rep), rep.Refunds, rep.LedgerRefunds)
	}

	// A double refund: the refund's key sent again under another provider
	// key (a key window past, a naive retry).
	first := b.refund(t, "r-double", "p-double", pays["p-double"], 400)
	second := b.straightRefund(t, "r-double", "naive-retry", pays["p-double"], 400)
	// A refund the ledger lacks.
	lacked := b.straightRefund(t, "r-unrecorded", "elsewhere", pays["p-unrecorded"], 250)
	// A refund the ledger records with another amount, one it records
	// failed, one it records under another provider refund, and one the
	// provider does not have.
	amt := b.refund(t, "r-amount", "p-amount", pays["p-amount"], 100)
	b.tamper(t, `UPDATE refunds SET amount = 90 WHERE refund_id = $1`, amt)
	st := b.refund(t, "r-status", "p-status", pays["p-status"], 100)
	b.tamper(t, `UPDATE refunds SET status = 'failed' WHERE refund_id = $1`, st)
	gone := b.refund(t, "r-other", "p-missing", pays["p-missing"], 100)
	b.tamper(t, `UPDATE refunds SET refund_id = 're_nowhere' WHERE refund_id = $1`, gone)
	b.tamper(t, `INSERT INTO refunds (merchant_id, idempotency_key, payment_key, request_hash, provider_key, charge_id, amount,
		currency, status, attempts, key_window_start, refund_id, response_status, response, created_at, updated_at, completed_at)
		VALUES ($1, 'r-missing', 'p-missing', '\x00', 'pdr_x', $2, 50, 'usd', 'succeeded', 1, now(), 're_ghost', 200, '{}', now(), now(), now())`,
		merchant, pays["p-missing"])

	rep := b.run(t, audit.Config{})
	want := []string{
		"double_refund " + merchant + ":r-double",
		"missing_refund " + merchant + ":r-missing",
		"refund_mismatch " + merchant + ":r-amount",
		"refund_mismatch " + merchant + ":r-other",
		"refund_mismatch " + merchant + ":r-status",
		"unrecorded_refund " + merchant + ":r-unrecorded",
	}
	if got := kinds(rep); !slices.Equal(got, want) {
		t.Fatalf("findings %v, want %v", got, want)
	}
	for _, f := range rep.Findings {
		switch f.Kind {
		case audit.DoubleRefund:
			if f.Severity != audit.Critical || !slices.Equal(sorted(f.RefundIDs), sorted([]string{first, second})) ||
				f.ChargeID != pays["p-double"] {
				t.Errorf("double refund %+v, want critical, refunds %s and %s", f, first, second)
			}
		case audit.UnrecordedRefund:
			if f.Severity != audit.Critical || !slices.Equal(f.RefundIDs, []string{lacked}) {
				t.Errorf("unrecorded refund %+v, want critical, refund %s", f, lacked)
			}
		}
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
