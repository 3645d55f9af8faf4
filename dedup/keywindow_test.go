package dedup_test

import (
	"testing"
	"time"

	"github.com/paydedup/paydedup/ledger"
)

// TestFailedRowPastKeyWindowNeedsLookup: a `failed` row is re-called blind
// only inside the provider's key window. Past it the claim hands it out to
// nobody: it is parked pending (maybe_charged) for a lookup, which the
// reconciler's acquire picks up; a lookup that proves nothing was charged
// starts a fresh window, and only then is the key called again.
func TestFailedRowPastKeyWindowNeedsLookup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := req("m_1", "failed-old", 1000)
	l := b.claim(t, "a", r).Lease
	if st, err := b.store.Fail(b.ctx, *l, "429 rate limited"); err != nil || st != ledger.StatusFailed {
		t.Fatalf("fail: %v %v", st, err)
	}
	b.clock.Advance(ledger.DefaultProviderKeyWindow + time.Minute)

	res := b.claim(t, "b", r)
	if res.Outcome != ledger.NeedsLookup || res.Lease != nil {
		t.Fatalf("failed row past the key window: %v (lease %v), want needs_lookup and no lease", res.Outcome, res.Lease)
	}
	rec, err := b.store.Get(b.ctx, "m_1", "failed-old")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != ledger.StatusPending || !rec.MaybeCharged || rec.LockedUntil.After(b.clock.Now()) {
		t.Fatalf("parked row = %s maybe_charged=%v locked_until=%v, want pending, maybe_charged, lease expired",
			rec.Status, rec.MaybeCharged, rec.LockedUntil)
	}
	// A second copy (a dead-letter replay goes through the same claim)
	// gets the same answer and charges nothing.
	if res := b.claim(t, "c", r); res.Outcome != ledger.NeedsLookup {
		t.Fatalf("second copy: %v, want needs_lookup", res.Outcome)
	}

	b.clock.Advance(time.Second)
	stuck, err := b.store.AcquireStuck(b.ctx, "rec", 0, lease, 10)
	if err != nil || len(stuck) != 1 || stuck[0].Record.IdempotencyKey != "failed-old" {
		t.Fatalf("reconciler acquire: %+v %v, want the parked row", stuck, err)
	}
	if err := b.store.ResolveNotCharged(b.ctx, stuck[0].Lease, "lookup: nothing under the key"); err != nil {
		t.Fatal(err)
	}
	rec, err = b.store.Get(b.ctx, "m_1", "failed-old")
	if err != nil || rec.Status != ledger.StatusFailed || !rec.KeyWindowStart.Equal(b.clock.Now()) {
		t.Fatalf("after the lookup: %+v %v, want failed with a fresh key window", rec, err)
	}
	if res := b.claim(t, "d", r); res.Outcome != ledger.Reacquired {
		t.Fatalf("after the lookup proved nothing was charged: %v, want reacquired", res.Outcome)
	}
}

// TestReacquireOfFailedKeepsKeyWindow: re-acquiring a `failed` row does not
// restart its key window; the window counts from the first call under the
// provider key, whatever the row went through since.
func TestReacquireOfFailedKeepsKeyWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := req("m_1", "failed-twice", 1000)
	l := b.claim(t, "a", r).Lease
	if _, err := b.store.Fail(b.ctx, *l, "429"); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(ledger.DefaultProviderKeyWindow - time.Hour)
	res := b.claim(t, "b", r)
	if res.Outcome != ledger.Reacquired {
		t.Fatalf("inside the window: %v, want reacquired", res.Outcome)
	}
	if _, err := b.store.Fail(b.ctx, *res.Lease, "429 again"); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(2 * time.Hour) // past the first call's window
	if res := b.claim(t, "c", r); res.Outcome != ledger.NeedsLookup {
		t.Fatalf("past the first call's window: %v, want needs_lookup", res.Outcome)
	}
}

// TestSchemaRejectsFailedMaybeCharged: `failed` means provably not charged,
// so the schema refuses a failed row that may have charged.
func TestSchemaRejectsFailedMaybeCharged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := b.claim(t, "a", req("m_1", "k", 1000)).Lease
	if _, err := b.store.Fail(b.ctx, *l, "429"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE idempotency_keys SET maybe_charged = true`); err == nil {
		t.Fatal("the schema accepted a failed row marked maybe_charged")
	}
}
