package audit

import (
	"cmp"
	"context"
	"fmt"
	"iter"
	"slices"
	"strings"
	"time"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
)

// The findings about refunds, each about one refund key (a provider
// refund's metadata, or the ledger refund's own key).
const (
	// DoubleRefund: two or more provider refunds for one refund key: the
	// payment was refunded twice where the ledger shows it once.
	DoubleRefund Kind = "double_refund"
	// UnrecordedRefund: a provider refund that holds money (pending or
	// succeeded) and that the ledger's refunds do not have: money went
	// back that the ledger does not show, and its sum rule does not count.
	UnrecordedRefund Kind = "unrecorded_refund"
	// MissingRefund: a ledger refund the provider answered (processing or
	// succeeded, with its refund id) that the provider does not list.
	MissingRefund Kind = "missing_refund"
	// RefundMismatch: a ledger refund and its provider refund disagree on
	// the amount, or on whether the money went back.
	RefundMismatch Kind = "refund_mismatch"
	// UnsettledRefund: the ledger still says processing, and the provider's
	// refund has ended: the webhook or the reconciler has yet to settle it.
	UnsettledRefund Kind = "unsettled_refund"
)

// RefundProvider is what the refunds' audit reads of the provider when it
// cannot list the account's refunds (AccountRefundProvider): every refund
// of one intent, one list per payment. *stripe.Client is one. A provider
// with neither is audited without its refunds.
type RefundProvider interface {
	ListRefunds(ctx context.Context, chargeID string) ([]*provider.RefundOutcome, error)
}

// AccountRefundProvider is what the refunds' audit reads of a provider
// that lists the account's refunds by creation time, newest first, a page
// at a time: those created at or after from, after the refund
// startingAfter when set (resuming after a failed page). *stripe.Client is
// one. A refund is created after its payment's intent, so the audit lists
// those created since the earliest intent of its payments and keeps theirs:
// a few calls per hundred refunds, where RefundProvider costs one per
// payment of the shared rate budget.
type AccountRefundProvider interface {
	ListRefundsSince(ctx context.Context, from time.Time, startingAfter string) iter.Seq2[*provider.RefundOutcome, error]
}

// RefundLedger is what the refunds' audit reads of the ledger: every
// refund of some payments; *dedup.Store is one.
type RefundLedger interface {
	RefundsOf(ctx context.Context, payments []ledger.KeyRef) ([]ledger.Refund, error)
}

// refundMoneyBack reports whether a ledger refund in status says its money
// went back to the customer (or may have: pending, unknown, processing).
func refundMoneyBack(status string) bool { return ledger.RefundHolds(status) }

// auditRefunds compares, for every audited payment the ledger holds as
// succeeded, the provider's refunds of its intent with the ledger's
// refunds of it, and returns the findings. reach is where the list of
// intents started.
func auditRefunds(ctx context.Context, prov any, book RefundLedger, r retrier, reach time.Time, ordered []*keyAudit, rep *Report) ([]Finding, error) {
	var pays []*keyAudit
	for _, k := range ordered {
		if k.row != nil && k.row.Status == ledger.PaymentSucceeded && k.row.ChargeID != "" {
			pays = append(pays, k)
		}
	}
	if len(pays) == 0 {
		return nil, nil
	}
	refs := make([]ledger.KeyRef, len(pays))
	for i, k := range pays {
		refs[i] = k.ref
	}
	booked, err := book.RefundsOf(ctx, refs)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	rep.LedgerRefunds = len(booked)
	mine := map[ledger.KeyRef][]ledger.Refund{}
	for _, rf := range booked {
		ref := ledger.KeyRef{MerchantID: rf.MerchantID, IdempotencyKey: rf.PaymentKey}
		mine[ref] = append(mine[ref], rf)
	}
	listed, err := r.refundsOf(ctx, prov, reach, pays)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	var out []Finding
	for _, k := range pays {
		charge := k.row.ChargeID
		rep.Refunds += len(listed[charge])
		out = append(out, refundFindings(k.ref, charge, listed[charge], mine[k.ref])...)
	}
	return out, nil
}

// refundsOf returns the provider's refunds of the payments' intents, by
// intent id, newest first. An AccountRefundProvider lists the account's
// refunds created since the earliest of the payments' intents, a page of
// 100 at a time, and the payments' are kept (a refund is created after its
// intent, in the provider's clock); a payment whose intent was created
// before reach (a row the reconciler wrote late) has its refunds listed by
// itself instead, when the provider can, so that one old payment does not
// make the audit read every refund since. A payment whose intent the
// provider does not have has no refunds there. Without an
// AccountRefundProvider, one list per payment.
func (r retrier) refundsOf(ctx context.Context, prov any, reach time.Time, pays []*keyAudit) (map[string][]*provider.RefundOutcome, error) {
	out := map[string][]*provider.RefundOutcome{}
	paged, _ := prov.(AccountRefundProvider)
	each, _ := prov.(RefundProvider)
	var alone []string
	var from time.Time
	ours := map[string]bool{}
	for _, k := range pays {
		switch named := k.named; {
		case paged == nil, each != nil && named != nil && named.Created.Before(reach):
			alone = append(alone, k.row.ChargeID)
		default:
			ours[k.row.ChargeID] = true
			if named != nil && (from.IsZero() || named.Created.Before(from)) {
				from = named.Created
			}
		}
	}
	if !from.IsZero() {
		all, err := pages(ctx, r, func(after string) iter.Seq2[*provider.RefundOutcome, error] {
			return paged.ListRefundsSince(ctx, from, after)
		}, func(re *provider.RefundOutcome) string { return re.RefundID })
		if err != nil {
			return nil, err
		}
		for _, re := range all {
			if ours[re.ChargeID] {
				out[re.ChargeID] = append(out[re.ChargeID], re)
			}
		}
	}
	for _, charge := range alone {
		listed, err := r.refunds(ctx, each, charge)
		if err != nil {
			return nil, err
		}
		out[charge] = listed
	}
	return out, nil
}

// refundFindings compares one payment's provider refunds (listed) with
// its ledger refunds (booked).
func refundFindings(pay ledger.KeyRef, chargeID string, listed []*provider.RefundOutcome, booked []ledger.Refund) []Finding {
	var out []Finding
	add := func(kind Kind, key string, refunds []*provider.RefundOutcome, format string, args ...any) {
		ids := make([]string, len(refunds))
		for i, re := range refunds {
			ids[i] = re.RefundID
		}
		out = append(out, Finding{Kind: kind, Severity: kind.Severity(), MerchantID: pay.MerchantID, IdempotencyKey: key,
			RefundIDs: ids, ChargeID: chargeID, Detail: fmt.Sprintf(format, args...)})
	}
	// The provider's refunds by refund key; one without paydedup's
	// metadata (made elsewhere: the dashboard, another system) is
	// matched by id only.
	byKey := map[string][]*provider.RefundOutcome{}
	var keys []string
	for _, re := range listed {
		key := re.IdempotencyKey
		if re.MerchantID != pay.MerchantID || key == "" {
			key = "\x00" + re.RefundID
		}
		if _, ok := byKey[key]; !ok {
			keys = append(keys, key)
		}
		byKey[key] = append(byKey[key], re)
	}
	slices.Sort(keys)
	ledgerOf := map[string]*ledger.Refund{}
	for i := range booked {
		ledgerOf[booked[i].IdempotencyKey] = &booked[i]
		if booked[i].RefundID != "" {
			ledgerOf["\x00"+booked[i].RefundID] = &booked[i]
		}
	}
	for _, key := range keys {
		res := byKey[key]
		row := ledgerOf[key]
		name := strings.TrimPrefix(key, "\x00")
		if row != nil {
			name = row.IdempotencyKey
		}
		if len(res) > 1 {
			add(DoubleRefund, name, res, "%d provider refunds for one refund key: %s", len(res), describeRefunds(res))
			continue
		}
		re := res[0]
		switch {
		case row == nil && re.Holds():
			add(UnrecordedRefund, name, res, "the provider's refund %s is %s %d, and the ledger has no refund for it", re.RefundID, re.Status, re.Amount)
		case row == nil:
			// Failed or canceled, never in the ledger: no money moved.
		case row.RefundID != "" && row.RefundID != re.RefundID:
			add(RefundMismatch, name, res, "the ledger's refund names %s, the provider's is %s (%s %d)", row.RefundID, re.RefundID, re.Status, re.Amount)
		case row.Amount != re.Amount:
			add(RefundMismatch, name, res, "the ledger refunds %d, the provider's refund %s %d", row.Amount, re.RefundID, re.Amount)
		case row.Status == ledger.RefundProcessing && re.Final():
			add(UnsettledRefund, name, res, "the ledger says processing, the provider's refund %s is %s", re.RefundID, re.Status)
		case refundMoneyBack(row.Status) != re.Holds():
			add(RefundMismatch, name, res, "the ledger says %s, the provider's refund %s is %s", row.Status, re.RefundID, re.Status)
		}
	}
	for i := range booked {
		row := &booked[i]
		made := row.Status == ledger.RefundProcessing || row.Status == ledger.RefundSucceeded
		if !made || len(byKey[row.IdempotencyKey]) > 0 || len(byKey["\x00"+row.RefundID]) > 0 {
			continue
		}
		add(MissingRefund, row.IdempotencyKey, nil, "the ledger's refund (%s %d) names %s, which the provider does not list for %s",
			row.Status, row.Amount, cmp.Or(row.RefundID, "no refund"), chargeID)
	}
	return out
}

func describeRefunds(res []*provider.RefundOutcome) string {
	parts := make([]string, len(res))
	for i, re := range res {
		parts[i] = fmt.Sprintf("%s %s %d", re.RefundID, re.Status, re.Amount)
	}
	return strings.Join(parts, ", ")
}

// refunds lists chargeID's refunds, retried up to r.tries times.
func (r retrier) refunds(ctx context.Context, prov RefundProvider, chargeID string) ([]*provider.RefundOutcome, error) {
	b := r.backoff(ctx)
	for fails := 1; ; fails++ {
		res, err := prov.ListRefunds(ctx, chargeID)
		if err == nil || fails >= r.tries || ctx.Err() != nil {
			return res, err
		}
		if serr := sleep(ctx, b.NextBackOff()); serr != nil {
			return res, err
		}
	}
}
