package dedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/storetest"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

const lease = 30 * time.Second

type bundle struct {
	store *dedup.Store
	pool  *pgxpool.Pool
	clock *clock.Fake
	ctx   context.Context
}

func setup(t testing.TB) *bundle {
	t.Helper()
	pool := testenv.Pool(t)
	clk := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	s, err := dedup.New(pool, dedup.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{store: s, pool: pool, clock: clk, ctx: context.Background()}
}

// The fixtures the store's tests share with the conformance suite.
var (
	req     = storetest.Req
	charged = storetest.Charged
)

func (b *bundle) claim(t testing.TB, holder string, r ledger.ClaimRequest) ledger.ClaimResult {
	t.Helper()
	res, err := b.store.Claim(b.ctx, holder, lease, r)
	if err != nil {
		t.Fatalf("claim %s: %v", r.IdempotencyKey, err)
	}
	return res
}

func (b *bundle) count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func TestPurge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	done := b.claim(t, "a", req("m_1", "done", 1000)).Lease
	failed := b.claim(t, "a", req("m_1", "failed", 1000)).Lease
	b.claim(t, "a", req("m_1", "pending", 1000))
	if err := b.store.Complete(b.ctx, *done, charged("pi_1")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Fail(b.ctx, *failed, "429"); err != nil {
		t.Fatal(err)
	}
	if n, err := b.store.Purge(b.ctx, 10); err != nil || n != 0 {
		t.Fatalf("purge before expiry: %d %v, want 0", n, err)
	}
	b.clock.Advance(ledger.DefaultRetention + time.Hour)
	fresh := b.claim(t, "a", req("m_1", "fresh", 1000)).Lease
	if err := b.store.Complete(b.ctx, *fresh, charged("pi_2")); err != nil {
		t.Fatal(err)
	}
	total := 0
	for {
		n, err := b.store.Purge(b.ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		total += n
	}
	if total != 2 {
		t.Fatalf("purged %d, want 2 (the expired completed and failed rows)", total)
	}
	for key, want := range map[string]bool{"done": false, "failed": false, "pending": true, "fresh": true} {
		_, err := b.store.Get(b.ctx, "m_1", key)
		if got := err == nil; got != want {
			t.Errorf("%s present=%v, want %v (err %v)", key, got, want, err)
		}
	}
}

func TestBadInputBeforeSQL(t *testing.T) {
	t.Parallel()
	// A pool on a port where nothing listens: any SQL would fail with
	// ErrUnavailable, so a ValidationError proves validation ran first.
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	long := make([]byte, 256)
	for i := range long {
		long[i] = 'k'
	}
	cases := map[string]ledger.ClaimRequest{
		"empty key":    req("m_1", "", 1000),
		"long key":     req("m_1", string(long), 1000),
		"control key":  req("m_1", "a\x00b", 1000),
		"empty merch":  req("", "k", 1000),
		"bad merchant": req("m.1", "k", 1000),
		"no hash":      {MerchantID: "m_1", IdempotencyKey: "k", Amount: 1, Currency: "usd"},
	}
	for name, r := range cases {
		_, err := s.Claim(context.Background(), "a", lease, r)
		var ve *payment.ValidationError
		if !errors.As(err, &ve) {
			t.Errorf("%s: %v, want a *payment.ValidationError", name, err)
		}
	}
	_, err = s.Claim(context.Background(), "a", lease, req("m_1", "k", 1000))
	if !errors.Is(err, ledger.ErrUnavailable) {
		t.Fatalf("database down: %v, want ErrUnavailable", err)
	}
	if _, err := s.Get(context.Background(), "m_1", "k"); !errors.Is(err, ledger.ErrUnavailable) {
		t.Fatalf("get with database down: %v, want ErrUnavailable", err)
	}
}

func TestLedgerGuardsPurgedKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := req("m_1", "old", 1000)
	l := b.claim(t, "a", r).Lease
	if err := b.store.Complete(b.ctx, *l, charged("pi_old")); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(ledger.DefaultRetention + time.Hour)
	if n, err := b.store.Purge(b.ctx, 10); err != nil || n != 1 {
		t.Fatalf("purge: %d %v", n, err)
	}
	// A very late copy of the message: the key row is gone, the ledger is not.
	res := b.claim(t, "b", r)
	if res.Outcome != ledger.Duplicate || res.Lease != nil || res.Record.ChargeID != "pi_old" {
		t.Fatalf("late copy after purge: %+v, want a duplicate of pi_old", res)
	}
	if _, err := b.store.Get(b.ctx, "m_1", "old"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("the guard must not recreate the key row: %v", err)
	}
	// In a batch, beside a new key, the same.
	got, err := b.store.ClaimBatch(b.ctx, "b", lease, []ledger.ClaimRequest{r, req("m_1", "new", 1000)})
	if err != nil || got[0].Outcome != ledger.Duplicate || got[1].Outcome != ledger.Claimed {
		t.Fatalf("batch: %v %v %v", got[0].Outcome, got[1].Outcome, err)
	}
}
