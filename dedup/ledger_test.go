package dedup_test

import (
	"errors"
	"testing"
	"time"

	"github.com/paydedup/paydedup/ledger"
)

// TestPurgedKeyReusedForAnotherPayment: after retention the key row is gone
// and the ledger is the only memory of the key. A command under that key
// with another amount or currency is a reused key (Mismatch), never acked as
// the old payment's duplicate; the same payment again is a duplicate. Both
// say they come from the ledger.
func TestPurgedKeyReusedForAnotherPayment(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := req("m_1", "reused", 1000)
	l := b.claim(t, "a", r).Lease
	if err := b.store.Complete(b.ctx, *l, charged("pi_reused")); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(ledger.DefaultRetention + time.Hour)
	if n, err := b.store.Purge(b.ctx, 10); err != nil || n != 1 {
		t.Fatalf("purge: %d %v", n, err)
	}

	other := req("m_1", "reused", 2500)
	euro := req("m_1", "reused", 1000)
	euro.Currency = "eur"
	for name, rq := range map[string]ledger.ClaimRequest{"amount": other, "currency": euro} {
		res := b.claim(t, "b", rq)
		if res.Outcome != ledger.Mismatch || !res.FromLedger || res.Lease != nil {
			t.Fatalf("other %s under a purged key: %v (from ledger %v), want a mismatch from the ledger", name, res.Outcome, res.FromLedger)
		}
	}
	res := b.claim(t, "b", r)
	if res.Outcome != ledger.Duplicate || !res.FromLedger || res.Record.ChargeID != "pi_reused" {
		t.Fatalf("the same payment: %v (from ledger %v, charge %q), want a duplicate of pi_reused", res.Outcome, res.FromLedger, res.Record.ChargeID)
	}
	// In one batch, in either order: each judged against the ledger.
	got, err := b.store.ClaimBatch(b.ctx, "b", lease, []ledger.ClaimRequest{other, r, euro, r})
	if err != nil {
		t.Fatal(err)
	}
	want := []ledger.Outcome{ledger.Mismatch, ledger.Duplicate, ledger.Mismatch, ledger.Duplicate}
	for i := range got {
		if got[i].Outcome != want[i] || !got[i].FromLedger {
			t.Fatalf("batch item %d: %v (from ledger %v), want %v", i, got[i].Outcome, got[i].FromLedger, want[i])
		}
	}
	if _, err := b.store.Get(b.ctx, "m_1", "reused"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("the ledger check must not recreate the key row: %v", err)
	}
	p, err := b.store.GetPayment(b.ctx, "m_1", "reused")
	if err != nil || p.ChargeID != "pi_reused" || p.Amount != r.Amount || p.Currency != r.Currency {
		t.Fatalf("GetPayment: %+v %v", p, err)
	}
	if _, err := b.store.GetPayment(b.ctx, "m_1", "never"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("GetPayment of an unknown key: %v, want ErrNotFound", err)
	}
}

// TestLedgerOutlivesRecord: the ledger keeps a key's amount and currency
// after its record.
func TestLedgerOutlivesRecord(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.store.GetPayment(b.ctx, "m_1", "l"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("no ledger row: %v", err)
	}
	c := b.claim(t, "w", req("m_1", "l", 1000))
	if err := b.store.Complete(b.ctx, *c.Lease, charged("ch_l")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `DELETE FROM idempotency_keys`); err != nil {
		t.Fatal(err)
	}
	if e, err := b.store.GetPayment(b.ctx, "m_1", "l"); err != nil || e.Amount != 1000 || e.Currency != "usd" {
		t.Fatalf("ledger entry %+v %v", e, err)
	}
}
