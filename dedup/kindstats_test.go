package dedup_test

import (
	"testing"
	"time"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// TestCountUnsettledOps: what the worker's gauges read on every scrape: a
// refund pending past its lease is stuck, a live one is not; a capture
// released unknown is unknown; a kind with none reads 0.
func TestCountUnsettledOps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.chargedPayment(t, "m_1", "pay", 1000)
	b.authorizedPayment(t, "m_1", "auth", 1000)
	stuck := b.claimRefund(t, "gone", refundReq("m_1", "r-stuck", "pay", 100))
	if stuck.Lease == nil {
		t.Fatalf("claim: %+v", stuck)
	}
	b.clock.Advance(lease + time.Second) // its lease runs out
	if c := b.claimRefund(t, "w", refundReq("m_1", "r-live", "pay", 100)); c.Lease == nil {
		t.Fatalf("claim: %+v", c)
	}
	capt := b.claimOp(t, "w", opReq(payment.KindCapture, "m_1", "c-unk", "auth", 0))
	if err := b.store.ReleasePaymentOp(b.ctx, *capt.Lease, "timeout"); err != nil {
		t.Fatal(err)
	}
	got, err := b.store.CountUnsettledOps(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]ledger.UnsettledOps{"refund": {Stuck: 1}, "capture": {Unknown: 1}, "cancel": {}}
	if len(got) != len(want) || got["refund"] != want["refund"] || got["capture"] != want["capture"] || got["cancel"] != want["cancel"] {
		t.Errorf("unsettled operations %+v, want %+v", got, want)
	}
}
