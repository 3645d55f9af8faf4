package dedup_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
)

// tableScans reads, through pool's own backend, how many rows of the
// keys, ledger and pending tables were read by sequential scans and
// through indexes.
func tableScans(t *testing.T, ctx context.Context, pool *pgxpool.Pool) map[string][2]int64 {
	t.Helper()
	return testenv.TableReads(t, ctx, pool, "idempotency_keys", "payments", "pending_keys")
}

// TestHotPathReadsBoundedByBatch checks that the claim and the group commit
// read rows in proportion to their batch, not to the tables: no sequential
// scan, no walk of a partial index, whatever the planner would have chosen
// for a young table with stale statistics, and for small batches (whose
// generic plan once scanned every finished key).
func TestHotPathReadsBoundedByBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// One connection, so the counters flushed are the store's own.
	pool, _ := testenv.OneConn(t, b.pool)
	store, err := dedup.New(pool, dedup.Config{Clock: b.clock})
	if err != nil {
		t.Fatal(err)
	}

	// 10,000 finished keys and their ledger rows, then batches of new keys,
	// of keys already completed, and of a mix; of 200 keys, and of 30 (small
	// enough that a generic plan would be tempting).
	const existing = 10000
	claimAndComplete(t, b.ctx, store, 0, existing)
	next := existing
	for round := range 12 {
		size := 200
		if round%3 == 2 {
			size = 30
		}
		first := next
		if round%2 == 1 {
			first = round * 797 % existing // completed duplicates
		} else {
			next += size
		}
		before := tableScans(t, b.ctx, pool)
		claimAndComplete(t, b.ctx, store, first, size)
		after := tableScans(t, b.ctx, pool)
		for _, table := range []string{"idempotency_keys", "payments", "pending_keys"} {
			seq := after[table][0] - before[table][0]
			idx := after[table][1] - before[table][1]
			if seq != 0 || idx > int64(8*size) {
				t.Errorf("round %d: %s: %d rows read by sequential scans and %d through indexes for a batch of %d",
					round, table, seq, idx, size)
			}
		}
	}

	// Reading a batch of keys back (the gateway, status) probes each too.
	refs := make([]ledger.KeyRef, 200)
	for i := range refs {
		refs[i] = ledger.KeyRef{MerchantID: "m_1", IdempotencyKey: fmt.Sprintf("k-%d", i*41)}
	}
	before := tableScans(t, b.ctx, pool)
	if recs, err := store.GetMany(b.ctx, refs); err != nil || len(recs) != len(refs) {
		t.Fatalf("get many: %d records, %v", len(recs), err)
	}
	after := tableScans(t, b.ctx, pool)
	if seq, idx := after["idempotency_keys"][0]-before["idempotency_keys"][0], after["idempotency_keys"][1]-before["idempotency_keys"][1]; seq != 0 || idx > 8*200 {
		t.Errorf("get many: %d rows read by sequential scans and %d through indexes for 200 keys", seq, idx)
	}

	// So does reading their ledger rows (the gateway, the audit).
	before = tableScans(t, b.ctx, pool)
	if pays, err := store.PaymentsFor(b.ctx, refs); err != nil || len(pays) != len(refs) {
		t.Fatalf("payments for: %d ledger rows, %v", len(pays), err)
	}
	after = tableScans(t, b.ctx, pool)
	if seq, idx := after["payments"][0]-before["payments"][0], after["payments"][1]-before["payments"][1]; seq != 0 || idx > 8*200 {
		t.Errorf("payments for: %d rows read by sequential scans and %d through indexes for 200 keys", seq, idx)
	}

	// Re-acquiring failed keys takes the claim's update path.
	var failed []ledger.ClaimRequest
	for i := range 100 {
		failed = append(failed, req("m_1", fmt.Sprintf("f-%d", i), 1000))
	}
	res, err := store.ClaimBatch(b.ctx, "plan", lease, failed)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if _, err := store.Fail(b.ctx, *r.Lease, "429"); err != nil {
			t.Fatal(err)
		}
	}
	before = tableScans(t, b.ctx, pool)
	res, err = store.ClaimBatch(b.ctx, "plan", lease, failed)
	if err != nil {
		t.Fatal(err)
	}
	after = tableScans(t, b.ctx, pool)
	for _, r := range res {
		if r.Outcome != ledger.Reacquired {
			t.Fatalf("re-claim of a failed key: %v, want reacquired", r.Outcome)
		}
	}
	for _, table := range []string{"idempotency_keys", "payments", "pending_keys"} {
		if seq, idx := after[table][0]-before[table][0], after[table][1]-before[table][1]; seq != 0 || idx > 8*100 {
			t.Errorf("re-acquire: %s: %d rows read by sequential scans and %d through indexes for a batch of 100", table, seq, idx)
		}
	}
}

// claimAndComplete claims keys k-first..k-(first+n-1) in batches of at most
// 500 and completes those it claimed in one group commit per batch.
func claimAndComplete(t *testing.T, ctx context.Context, store *dedup.Store, first, n int) {
	t.Helper()
	for lo := first; lo < first+n; lo += 500 {
		hi := min(lo+500, first+n)
		reqs := make([]ledger.ClaimRequest, 0, hi-lo)
		for i := lo; i < hi; i++ {
			reqs = append(reqs, req("m_1", fmt.Sprintf("k-%d", i), 1000))
		}
		res, err := store.ClaimBatch(ctx, "plan", lease, reqs)
		if err != nil {
			t.Fatal(err)
		}
		var items []ledger.CompleteItem
		for i, r := range res {
			if r.Lease != nil {
				items = append(items, ledger.CompleteItem{Lease: *r.Lease, Completion: charged(fmt.Sprintf("pi_%d", lo+i))})
			}
		}
		if len(items) == 0 {
			continue
		}
		errs, err := store.CompleteBatch(ctx, items)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range errs {
			if e != nil {
				t.Fatal(e)
			}
		}
	}
}
