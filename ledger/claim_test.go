package ledger_test

import (
	"errors"
	"testing"
	"time"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// TestEvaluate: what a claim finds in a row it did not take, for each of
// the row's states, as a pure rule (dedup's claim calls it on the rows its
// statement met; the store's tests check the same outcomes end to end).
func TestEvaluate(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	window := 23 * time.Hour
	hash, other := make([]byte, 32), make([]byte, 32)
	other[0] = 1
	req := ledger.ClaimRequest{MerchantID: "m_1", IdempotencyKey: "k", RequestHash: hash, Amount: 1000, Currency: "usd"}
	row := func(f func(*ledger.Record)) ledger.Record {
		r := ledger.Record{MerchantID: "m_1", IdempotencyKey: "k", RequestHash: hash, Amount: 1000, Currency: "usd",
			Status: ledger.StatusPending, KeyWindowStart: now.Add(-time.Hour)}
		f(&r)
		return r
	}
	for _, c := range []struct {
		name       string
		rec        ledger.Record
		want       ledger.Outcome
		retryIn    time.Duration
		acquirable bool
		fromLedger bool
	}{
		{"purged key, same payment", row(func(r *ledger.Record) { r.RequestHash = nil }), ledger.Duplicate, 0, false, true},
		{"purged key, other amount", row(func(r *ledger.Record) { r.RequestHash, r.Amount = nil, 999 }), ledger.Mismatch, 0, false, true},
		{"purged key, other currency", row(func(r *ledger.Record) { r.RequestHash, r.Currency = nil, "eur" }), ledger.Mismatch, 0, false, true},
		{"other fingerprint", row(func(r *ledger.Record) { r.RequestHash, r.Status = other, ledger.StatusCompleted }), ledger.Mismatch, 0, false, false},
		{"completed", row(func(r *ledger.Record) { r.Status = ledger.StatusCompleted }), ledger.Duplicate, 0, false, false},
		{"live lease", row(func(r *ledger.Record) { r.LockedUntil = now.Add(5 * time.Second) }), ledger.InFlight, 5 * time.Second, false, false},
		{"lease about to end", row(func(r *ledger.Record) { r.LockedUntil = now.Add(time.Millisecond) }), ledger.InFlight, ledger.MinRetry, false, false},
		{"expired lease past the key window", row(func(r *ledger.Record) { r.KeyWindowStart = now.Add(-window) }), ledger.NeedsLookup, ledger.LookupRetry, false, false},
		{"failed past the key window", row(func(r *ledger.Record) { r.Status, r.KeyWindowStart = ledger.StatusFailed, now.Add(-window-time.Hour) }), ledger.NeedsLookup, ledger.LookupRetry, false, false},
		{"expired lease in the key window", row(func(r *ledger.Record) { r.LockedUntil = now.Add(-time.Second) }), ledger.InFlight, ledger.MinRetry, true, false},
		{"failed in the key window", row(func(r *ledger.Record) { r.Status = ledger.StatusFailed }), ledger.InFlight, ledger.MinRetry, true, false},
	} {
		res, acquirable := ledger.Evaluate(c.rec, req, now, window)
		if res.Outcome != c.want || res.RetryIn != c.retryIn || acquirable != c.acquirable || res.FromLedger != c.fromLedger {
			t.Errorf("%s: %v retry %v acquirable %v from ledger %v; want %v retry %v acquirable %v from ledger %v",
				c.name, res.Outcome, res.RetryIn, acquirable, res.FromLedger, c.want, c.retryIn, c.acquirable, c.fromLedger)
		}
		if res.Record.IdempotencyKey != "k" {
			t.Errorf("%s: result carries record %+v, want the row", c.name, res.Record)
		}
	}
}

// TestClaimRequestRefusesARefund: a refund is claimed in its own table
// (RefundRequest), never as a payment's key: a ClaimRequest made of a
// refund command is invalid_kind, so no path can charge it.
func TestClaimRequestRefusesARefund(t *testing.T) {
	refund := &payment.Command{MerchantID: "m_1", IdempotencyKey: "r-1", Kind: payment.KindRefund, PaymentKey: "pay", Amount: 10, Currency: "usd"}
	var verr *payment.ValidationError
	if err := ledger.NewClaimRequest(refund).Validate(); !errors.As(err, &verr) || verr.Reason != payment.ReasonInvalidKind {
		t.Fatalf("claim request of a refund: %v, want invalid_kind", err)
	}
	charge := &payment.Command{MerchantID: "m_1", IdempotencyKey: "c-1", Kind: payment.KindAuthorize, Amount: 10, Currency: "usd", PaymentMethod: "pm_card_visa"}
	if err := ledger.NewClaimRequest(charge).Validate(); err != nil {
		t.Fatalf("claim request of an authorize: %v", err)
	}
}
