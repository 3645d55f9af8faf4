package audit

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

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

// RefundProvider is what the refunds' audit reads of the provider: every
// refund of one intent; *stripe.Client is one. A provider without it is
// audited without its refunds.
type RefundProvider interface {
	ListRefunds(ctx context.Context, chargeID string) ([]*provider.RefundOutcome, error)
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
// refunds of it, and returns the findings.
func auditRefunds(ctx context.Context, prov RefundProvider, book RefundLedger, r retrier, ordered []*keyAudit, rep *Report) ([]Finding, error) {
	var pays []ledger.KeyRef
	charge := map[ledger.KeyRef]string{}
	for _, k := range ordered {
		if k.row != nil && k.row.Status == ledger.PaymentSucceeded && k.row.ChargeID != "" {
			pays = append(pays, k.ref)
			charge[k.ref] = k.row.ChargeID
		}
	}
	if len(pays) == 0 {
		return nil, nil
	}
	booked, err := book.RefundsOf(ctx, pays)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	rep.LedgerRefunds = len(booked)
	mine := map[ledger.KeyRef][]ledger.Refund{}
	for _, rf := range booked {
		ref := ledger.KeyRef{MerchantID: rf.MerchantID, IdempotencyKey: rf.PaymentKey}
		mine[ref] = append(mine[ref], rf)
	}
	var out []Finding
	for _, pay := range pays {
		listed, err := r.refunds(ctx, prov, charge[pay])
		if err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
		rep.Refunds += len(listed)
		out = append(out, refundFindings(pay, charge[pay], listed, mine[pay])...)
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
