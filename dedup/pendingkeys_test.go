package dedup_test

import (
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/ledger"
)

// TestPendingKeysNameEveryPendingRow walks keys through every transition
// and checks after each that pending_keys (migration 00012, the
// reconciler's way to pending rows now that no index tests status) names
// exactly the keys that are pending, and that the reconciler's scan finds a
// stuck one. A pending key missing from it would never be resolved by a
// lookup.
func TestPendingKeysNameEveryPendingRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	check := func(step string) {
		t.Helper()
		keys := func(sql string) []string {
			rows, err := b.pool.Query(b.ctx, sql)
			if err != nil {
				t.Fatal(err)
			}
			ks, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			return ks
		}
		pending := keys(`SELECT idempotency_key FROM idempotency_keys WHERE status = 'pending' ORDER BY 1`)
		named := keys(`SELECT idempotency_key FROM pending_keys ORDER BY 1`)
		if !slices.Equal(pending, named) {
			t.Fatalf("%s: pending rows %v, pending_keys names %v", step, pending, named)
		}
	}

	// Claimed: named.
	a := b.claim(t, "w1", req("m_1", "a", 1000))
	c := b.claim(t, "w1", req("m_1", "c", 1000))
	f := b.claim(t, "w1", req("m_1", "f", 1000))
	check("claimed")

	// Failed (provably not charged): no longer pending.
	if st, err := b.store.Fail(b.ctx, *f.Lease, "429"); err != nil || st != ledger.StatusFailed {
		t.Fatalf("fail: %v %v", st, err)
	}
	check("failed")

	// Re-acquired from failed: pending again.
	f = b.claim(t, "w2", req("m_1", "f", 1000))
	if f.Outcome != ledger.Reacquired {
		t.Fatalf("re-claim of a failed key: %v", f.Outcome)
	}
	check("re-acquired")

	// Released (unknown outcome), then failed again: maybe charged, so it
	// stays pending, and named.
	if err := b.store.Release(b.ctx, *f.Lease, "timeout"); err != nil {
		t.Fatal(err)
	}
	f = b.claim(t, "w3", req("m_1", "f", 1000))
	if f.Outcome != ledger.Reacquired {
		t.Fatalf("re-claim of a released key: %v", f.Outcome)
	}
	if st, err := b.store.Fail(b.ctx, *f.Lease, "429"); err != nil || st != ledger.StatusPending {
		t.Fatalf("fail of a maybe-charged key: %v %v, want it pending", st, err)
	}
	check("failed while maybe charged")

	// Completed: gone.
	if err := b.store.Complete(b.ctx, *a.Lease, charged("pi_a")); err != nil {
		t.Fatal(err)
	}
	check("completed")

	// The reconciler finds both stuck keys once their leases are long
	// expired, and a lookup proving nothing was charged takes one out.
	b.clock.Advance(time.Hour)
	stuck, err := b.store.AcquireStuck(b.ctx, "rec", time.Minute, lease, 10)
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, s := range stuck {
		found = append(found, s.Record.IdempotencyKey)
	}
	slices.Sort(found)
	if !slices.Equal(found, []string{"c", "f"}) {
		t.Fatalf("reconciler found %v stuck, want [c f]", found)
	}
	for _, s := range stuck {
		if s.Record.IdempotencyKey == "f" {
			if err := b.store.ResolveNotCharged(b.ctx, s.Lease, "lookup: nothing"); err != nil {
				t.Fatal(err)
			}
		}
	}
	check("resolved not charged")
	_ = c
}

// TestClaimToleratesStrayPendingName checks that a name in pending_keys
// whose key has no row (which no statement of the store leaves behind, but
// an operator or a future bug might) does not fail the claim of that key:
// the claim names a new key with a plain INSERT guarded by NOT EXISTS, not
// ON CONFLICT, and a unique violation there would fail the whole batch, on
// every redelivery, for the other payments in it too.
func TestClaimToleratesStrayPendingName(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO pending_keys (merchant_id, idempotency_key) VALUES ('m_1', 'stray')`); err != nil {
		t.Fatal(err)
	}
	res, err := b.store.ClaimBatch(b.ctx, "w1", lease, []ledger.ClaimRequest{req("m_1", "stray", 1000), req("m_1", "other", 1000)})
	if err != nil {
		t.Fatalf("claim with a stray pending name: %v", err)
	}
	for i, r := range res {
		if r.Outcome != ledger.Claimed {
			t.Fatalf("request %d: %v, want claimed", i, r.Outcome)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM pending_keys p JOIN idempotency_keys k USING (merchant_id, idempotency_key)
		WHERE k.status = 'pending'`); n != 2 {
		t.Fatalf("%d pending keys named, want 2", n)
	}
}
