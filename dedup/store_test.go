package dedup_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/clock"
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

func command(merchant, key string, amount int64) *payment.Command {
	return &payment.Command{MerchantID: merchant, IdempotencyKey: key, Amount: amount, Currency: "usd", PaymentMethod: "pm_card_visa"}
}

func req(merchant, key string, amount int64) ledger.ClaimRequest {
	return ledger.NewClaimRequest(command(merchant, key, amount))
}

func charged(id string) ledger.Completion {
	return ledger.Completion{ChargeID: id, ResponseStatus: 200, Response: json.RawMessage(`{"id":"` + id + `","status":"succeeded","amount":1000}`)}
}

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

func TestClaimRaceOneWinner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := req("m_1", "race", 1000)
	const racers = 50
	results := make([]ledger.ClaimResult, racers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := b.store.Claim(b.ctx, fmt.Sprintf("worker-%d", i), lease, r)
			if err != nil {
				t.Errorf("claim: %v", err)
			}
			results[i] = res
		}()
	}
	close(start)
	wg.Wait()
	claimed, inFlight := 0, 0
	for _, res := range results {
		switch res.Outcome {
		case ledger.Claimed:
			claimed++
		case ledger.InFlight:
			inFlight++
			if res.RetryIn <= 0 {
				t.Errorf("in-flight result without RetryIn")
			}
		default:
			t.Errorf("unexpected outcome %v", res.Outcome)
		}
	}
	if claimed != 1 || inFlight != racers-1 {
		t.Fatalf("claimed=%d in_flight=%d, want 1 and %d", claimed, inFlight, racers-1)
	}
	if n := b.count(t, `SELECT count(*) FROM idempotency_keys`); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
}

func TestLeaseExpiryOneReacquires(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := req("m_1", "expiring", 1000)
	first := b.claim(t, "a", r)
	if first.Outcome != ledger.Claimed || first.Lease.Attempt != 1 || first.Lease.MaybeCharged {
		t.Fatalf("first claim: %+v", first)
	}
	if res := b.claim(t, "b", r); res.Outcome != ledger.InFlight || res.RetryIn != lease {
		t.Fatalf("claim under a live lease: outcome %v retry %v, want in_flight after %v", res.Outcome, res.RetryIn, lease)
	}
	b.clock.Advance(lease + time.Second)

	const racers = 20
	var mu sync.Mutex
	outcomes := map[ledger.Outcome]int{}
	var winner ledger.ClaimResult
	var wg sync.WaitGroup
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := b.store.Claim(b.ctx, fmt.Sprintf("r-%d", i), lease, r)
			if err != nil {
				t.Errorf("claim: %v", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			outcomes[res.Outcome]++
			if res.Outcome == ledger.Reacquired {
				winner = res
			}
		}()
	}
	wg.Wait()
	if outcomes[ledger.Reacquired] != 1 || outcomes[ledger.InFlight] != racers-1 {
		t.Fatalf("outcomes %v, want one reacquired and %d in flight", outcomes, racers-1)
	}
	if winner.Lease.Attempt != 2 || !winner.Lease.MaybeCharged || winner.Lease.ProviderKey != first.Lease.ProviderKey {
		t.Fatalf("winner lease %+v: want attempt 2, maybe charged, the same provider key", winner.Lease)
	}
}

func TestFencing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := req("m_1", "fenced", 1000)
	a := b.claim(t, "a", r).Lease
	b.clock.Advance(lease + time.Second)
	bl := b.claim(t, "b", r)
	if bl.Outcome != ledger.Reacquired {
		t.Fatalf("b: %v, want reacquired", bl.Outcome)
	}

	if _, err := b.store.Heartbeat(b.ctx, *a, lease); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Errorf("stale heartbeat: %v, want ErrLeaseLost", err)
	}
	if err := b.store.Complete(b.ctx, *a, charged("pi_stale")); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Errorf("stale complete: %v, want ErrLeaseLost", err)
	}
	if _, err := b.store.Fail(b.ctx, *a, "stale"); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Errorf("stale fail: %v, want ErrLeaseLost", err)
	}
	if err := b.store.Release(b.ctx, *a, "stale"); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Errorf("stale release: %v, want ErrLeaseLost", err)
	}
	if _, err := b.store.Heartbeat(b.ctx, *bl.Lease, lease); err != nil {
		t.Fatalf("current holder's heartbeat: %v", err)
	}
	if err := b.store.Complete(b.ctx, *bl.Lease, charged("pi_b")); err != nil {
		t.Fatalf("current holder's complete: %v", err)
	}
	// Completing again with the same lease is a no-op; the stale one still fails.
	if err := b.store.Complete(b.ctx, *bl.Lease, charged("pi_b")); err != nil {
		t.Fatalf("repeated complete: %v", err)
	}
	if err := b.store.Complete(b.ctx, *a, charged("pi_stale")); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Errorf("stale complete after b completed: %v, want ErrLeaseLost", err)
	}
	rec, err := b.store.Get(b.ctx, "m_1", "fenced")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != ledger.StatusCompleted || rec.ChargeID != "pi_b" || rec.LockedBy != "b" {
		t.Fatalf("record %+v: want completed by b with pi_b", rec)
	}
	if n := b.count(t, `SELECT count(*) FROM payments WHERE merchant_id = 'm_1' AND idempotency_key = 'fenced' AND charge_id = 'pi_b'`); n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
}

func TestMismatchLeavesRowUntouched(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := b.claim(t, "a", req("m_1", "k", 1000)).Lease
	before, _ := b.store.Get(b.ctx, "m_1", "k")
	res := b.claim(t, "b", req("m_1", "k", 2000))
	if res.Outcome != ledger.Mismatch {
		t.Fatalf("outcome %v, want mismatch", res.Outcome)
	}
	after, _ := b.store.Get(b.ctx, "m_1", "k")
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatalf("mismatch changed the row:\n%+v\n%+v", before, after)
	}
	// A mismatch is reported for a completed row too, never a duplicate.
	if err := b.store.Complete(b.ctx, *l, charged("pi_1")); err != nil {
		t.Fatal(err)
	}
	if res := b.claim(t, "b", req("m_1", "k", 2000)); res.Outcome != ledger.Mismatch {
		t.Fatalf("outcome on completed row %v, want mismatch", res.Outcome)
	}
}

func TestDuplicateReturnsStoredResponse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := req("m_1", "done", 1000)
	l := b.claim(t, "a", r).Lease
	resp := json.RawMessage(`{"id":"pi_9","object":"payment_intent","status":"succeeded","amount":1000,"metadata":{"order":"42"}}`)
	if err := b.store.Complete(b.ctx, *l, ledger.Completion{ChargeID: "pi_9", ResponseStatus: 200, Response: resp}); err != nil {
		t.Fatal(err)
	}
	res := b.claim(t, "b", r)
	if res.Outcome != ledger.Duplicate || res.Record.ResponseStatus != 200 || res.Record.ChargeID != "pi_9" {
		t.Fatalf("duplicate: %+v", res)
	}
	var want, got any
	_ = json.Unmarshal(resp, &want)
	if err := json.Unmarshal(res.Record.Response, &got); err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("stored response %s, want %s", res.Record.Response, resp)
	}
}

func TestFailedIsReacquirable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := req("m_1", "retry", 1000)
	l := b.claim(t, "a", r).Lease
	st, err := b.store.Fail(b.ctx, *l, "429 rate limited")
	if err != nil || st != ledger.StatusFailed {
		t.Fatalf("fail: %v %v", st, err)
	}
	res := b.claim(t, "b", r)
	if res.Outcome != ledger.Reacquired || res.Lease.Attempt != 2 || res.Lease.MaybeCharged {
		t.Fatalf("re-acquire failed row: %+v", res)
	}
}

func TestFailAfterPossibleChargeStaysPending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := req("m_1", "maybe", 1000)
	b.claim(t, "a", r) // a calls the provider and crashes
	b.clock.Advance(lease + time.Second)
	l := b.claim(t, "b", r).Lease
	if !l.MaybeCharged {
		t.Fatal("a row taken over from a crashed holder must be maybe_charged")
	}
	st, err := b.store.Fail(b.ctx, *l, "429 rate limited")
	if err != nil || st != ledger.StatusPending {
		t.Fatalf("fail of a maybe-charged row: %v %v, want pending", st, err)
	}
	// Its lease is released: the next delivery may re-call with the same key.
	if res := b.claim(t, "c", r); res.Outcome != ledger.Reacquired || res.Lease.Attempt != 3 {
		t.Fatalf("claim after release: %+v", res)
	}
}

func TestReleaseAndKeyWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := req("m_1", "window", 1000)
	l := b.claim(t, "a", r).Lease
	if err := b.store.Release(b.ctx, *l, "timeout: outcome unknown"); err != nil {
		t.Fatal(err)
	}
	res := b.claim(t, "b", r)
	if res.Outcome != ledger.Reacquired || !res.Lease.MaybeCharged {
		t.Fatalf("after release: %+v", res)
	}
	if err := b.store.Release(b.ctx, *res.Lease, "timeout again"); err != nil {
		t.Fatal(err)
	}
	// Past the provider's key window a blind re-call could charge twice.
	b.clock.Advance(ledger.DefaultProviderKeyWindow)
	res = b.claim(t, "c", r)
	if res.Outcome != ledger.NeedsLookup || res.RetryIn <= 0 {
		t.Fatalf("past the key window: %+v, want needs_lookup", res)
	}
}

func TestMerchantScoping(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if res := b.claim(t, "a", req("m_1", "shared", 1000)); res.Outcome != ledger.Claimed {
		t.Fatal(res.Outcome)
	}
	if res := b.claim(t, "a", req("m_2", "shared", 1000)); res.Outcome != ledger.Claimed {
		t.Fatalf("second merchant: %v, want claimed", res.Outcome)
	}
	if n := b.count(t, `SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'shared'`); n != 2 {
		t.Fatalf("%d rows, want 2", n)
	}
}

func TestLedgerConflictKeepsKeyPending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l1 := b.claim(t, "a", req("m_1", "k1", 1000)).Lease
	l2 := b.claim(t, "a", req("m_1", "k2", 1000)).Lease
	if err := b.store.Complete(b.ctx, *l1, charged("pi_same")); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Complete(b.ctx, *l2, charged("pi_same")); !errors.Is(err, ledger.ErrLedgerConflict) {
		t.Fatalf("second key with the same charge id: %v, want ErrLedgerConflict", err)
	}
	rec, _ := b.store.Get(b.ctx, "m_1", "k2")
	if rec.Status != ledger.StatusPending {
		t.Fatalf("k2 is %s, want still pending", rec.Status)
	}
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

func TestAcquireStuckDisjoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const rows = 40
	for i := range rows {
		b.claim(t, "crashed", req("m_1", fmt.Sprintf("s-%d", i), 1000))
	}
	if got, err := b.store.AcquireStuck(b.ctx, "rec", time.Minute, lease, 100); err != nil || len(got) != 0 {
		t.Fatalf("live leases acquired: %d %v", len(got), err)
	}
	b.clock.Advance(lease + 2*time.Minute)
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				got, err := b.store.AcquireStuck(b.ctx, fmt.Sprintf("rec-%d", r), time.Minute, lease, 3)
				if err != nil {
					t.Errorf("acquire: %v", err)
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, s := range got {
					seen[s.Lease.IdempotencyKey]++
					if s.Lease.Attempt != 2 || !s.Lease.MaybeCharged {
						t.Errorf("stuck lease %+v", s.Lease)
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(seen) != rows {
		t.Fatalf("acquired %d distinct rows, want %d", len(seen), rows)
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("%s acquired %d times", k, n)
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
