package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/migrations/migrate"

	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
)

// prepare gives a store the same mix of existing rows: completed, failed,
// pending with a live lease, pending with an expired lease.
func prepare(t *testing.T, b *bundle) {
	t.Helper()
	for i := range 100 {
		r := req("m_1", fmt.Sprintf("k-%d", i), 1000)
		l := b.claim(t, "old", r).Lease
		switch i % 4 {
		case 0:
			if err := b.store.Complete(b.ctx, *l, charged(fmt.Sprintf("pi_%d", i))); err != nil {
				t.Fatal(err)
			}
		case 1:
			if _, err := b.store.Fail(b.ctx, *l, "429"); err != nil {
				t.Fatal(err)
			}
		case 2: // left with a live lease, renewed below
		case 3:
			if err := b.store.Release(b.ctx, *l, "crashed"); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestBatchClaimMatchesOneByOne(t *testing.T) {
	t.Parallel()
	batch, single := setup(t), setup(t)
	prepare(t, batch)
	prepare(t, single)

	// 500 requests: keys 0..199 (half of them exist), repeated inside the
	// batch, some with another amount (a different fingerprint).
	rng := rand.New(rand.NewPCG(1, 2))
	reqs := make([]ledger.ClaimRequest, 500)
	for i := range reqs {
		k := rng.IntN(200)
		amount := int64(1000)
		if rng.IntN(10) == 0 {
			amount = 2000
		}
		reqs[i] = req("m_1", fmt.Sprintf("k-%d", k), amount)
	}
	got, err := batch.store.ClaimBatch(batch.ctx, "new", lease, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(reqs) {
		t.Fatalf("%d results for %d requests", len(got), len(reqs))
	}
	counts := map[ledger.Outcome]int{}
	for i, r := range reqs {
		want := single.claim(t, "new", r)
		counts[want.Outcome]++
		if got[i].Outcome != want.Outcome {
			t.Errorf("request %d (%s amount %d): batch %v, one-by-one %v", i, r.IdempotencyKey, r.Amount, got[i].Outcome, want.Outcome)
			continue
		}
		if (got[i].Lease == nil) != (want.Lease == nil) ||
			(got[i].Lease != nil && (got[i].Lease.Attempt != want.Lease.Attempt || got[i].Lease.MaybeCharged != want.Lease.MaybeCharged)) {
			t.Errorf("request %d: batch lease %+v, one-by-one %+v", i, got[i].Lease, want.Lease)
		}
		if got[i].Record.Status != want.Record.Status || got[i].Record.Attempts != want.Record.Attempts {
			t.Errorf("request %d: batch record %s/%d, one-by-one %s/%d", i,
				got[i].Record.Status, got[i].Record.Attempts, want.Record.Status, want.Record.Attempts)
		}
	}
	// The mix must exercise every outcome, or the comparison proves little.
	for _, o := range []ledger.Outcome{ledger.Claimed, ledger.Reacquired, ledger.Duplicate, ledger.InFlight, ledger.Mismatch} {
		if counts[o] == 0 {
			t.Errorf("no %v outcome in the mix: %v", o, counts)
		}
	}
}

func TestBatchClaimRaceAcrossBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Two holders claim overlapping batches in opposite orders at once: no
	// deadlock surfaces, and every key is claimed exactly once.
	var fwd, rev []ledger.ClaimRequest
	for i := range 200 {
		fwd = append(fwd, req("m_1", fmt.Sprintf("x-%d", i), 1000))
	}
	for i := len(fwd) - 1; i >= 0; i-- {
		rev = append(rev, fwd[i])
	}
	type out struct {
		res []ledger.ClaimResult
		err error
	}
	ch := make(chan out, 2)
	for _, batch := range [][]ledger.ClaimRequest{fwd, rev} {
		go func() {
			res, err := b.store.ClaimBatch(b.ctx, fmt.Sprintf("h-%p", &batch), lease, batch)
			ch <- out{res, err}
		}()
	}
	claimed := 0
	for range 2 {
		o := <-ch
		if o.err != nil {
			t.Fatal(o.err)
		}
		for _, r := range o.res {
			switch r.Outcome {
			case ledger.Claimed:
				claimed++
			case ledger.InFlight:
			default:
				t.Errorf("outcome %v", r.Outcome)
			}
		}
	}
	if claimed != 200 {
		t.Fatalf("%d claimed, want 200", claimed)
	}
}

func TestCompleteBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var items []ledger.CompleteItem
	for i := range 10 {
		l := b.claim(t, "a", req("m_1", fmt.Sprintf("c-%d", i), 1000)).Lease
		items = append(items, ledger.CompleteItem{Lease: *l, Completion: charged(fmt.Sprintf("pi_c%d", i))})
	}
	// Item 3's lease is lost to another holder; item 7 repeats item 6's charge
	// id, so the group commit fails on the ledger and falls back per item.
	b.clock.Advance(lease + time.Second)
	if res := b.claim(t, "thief", req("m_1", "c-3", 1000)); res.Outcome != ledger.Reacquired {
		t.Fatal(res.Outcome)
	}
	for i := range items {
		if i != 3 {
			var err error
			if items[i].Lease, err = b.store.Heartbeat(b.ctx, items[i].Lease, lease); err != nil {
				t.Fatal(err)
			}
		}
	}
	items[7].Completion = charged("pi_c6")
	errs, err := b.store.CompleteBatch(b.ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		switch i {
		case 3:
			if !errors.Is(e, ledger.ErrLeaseLost) {
				t.Errorf("item 3: %v, want ErrLeaseLost", e)
			}
		case 7:
			if !errors.Is(e, ledger.ErrLedgerConflict) {
				t.Errorf("item 7: %v, want ErrLedgerConflict", e)
			}
		default:
			if e != nil {
				t.Errorf("item %d: %v", i, e)
			}
		}
	}
	if n := b.count(t, `SELECT count(*) FROM payments`); n != 8 {
		t.Fatalf("%d ledger rows, want 8", n)
	}
	if n := b.count(t, `SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`); n != 8 {
		t.Fatalf("%d completed keys, want 8", n)
	}
}

func TestMigrateUpTwiceAndDown(t *testing.T) {
	t.Parallel()
	u := testenv.PostgresEmptyURL(t)
	ctx := context.Background()
	pool, err := pg.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	m, err := migrate.NewMigrator(ctx, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	applied, err := m.Up(ctx)
	if err != nil || len(applied) == 0 {
		t.Fatalf("first up: %v %v", applied, err)
	}
	again, err := m.Up(ctx)
	if err != nil || len(again) != 0 {
		t.Fatalf("second up applied %v (%v), want nothing", again, err)
	}
	st, err := m.Status(ctx)
	if err != nil || len(st) == 0 || !st[0].Applied {
		t.Fatalf("status %+v %v", st, err)
	}
	for range st { // roll every migration back, newest first
		if _, err := m.Down(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('idempotency_keys') IS NOT NULL`).Scan(&exists); err != nil || exists {
		t.Fatalf("idempotency_keys still exists after down (%v)", err)
	}
}

func TestSchemaRejectsBrokenStates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := b.claim(t, "a", req("m_1", "k", 1000)).Lease
	_ = l
	bad := map[string]string{
		"completed without response": `UPDATE idempotency_keys SET status = 'completed', locked_until = NULL, completed_at = now()`,
		"pending without lease":      `UPDATE idempotency_keys SET locked_until = NULL`,
		"failed with lease":          `UPDATE idempotency_keys SET status = 'failed'`,
		"unknown status":             `UPDATE idempotency_keys SET status = 'done'`,
		"provider key equals ours":   `UPDATE idempotency_keys SET provider_key = idempotency_key`,
	}
	for name, sql := range bad {
		if _, err := b.pool.Exec(b.ctx, sql); err == nil {
			t.Errorf("%s: the schema accepted it", name)
		}
	}
}
