package localpg_test

import (
	"context"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/localpg"
	"github.com/paydedup/paydedup/lab/testenv"
)

// The benches' pollers count only once LedgerIDs reaches their target, so
// it must never be below the ledger's rows, nor below the completed keys:
// with a payment settled, another rolled back, and a key completed.
func TestLedgerIDsBoundTheCounts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u := testenv.PostgresURL(t)
	obs, err := localpg.Observe(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	pool, err := pg.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	counts := func() (ids int64, settled, completed int) {
		t.Helper()
		if ids, err = obs.LedgerIDs(ctx); err != nil {
			t.Fatal(err)
		}
		if settled, err = obs.Settled(ctx); err != nil {
			t.Fatal(err)
		}
		if completed, err = obs.Completed(ctx); err != nil {
			t.Fatal(err)
		}
		return ids, settled, completed
	}
	if ids, settled, completed := counts(); ids != 0 || settled != 0 || completed != 0 {
		t.Fatalf("empty schema: ids %d, settled %d, completed %d; want 0 0 0", ids, settled, completed)
	}

	const ledgerRow = `INSERT INTO payments (merchant_id, idempotency_key, provider_key, charge_id, status, amount, currency, created_at)
		VALUES ('m', $1, 'pk-' || $1, 'ch-' || $1, 'succeeded', 100, 'usd', now())`
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, ledgerRow, "rolled-back"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, ledgerRow, "k1"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (merchant_id, idempotency_key, request_hash, status, provider_key,
			amount, currency, attempts, created_at, updated_at, completed_at, expires_at, key_window_start, response, response_status)
		VALUES ('m', 'k1', decode(repeat('00', 32), 'hex'), 'completed', 'pk-k1', 100, 'usd', 1, now(), now(), now(),
			now() + interval '1 day', now(), '{}', 200)`); err != nil {
		t.Fatal(err)
	}
	ids, settled, completed := counts()
	if settled != 1 || completed != 1 {
		t.Fatalf("settled %d, completed %d; want 1 and 1", settled, completed)
	}
	if ids != 2 {
		t.Fatalf("ledger ids %d, want 2 (the rolled-back insert used one)", ids)
	}
}
