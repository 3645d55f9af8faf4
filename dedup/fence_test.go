package dedup_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/paydedup/paydedup/ledger"
)

// staleAndLive claims key for "a", lets the lease expire, and has thief
// re-acquire it: it returns the stale lease (attempt 1) and the live one
// (attempt 2). With thief "a" the two leases differ only in their attempt.
func staleAndLive(t *testing.T, b *bundle, key, thief string) (stale, live ledger.Lease) {
	t.Helper()
	r := req("m_1", key, 1000)
	first := b.claim(t, "a", r)
	if first.Outcome != ledger.Claimed {
		t.Fatalf("%s: first claim %v", key, first.Outcome)
	}
	b.clock.Advance(lease + time.Second)
	again := b.claim(t, thief, r)
	if again.Outcome != ledger.Reacquired || again.Lease.Attempt != first.Lease.Attempt+1 {
		t.Fatalf("%s: re-claim by %s: %v attempt %d", key, thief, again.Outcome, again.Lease.Attempt)
	}
	return *first.Lease, *again.Lease
}

// assertHeldBy checks that key is still pending under live, with no ledger row.
func assertHeldBy(t *testing.T, b *bundle, key string, live ledger.Lease) {
	t.Helper()
	rec, err := b.store.Get(b.ctx, "m_1", key)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != ledger.StatusPending || rec.LockedBy != live.Holder || rec.Attempts != live.Attempt {
		t.Errorf("%s: row %s held by %q at attempt %d, want pending held by %q at attempt %d",
			key, rec.Status, rec.LockedBy, rec.Attempts, live.Holder, live.Attempt)
	}
	if n := b.count(t, `SELECT count(*) FROM payments WHERE merchant_id = 'm_1' AND idempotency_key = $1`, key); n != 0 {
		t.Errorf("%s: %d ledger rows written by a stale lease, want 0", key, n)
	}
}

// TestStaleCompleteFencedByAttempt: a completion under an expired lease is
// refused while the row is held by a newer lease, whether the new holder is
// another worker or the same one (then only the attempt tells them apart).
// Nothing is completed and nothing reaches the ledger; the live lease then
// completes, and the stale one stays refused afterwards.
func TestStaleCompleteFencedByAttempt(t *testing.T) {
	t.Parallel()
	for _, thief := range []string{"a", "b"} {
		t.Run("reacquired_by_"+thief, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			stale, live := staleAndLive(t, b, "single", thief)
			if err := b.store.Complete(b.ctx, stale, charged("pi_stale")); !errors.Is(err, ledger.ErrLeaseLost) {
				t.Errorf("stale complete under a live lease: %v, want ErrLeaseLost", err)
			}
			assertHeldBy(t, b, "single", live)
			if _, err := b.store.Heartbeat(b.ctx, stale, lease); !errors.Is(err, ledger.ErrLeaseLost) {
				t.Errorf("stale heartbeat: %v, want ErrLeaseLost", err)
			}
			if _, err := b.store.Fail(b.ctx, stale, "stale"); !errors.Is(err, ledger.ErrLeaseLost) {
				t.Errorf("stale fail: %v, want ErrLeaseLost", err)
			}
			if err := b.store.Release(b.ctx, stale, "stale"); !errors.Is(err, ledger.ErrLeaseLost) {
				t.Errorf("stale release: %v, want ErrLeaseLost", err)
			}
			assertHeldBy(t, b, "single", live)

			if err := b.store.Complete(b.ctx, live, charged("pi_live")); err != nil {
				t.Fatalf("live complete: %v", err)
			}
			// Once completed by the live lease, the stale one is still not
			// told that its own completion went through.
			if err := b.store.Complete(b.ctx, stale, charged("pi_stale")); !errors.Is(err, ledger.ErrLeaseLost) {
				t.Errorf("stale complete after the live one: %v, want ErrLeaseLost", err)
			}
			rec, err := b.store.Get(b.ctx, "m_1", "single")
			if err != nil {
				t.Fatal(err)
			}
			if rec.Status != ledger.StatusCompleted || rec.ChargeID != "pi_live" || rec.Attempts != live.Attempt {
				t.Errorf("row %s charge %q attempt %d, want completed with pi_live at attempt %d", rec.Status, rec.ChargeID, rec.Attempts, live.Attempt)
			}
			if n := b.count(t, `SELECT count(*) FROM payments WHERE charge_id = 'pi_stale'`); n != 0 {
				t.Errorf("%d ledger rows for the stale charge", n)
			}
		})
	}
}

// TestStaleCompleteBatchFenced: the group commit's own statement fences
// stale leases. The batch has no item that would make it fall back to
// completing one by one (no ledger conflict), so the batch statement alone
// decides: the stale items, against rows re-acquired by the same holder and
// by another, are refused and leave the rows to their live leases, while
// the batch's other items complete.
func TestStaleCompleteBatchFenced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	staleSame, liveSame := staleAndLive(t, b, "same", "a")
	staleOther, liveOther := staleAndLive(t, b, "other", "b")
	var items []ledger.CompleteItem
	for i := range 4 {
		l := b.claim(t, "a", req("m_1", fmt.Sprintf("fresh-%d", i), 1000)).Lease
		items = append(items, ledger.CompleteItem{Lease: *l, Completion: charged(fmt.Sprintf("pi_fresh%d", i))})
	}
	items = append(items[:2:2],
		ledger.CompleteItem{Lease: staleSame, Completion: charged("pi_stale_same")},
		items[2],
		ledger.CompleteItem{Lease: staleOther, Completion: charged("pi_stale_other")},
		items[3])
	errs, err := b.store.CompleteBatch(b.ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		stale := items[i].Lease == staleSame || items[i].Lease == staleOther
		switch {
		case stale && !errors.Is(e, ledger.ErrLeaseLost):
			t.Errorf("item %d (stale lease on %s, attempt %d): %v, want ErrLeaseLost", i, items[i].Lease.IdempotencyKey, items[i].Lease.Attempt, e)
		case !stale && e != nil:
			t.Errorf("item %d: %v", i, e)
		}
	}
	assertHeldBy(t, b, "same", liveSame)
	assertHeldBy(t, b, "other", liveOther)
	if n := b.count(t, `SELECT count(*) FROM payments WHERE charge_id LIKE 'pi_fresh%'`); n != 4 {
		t.Errorf("%d ledger rows for the fresh items, want 4", n)
	}

	// The live leases complete through the same batch path.
	errs, err = b.store.CompleteBatch(b.ctx, []ledger.CompleteItem{
		{Lease: liveSame, Completion: charged("pi_live_same")},
		{Lease: liveOther, Completion: charged("pi_live_other")},
	})
	if err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("live batch: %v %v", errs, err)
	}
	if n := b.count(t, `SELECT count(*) FROM payments WHERE charge_id LIKE 'pi_stale%'`); n != 0 {
		t.Errorf("%d ledger rows for stale charges", n)
	}
	if n := b.count(t, `SELECT count(*) FROM payments WHERE charge_id LIKE 'pi_live%'`); n != 2 {
		t.Errorf("%d ledger rows for the live charges, want 2", n)
	}
}
