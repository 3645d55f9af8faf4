package audit_test

import (
	"context"
	"fmt"
	"iter"
	"slices"
	"testing"
	"time"

	"github.com/paydedup/paydedup/audit"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
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
	for _, key := range []string{"p-clean", "p-double", "p-unrecorded", "p-amount", "p-status", "p-missing", "p-unsettled"} {
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
	// A refund the ledger still holds processing that the provider ended.
	unsettled := b.refund(t, "r-unsettled", "p-unsettled", pays["p-unsettled"], 100)
	b.tamper(t, `UPDATE refunds SET status = 'processing' WHERE refund_id = $1`, unsettled)
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
		"unsettled_refund " + merchant + ":r-unsettled",
	}
	if got := kinds(rep); !slices.Equal(got, want) {
		t.Fatalf("findings %v, want %v", got, want)
	}
	// A provider that lists refunds only per intent finds the same.
	lists := b.sim.Stats().Requests[stripesim.KindRefundList]
	each, err := audit.Run(b.ctx, perIntent{b.stripe}, b.store, audit.Config{Since: t0.Add(-time.Minute), Until: t0.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if got := kinds(each); !slices.Equal(got, want) || each.Refunds != rep.Refunds {
		t.Fatalf("listed per intent: findings %v, %d refunds; want %v, %d", got, each.Refunds, want, rep.Refunds)
	}
	if got := b.sim.Stats().Requests[stripesim.KindRefundList] - lists; got != int64(len(pays)) {
		t.Errorf("listed per intent: %d refund lists, want one per payment, %d", got, len(pays))
	}
	for _, f := range rep.Findings {
		switch f.Kind {
		case audit.DoubleRefund:
			if f.Severity != audit.Critical || !slices.Equal(sorted(f.RefundIDs), sorted([]string{first, second})) ||
				f.ChargeID != pays["p-double"] {
				t.Errorf("double refund %+v, want critical, refunds %s and %s", f, first, second)
			}
		case audit.UnsettledRefund:
			if f.Severity != audit.Warning || !slices.Equal(f.RefundIDs, []string{unsettled}) || f.ChargeID != pays["p-unsettled"] {
				t.Errorf("unsettled refund %+v, want a warning, refund %s", f, unsettled)
			}
		case audit.UnrecordedRefund:
			if f.Severity != audit.Critical || !slices.Equal(f.RefundIDs, []string{lacked}) {
				t.Errorf("unrecorded refund %+v, want critical, refund %s", f, lacked)
			}
		}
	}
}

// perIntent is the Stripe adapter without ListRefundsSince: the audit
// lists each payment's refunds by itself.
type perIntent struct{ s *stripe.Client }

func (p perIntent) ListIntents(ctx context.Context, req provider.ListRequest) iter.Seq2[provider.Intent, error] {
	return p.s.ListIntents(ctx, req)
}

func (p perIntent) GetIntent(ctx context.Context, id string) (provider.Intent, error) {
	return p.s.GetIntent(ctx, id)
}

func (p perIntent) ListRefunds(ctx context.Context, chargeID string) ([]*provider.RefundOutcome, error) {
	return p.s.ListRefunds(ctx, chargeID)
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestAuditListsRefundsByPage: the audit reads the account's refunds a
// page of 100 at a time, from the earliest audited payment on, not once
// per payment: 250 refunded payments cost 3 refund lists, not 250. A
// refund of a payment outside the window is listed and left alone, and
// pages that fail are asked again from the last refund received.
func TestAuditListsRefundsByPage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A payment long before the window, refunded in it: not audited.
	b.clk.Set(t0.Add(-3 * time.Hour))
	early := b.pay(t, command(merchant, "p-early", 1000, "pm_card_visa"))
	// An intent long before the window whose row was written in it (the
	// reconciler resolved a crash late), refunded: audited, its refunds
	// listed by themselves rather than every refund since.
	late := command(merchant, "p-late", 1000, "pm_card_visa")
	l := b.claim(t, late)
	out, err := b.stripe.Charge(b.ctx, chargeRequest(late, l.ProviderKey))
	if err != nil {
		t.Fatal(err)
	}
	b.clk.Set(t0)
	if err := b.store.Complete(b.ctx, *l, ledger.Completion{ChargeID: out.ChargeID, ResponseStatus: 200, Response: out.Response}); err != nil {
		t.Fatal(err)
	}
	b.refund(t, "r-late", "p-late", out.ChargeID, 100)
	b.refund(t, "r-early", "p-early", early, 100)
	const n = 250
	for i := range n {
		key := fmt.Sprintf("p-%03d", i)
		id := b.pay(t, command(merchant, key, 1000, "pm_card_visa"))
		b.refund(t, "r-"+key, key, id, int64(100+i))
		b.clk.Advance(time.Second)
	}
	lists := func() int64 { return b.sim.Stats().Requests[stripesim.KindRefundList] }
	before := lists()
	rep := b.run(t, audit.Config{})
	if rep.Drift() || rep.Refunds != n+1 || rep.LedgerRefunds != n+1 || rep.LedgerRows != n+1 || rep.Retrieved != 1 {
		t.Fatalf("audit of %d refunded payments: %v, %+v; want no drift, %d provider and ledger refunds and rows, 1 retrieved",
			n+1, kinds(rep), rep, n+1)
	}
	// 252 refunds since the window's first intent: 3 pages of 100; and
	// the late row's list.
	if got, want := lists()-before, int64((n+2+99)/100+1); got != want {
		t.Errorf("the audit of %d refunded payments listed refunds %d times, want %d (pages of 100, and 1)", n+1, got, want)
	}

	// Through faults, the same whole audit: every refund once.
	if err := b.sim.SetFaults(stripesim.Faults{Rate5xx: 0.3, Rate429: 0.2}); err != nil {
		t.Fatal(err)
	}
	rep, err = audit.Run(b.ctx, b.stripe, b.store, audit.Config{Since: t0.Add(-time.Minute), Until: t0.Add(time.Hour), Tries: 20, RetryWait: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Drift() || rep.Refunds != n+1 {
		t.Fatalf("through faults: %v, %d provider refunds, want no drift and %d", kinds(rep), rep.Refunds, n+1)
	}
}

var (
	_ audit.AccountRefundProvider = (*stripe.Client)(nil)
	_ audit.RefundProvider        = (*stripe.Client)(nil)
)
