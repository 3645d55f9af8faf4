// Package storetest is the conformance suite of the worker's store: the
// contract every implementation of consumer.Store keeps, written in the
// ledger's words and run against a real implementation by its own tests
// (dedup runs it against PostgreSQL). It checks a key's life through the
// store (claim, duplicate, in flight, a reused key, reacquire after a
// lease expires), the fences (a stale lease's writes are refused with
// ledger.ErrLeaseLost), the batch claim matching one-by-one claims, the
// provider key window, stuck rows, the ledger row written with a
// completion, and the races: concurrent claims of one key have exactly one
// winner, concurrent completions under a live and a stale lease record one
// outcome. (River's riverdrivertest and Watermill's tests.TestPubSub play
// the same part.)
//
// It is lab code, for tests only; nothing that ships imports it.
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// Store is what the suite needs of an implementation: the worker's store
// (consumer.Store), the single claim, the reconciler's AcquireStuck and
// ResolveNotCharged, and the two reads the suite checks the effects with.
type Store interface {
	consumer.Store
	Claim(ctx context.Context, holder string, lease time.Duration, req ledger.ClaimRequest) (ledger.ClaimResult, error)
	AcquireStuck(ctx context.Context, holder string, grace, lease time.Duration, limit int) ([]ledger.Stuck, error)
	ResolveNotCharged(ctx context.Context, l ledger.Lease, reason string) error
	// Get returns a key's record, or ledger.ErrNotFound.
	Get(ctx context.Context, merchantID, key string) (ledger.Record, error)
	// GetPayment returns a key's ledger row, or ledger.ErrNotFound.
	GetPayment(ctx context.Context, merchantID, key string) (ledger.Payment, error)
}

// NewStore returns a new, empty store whose clock is clk: the suite moves
// clk to expire leases and to pass the provider key window. Each call must
// return a store that shares no rows with any other.
type NewStore func(t *testing.T, clk *clock.Fake) Store

// Lease is the lease every claim of the suite asks for.
const Lease = 30 * time.Second

// epoch is the time the suite's clocks start at.
var epoch = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// Run runs the suite against the stores newStore returns, each check in
// its own parallel subtest with its own store.
func Run(t *testing.T, newStore NewStore) {
	t.Helper()
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, newStore)
		})
	}
}

var checks = []struct {
	name string
	run  func(t *testing.T, newStore NewStore)
}{
	{"ClaimNewKey", testClaimNewKey},
	{"ClaimRaceOneWinner", testClaimRaceOneWinner},
	{"LeaseExpiryOneReacquires", testLeaseExpiryOneReacquires},
	{"Fencing", testFencing},
	{"StaleCompleteFencedByAttempt", testStaleCompleteFencedByAttempt},
	{"StaleCompleteBatchFenced", testStaleCompleteBatchFenced},
	{"CompleteRaceOneOutcome", testCompleteRaceOneOutcome},
	{"MismatchLeavesRowUntouched", testMismatchLeavesRowUntouched},
	{"DuplicateReturnsStoredResponse", testDuplicateReturnsStoredResponse},
	{"FailedIsReacquirable", testFailedIsReacquirable},
	{"FailAfterPossibleChargeStaysPending", testFailAfterPossibleChargeStaysPending},
	{"ReleaseAndKeyWindow", testReleaseAndKeyWindow},
	{"FailedRowPastKeyWindowNeedsLookup", testFailedRowPastKeyWindowNeedsLookup},
	{"ReacquireOfFailedKeepsKeyWindow", testReacquireOfFailedKeepsKeyWindow},
	{"MerchantScoping", testMerchantScoping},
	{"LedgerRowWithCompletion", testLedgerRowWithCompletion},
	{"LedgerConflictKeepsKeyPending", testLedgerConflictKeepsKeyPending},
	{"BatchClaimMatchesOneByOne", testBatchClaimMatchesOneByOne},
	{"BatchClaimRaceAcrossBatches", testBatchClaimRaceAcrossBatches},
	{"CompleteBatch", testCompleteBatch},
	{"AcquireStuckDisjoint", testAcquireStuckDisjoint},
	{"RefusalOncePerMessageBindsNoKey", testRefusalOncePerMessageBindsNoKey},
}

// bundle is one check's store, clock and context.
type bundle struct {
	store Store
	clock *clock.Fake
	ctx   context.Context
}

func setup(t *testing.T, newStore NewStore) *bundle {
	t.Helper()
	clk := clock.NewFake(epoch)
	return &bundle{store: newStore(t, clk), clock: clk, ctx: context.Background()}
}

// Command is a valid card payment of amount (US cents) for (merchant, key).
func Command(merchant, key string, amount int64) *payment.Command {
	return &payment.Command{MerchantID: merchant, IdempotencyKey: key, Amount: amount, Currency: "usd", PaymentMethod: "pm_card_visa"}
}

// Req is the claim request of Command(merchant, key, amount); amount sets
// its fingerprint apart from another payment's under the same key.
func Req(merchant, key string, amount int64) ledger.ClaimRequest {
	return ledger.NewClaimRequest(Command(merchant, key, amount))
}

// Charged is the completion of a successful charge id.
func Charged(id string) ledger.Completion {
	return ledger.Completion{ChargeID: id, ResponseStatus: 200, Response: json.RawMessage(`{"id":"` + id + `","status":"succeeded","amount":1000}`)}
}

func (b *bundle) claim(t *testing.T, holder string, r ledger.ClaimRequest) ledger.ClaimResult {
	t.Helper()
	res, err := b.store.Claim(b.ctx, holder, Lease, r)
	if err != nil {
		t.Fatalf("claim %s: %v", r.IdempotencyKey, err)
	}
	return res
}

func (b *bundle) get(t *testing.T, merchant, key string) ledger.Record {
	t.Helper()
	rec, err := b.store.Get(b.ctx, merchant, key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return rec
}

// noPayment fails the test if key has a ledger row.
func (b *bundle) noPayment(t *testing.T, merchant, key string) {
	t.Helper()
	if p, err := b.store.GetPayment(b.ctx, merchant, key); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("%s: ledger row %+v (%v), want none (ErrNotFound)", key, p, err)
	}
}

// payment returns key's ledger row, failing the test if there is none.
func (b *bundle) payment(t *testing.T, merchant, key string) ledger.Payment {
	t.Helper()
	p, err := b.store.GetPayment(b.ctx, merchant, key)
	if err != nil {
		t.Fatalf("%s: ledger row: %v", key, err)
	}
	return p
}

// staleAndLive claims key for "a", lets the lease expire, and has thief
// reacquire it: it returns the stale lease (attempt 1) and the live one.
func (b *bundle) staleAndLive(t *testing.T, key, thief string) (stale, live ledger.Lease) {
	t.Helper()
	r := Req("m_1", key, 1000)
	first := b.claim(t, "a", r)
	if first.Outcome != ledger.Claimed {
		t.Fatalf("%s: first claim %v", key, first.Outcome)
	}
	b.clock.Advance(Lease + time.Second)
	again := b.claim(t, thief, r)
	if again.Outcome != ledger.Reacquired || again.Lease.Attempt != first.Lease.Attempt+1 {
		t.Fatalf("%s: reclaim by %s: %v attempt %d", key, thief, again.Outcome, again.Lease.Attempt)
	}
	return *first.Lease, *again.Lease
}

// heldBy checks that key is still pending under live, with no ledger row.
func (b *bundle) heldBy(t *testing.T, key string, live ledger.Lease) {
	t.Helper()
	rec := b.get(t, "m_1", key)
	if rec.Status != ledger.StatusPending || rec.LockedBy != live.Holder || rec.Attempts != live.Attempt {
		t.Errorf("%s: row %s held by %q at attempt %d, want pending held by %q at attempt %d",
			key, rec.Status, rec.LockedBy, rec.Attempts, live.Holder, live.Attempt)
	}
	b.noPayment(t, "m_1", key)
}

func testClaimNewKey(t *testing.T, newStore NewStore) {
	b := setup(t, newStore)
	if _, err := b.store.Get(b.ctx, "m_1", "new"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("get of an unknown key: %v, want ErrNotFound", err)
	}
	res := b.claim(t, "a", Req("m_1", "new", 1000))
	if res.Outcome != ledger.Claimed || res.Lease == nil {
		t.Fatalf("first claim: %+v, want claimed with a lease", res)
	}
	l := res.Lease
	if l.Holder != "a" || l.Attempt != 1 || l.MaybeCharged || l.MerchantID != "m_1" || l.IdempotencyKey != "new" {
		t.Errorf("lease %+v: want holder a, attempt 1, not maybe charged, for m_1/new", l)
	}
	if want := ledger.ProviderKey("m_1", "new"); l.ProviderKey != want {
		t.Errorf("provider key %q, want %q", l.ProviderKey, want)
	}
	if !l.Until.Equal(epoch.Add(Lease)) {
		t.Errorf("lease until %v, want the clock + the lease, %v", l.Until, epoch.Add(Lease))
	}
	rec := b.get(t, "m_1", "new")
	if rec.Status != ledger.StatusPending || rec.LockedBy != "a" || rec.Attempts != 1 || rec.ProviderKey != l.ProviderKey ||
		rec.Amount != 1000 || rec.Currency != "usd" || rec.MaybeCharged {
		t.Errorf("record %+v: want pending, held by a at attempt 1", rec)
	}
	b.noPayment(t, "m_1", "new")
}

func testClaimRaceOneWinner(t *testing.T, newStore NewStore) {
	b := setup(t, newStore)
	r := Req("m_1", "race", 1000)
	const racers = 50
	results := make([]ledger.ClaimResult, racers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := b.store.Claim(b.ctx, fmt.Sprintf("worker-%d", i), Lease, r)
			if err != nil {
				t.Errorf("claim: %v", err)
			}
			results[i] = res
		}()
	}
	close(start)
	wg.Wait()
	claimed, inFlight, winner := 0, 0, ""
	for i, res := range results {
		switch res.Outcome {
		case ledger.Claimed:
			claimed++
			winner = fmt.Sprintf("worker-%d", i)
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
	if rec := b.get(t, "m_1", "race"); rec.LockedBy != winner || rec.Attempts != 1 {
		t.Fatalf("row held by %q at attempt %d, want the winner %q at attempt 1", rec.LockedBy, rec.Attempts, winner)
	}
}

func testLeaseExpiryOneReacquires(t *testing.T, newStore NewStore) {
	b := setup(t, newStore)
	r := Req("m_1", "expiring", 1000)
	first := b.claim(t, "a", r)
	if first.Outcome != ledger.Claimed || first.Lease.Attempt != 1 || first.Lease.MaybeCharged {
		t.Fatalf("first claim: %+v", first)
	}
	if res := b.claim(t, "b", r); res.Outcome != ledger.InFlight || res.RetryIn != Lease || res.Lease != nil {
		t.Fatalf("claim under a live lease: outcome %v retry %v lease %v, want in_flight after %v, no lease", res.Outcome, res.RetryIn, res.Lease, Lease)
	}
	b.clock.Advance(Lease + time.Second)

	const racers = 20
	var mu sync.Mutex
	outcomes := map[ledger.Outcome]int{}
	var winner ledger.ClaimResult
	var wg sync.WaitGroup
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := b.store.Claim(b.ctx, fmt.Sprintf("r-%d", i), Lease, r)
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

func testFencing(t *testing.T, newStore NewStore) {
	b := setup(t, newStore)
	a, live := b.staleAndLive(t, "fenced", "b")
	if _, err := b.store.Heartbeat(b.ctx, a, Lease); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Errorf("stale heartbeat: %v, want ErrLeaseLost", err)
	}
	if err := b.store.Complete(b.ctx, a, Charged("pi_stale")); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Errorf("stale complete: %v, want ErrLeaseLost", err)
	}
	if _, err := b.store.Fail(b.ctx, a, "stale"); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Errorf("stale fail: %v, want ErrLeaseLost", err)
	}
	if err := b.store.Release(b.ctx, a, "stale"); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Errorf("stale release: %v, want ErrLeaseLost", err)
	}
	b.noPayment(t, "m_1", "fenced")
	if rec := b.get(t, "m_1", "fenced"); rec.Status != ledger.StatusPending || rec.LockedBy != "b" || rec.Attempts != 2 {
		t.Fatalf("after the stale writes: %s held by %q at %d, want pending held by b at 2", rec.Status, rec.LockedBy, rec.Attempts)
	}
	if _, err := b.store.Heartbeat(b.ctx, live, Lease); err != nil {
		t.Fatalf("current holder's heartbeat: %v", err)
	}
	if err := b.store.Complete(b.ctx, live, Charged("pi_b")); err != nil {
		t.Fatalf("current holder's complete: %v", err)
	}
	// Completing again with the same lease is a no-op; the stale one still fails.
	if err := b.store.Complete(b.ctx, live, Charged("pi_b")); err != nil {
		t.Fatalf("repeated complete: %v", err)
	}
	if err := b.store.Complete(b.ctx, a, Charged("pi_stale")); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Errorf("stale complete after b completed: %v, want ErrLeaseLost", err)
	}
	if _, err := b.store.Fail(b.ctx, live, "late"); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Errorf("fail after complete: %v, want ErrLeaseLost", err)
	}
	if err := b.store.Release(b.ctx, live, "late"); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Errorf("release after complete: %v, want ErrLeaseLost", err)
	}
	rec := b.get(t, "m_1", "fenced")
	if rec.Status != ledger.StatusCompleted || rec.ChargeID != "pi_b" || rec.LockedBy != "b" {
		t.Fatalf("record %+v: want completed by b with pi_b", rec)
	}
	if p := b.payment(t, "m_1", "fenced"); p.ChargeID != "pi_b" {
		t.Fatalf("ledger row %+v, want pi_b", p)
	}
}

// testCompleteRaceOneOutcome races completions of one key: under the live
// lease (the same completion, as a retried commit sends it) and under the
// stale one at once. Every stale completion is refused, the live ones all
// succeed, and the key and the ledger hold the live outcome once.
func testCompleteRaceOneOutcome(t *testing.T, newStore NewStore) {
	b := setup(t, newStore)
	stale, live := b.staleAndLive(t, "both", "b")
	const racers = 10
	errs := make([]error, 2*racers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 2 * racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if i%2 == 0 {
				errs[i] = b.store.Complete(b.ctx, live, Charged("pi_live"))
			} else {
				errs[i] = b.store.Complete(b.ctx, stale, Charged("pi_stale"))
			}
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if i%2 == 0 && err != nil {
			t.Errorf("live complete %d: %v", i, err)
		}
		if i%2 == 1 && !errors.Is(err, ledger.ErrLeaseLost) {
			t.Errorf("stale complete %d: %v, want ErrLeaseLost", i, err)
		}
	}
	if rec := b.get(t, "m_1", "both"); rec.Status != ledger.StatusCompleted || rec.ChargeID != "pi_live" {
		t.Fatalf("record %s %q, want completed with pi_live", rec.Status, rec.ChargeID)
	}
	if p := b.payment(t, "m_1", "both"); p.ChargeID != "pi_live" || p.Status != ledger.PaymentSucceeded {
		t.Fatalf("ledger row %+v, want pi_live succeeded", p)
	}
}

// testStaleCompleteFencedByAttempt: a completion under an expired lease is
// refused while the row is held by a newer lease, whether the new holder is
// another worker or the same one (then only the attempt tells them apart).
// Nothing is completed and nothing reaches the ledger; the live lease then
// completes, and the stale one stays refused afterwards.
func testStaleCompleteFencedByAttempt(t *testing.T, newStore NewStore) {
	for _, thief := range []string{"a", "b"} {
		t.Run("reacquired_by_"+thief, func(t *testing.T) {
			t.Parallel()
			b := setup(t, newStore)
			stale, live := b.staleAndLive(t, "single", thief)
			if err := b.store.Complete(b.ctx, stale, Charged("pi_stale")); !errors.Is(err, ledger.ErrLeaseLost) {
				t.Errorf("stale complete under a live lease: %v, want ErrLeaseLost", err)
			}
			b.heldBy(t, "single", live)
			if _, err := b.store.Heartbeat(b.ctx, stale, Lease); !errors.Is(err, ledger.ErrLeaseLost) {
				t.Errorf("stale heartbeat: %v, want ErrLeaseLost", err)
			}
			if _, err := b.store.Fail(b.ctx, stale, "stale"); !errors.Is(err, ledger.ErrLeaseLost) {
				t.Errorf("stale fail: %v, want ErrLeaseLost", err)
			}
			if err := b.store.Release(b.ctx, stale, "stale"); !errors.Is(err, ledger.ErrLeaseLost) {
				t.Errorf("stale release: %v, want ErrLeaseLost", err)
			}
			b.heldBy(t, "single", live)

			if err := b.store.Complete(b.ctx, live, Charged("pi_live")); err != nil {
				t.Fatalf("live complete: %v", err)
			}
			// Once completed by the live lease, the stale one is still not
			// told that its own completion went through.
			if err := b.store.Complete(b.ctx, stale, Charged("pi_stale")); !errors.Is(err, ledger.ErrLeaseLost) {
				t.Errorf("stale complete after the live one: %v, want ErrLeaseLost", err)
			}
			rec := b.get(t, "m_1", "single")
			if rec.Status != ledger.StatusCompleted || rec.ChargeID != "pi_live" || rec.Attempts != live.Attempt {
				t.Errorf("row %s charge %q attempt %d, want completed with pi_live at attempt %d", rec.Status, rec.ChargeID, rec.Attempts, live.Attempt)
			}
			if p := b.payment(t, "m_1", "single"); p.ChargeID != "pi_live" {
				t.Errorf("ledger row %+v, want pi_live", p)
			}
		})
	}
}

// testStaleCompleteBatchFenced: the group commit fences stale leases by
// itself. The batch has no item that would make it fall back to
// completing one by one (no ledger conflict): the stale items, against rows
// reacquired by the same holder and by another, are refused and leave the
// rows to their live leases, while the batch's other items complete.
func testStaleCompleteBatchFenced(t *testing.T, newStore NewStore) {
	b := setup(t, newStore)
	staleSame, liveSame := b.staleAndLive(t, "same", "a")
	staleOther, liveOther := b.staleAndLive(t, "other", "b")
	var items []ledger.CompleteItem
	for i := range 4 {
		l := b.claim(t, "a", Req("m_1", fmt.Sprintf("fresh-%d", i), 1000)).Lease
		items = append(items, ledger.CompleteItem{Lease: *l, Completion: Charged(fmt.Sprintf("pi_fresh%d", i))})
	}
	items = append(items[:2:2],
		ledger.CompleteItem{Lease: staleSame, Completion: Charged("pi_stale_same")},
		items[2],
		ledger.CompleteItem{Lease: staleOther, Completion: Charged("pi_stale_other")},
		items[3])
	errs, err := b.store.CompleteBatch(b.ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) != len(items) {
		t.Fatalf("%d results for %d items", len(errs), len(items))
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
	b.heldBy(t, "same", liveSame)
	b.heldBy(t, "other", liveOther)
	for i := range 4 {
		if p := b.payment(t, "m_1", fmt.Sprintf("fresh-%d", i)); p.ChargeID != fmt.Sprintf("pi_fresh%d", i) {
			t.Errorf("fresh-%d: ledger row %+v", i, p)
		}
	}

	// The live leases complete through the same batch path.
	errs, err = b.store.CompleteBatch(b.ctx, []ledger.CompleteItem{
		{Lease: liveSame, Completion: Charged("pi_live_same")},
		{Lease: liveOther, Completion: Charged("pi_live_other")},
	})
	if err != nil || len(errs) != 2 || errs[0] != nil || errs[1] != nil {
		t.Fatalf("live batch: %v %v", errs, err)
	}
	for key, want := range map[string]string{"same": "pi_live_same", "other": "pi_live_other"} {
		if p := b.payment(t, "m_1", key); p.ChargeID != want {
			t.Errorf("%s: ledger row %+v, want %s", key, p, want)
		}
	}
}

func testMismatchLeavesRowUntouched(t *testing.T, newStore NewStore) {
	b := setup(t, newStore)
	l := b.claim(t, "a", Req("m_1", "k", 1000)).Lease
	before := b.get(t, "m_1", "k")
	res := b.claim(t, "b", Req("m_1", "k", 2000))
	if res.Outcome != ledger.Mismatch || res.Lease != nil {
		t.Fatalf("outcome %v lease %v, want mismatch without a lease", res.Outcome, res.Lease)
	}
	if after := b.get(t, "m_1", "k"); fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatalf("mismatch changed the row:\n%+v\n%+v", before, after)
	}
	// A mismatch is reported for a completed row too, never a duplicate.
	if err := b.store.Complete(b.ctx, *l, Charged("pi_1")); err != nil {
		t.Fatal(err)
	}
	if res := b.claim(t, "b", Req("m_1", "k", 2000)); res.Outcome != ledger.Mismatch {
		t.Fatalf("outcome on completed row %v, want mismatch", res.Outcome)
	}
}

func testDuplicateReturnsStoredResponse(t *testing.T, newStore NewStore) {
	b := setup(t, newStore)
	r := Req("m_1", "done", 1000)
	l := b.claim(t, "a", r).Lease
	resp := json.RawMessage(`{"id":"pi_9","object":"payment_intent","status":"succeeded","amount":1000,"metadata":{"order":"42"}}`)
	if err := b.store.Complete(b.ctx, *l, ledger.Completion{ChargeID: "pi_9", ResponseStatus: 200, Response: resp}); err != nil {
		t.Fatal(err)
	}
	for _, holder := range []string{"a", "b"} {
		res := b.claim(t, holder, r)
		if res.Outcome != ledger.Duplicate || res.Lease != nil || res.Record.ResponseStatus != 200 || res.Record.ChargeID != "pi_9" {
			t.Fatalf("claim by %s after complete: %+v, want a duplicate of pi_9 without a lease", holder, res)
		}
		var want, got any
		_ = json.Unmarshal(resp, &want)
		if err := json.Unmarshal(res.Record.Response, &got); err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("stored response %s, want %s", res.Record.Response, resp)
		}
	}
	// Time passing does not reopen a completed key.
	b.clock.Advance(b.store.ProviderKeyWindow() + time.Hour)
	if res := b.claim(t, "c", r); res.Outcome != ledger.Duplicate {
		t.Fatalf("claim a key window later: %v, want duplicate", res.Outcome)
	}
}

func testFailedIsReacquirable(t *testing.T, newStore NewStore) {
	b := setup(t, newStore)
	r := Req("m_1", "retry", 1000)
	l := b.claim(t, "a", r).Lease
	st, err := b.store.Fail(b.ctx, *l, "429 rate limited")
	if err != nil || st != ledger.StatusFailed {
		t.Fatalf("fail: %v %v", st, err)
	}
	if rec := b.get(t, "m_1", "retry"); rec.Status != ledger.StatusFailed || rec.MaybeCharged {
		t.Fatalf("failed row %+v", rec)
	}
	res := b.claim(t, "b", r)
	if res.Outcome != ledger.Reacquired || res.Lease.Attempt != 2 || res.Lease.MaybeCharged || res.Lease.ProviderKey != l.ProviderKey {
		t.Fatalf("reacquire failed row: %+v", res)
	}
	b.noPayment(t, "m_1", "retry")
}

func testFailAfterPossibleChargeStaysPending(t *testing.T, newStore NewStore) {
	b := setup(t, newStore)
	r := Req("m_1", "maybe", 1000)
	b.claim(t, "a", r) // a calls the provider and crashes
	b.clock.Advance(Lease + time.Second)
	l := b.claim(t, "b", r).Lease
	if !l.MaybeCharged {
		t.Fatal("a row taken over from a crashed holder must be maybe_charged")
	}
	st, err := b.store.Fail(b.ctx, *l, "429 rate limited")
	if err != nil || st != ledger.StatusPending {
		t.Fatalf("fail of a maybe-charged row: %v %v, want pending", st, err)
	}
	// Its lease is released: the next delivery may re-call with the same key.
	if res := b.claim(t, "c", r); res.Outcome != ledger.Reacquired || res.Lease.Attempt != 3 || !res.Lease.MaybeCharged {
		t.Fatalf("claim after release: %+v", res)
	}
}

// testReleaseAndKeyWindow: a released row is reacquired at once, maybe
// charged, under the same provider key and key window; past the provider's
// key window it needs a lookup instead (a blind re-call could charge twice).
func testReleaseAndKeyWindow(t *testing.T, newStore NewStore) {
	b := setup(t, newStore)
	r := Req("m_1", "window", 1000)
	l := b.claim(t, "a", r).Lease
	start := b.get(t, "m_1", "window").KeyWindowStart
	if err := b.store.Release(b.ctx, *l, "timeout: outcome unknown"); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Minute)
	res := b.claim(t, "b", r)
	if res.Outcome != ledger.Reacquired || !res.Lease.MaybeCharged || res.Lease.ProviderKey != l.ProviderKey {
		t.Fatalf("after release: %+v, want reacquired, maybe charged, provider key %s", res, l.ProviderKey)
	}
	if rec := b.get(t, "m_1", "window"); !rec.KeyWindowStart.Equal(start) {
		t.Fatalf("key window start %v after a reacquire, want %v kept", rec.KeyWindowStart, start)
	}
	if err := b.store.Release(b.ctx, *res.Lease, "timeout again"); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(b.store.ProviderKeyWindow())
	res = b.claim(t, "c", r)
	if res.Outcome != ledger.NeedsLookup || res.RetryIn <= 0 || res.Lease != nil {
		t.Fatalf("past the key window: %+v, want needs_lookup", res)
	}
	if rec := b.get(t, "m_1", "window"); rec.Status != ledger.StatusPending || rec.Attempts != 2 {
		t.Fatalf("a needs_lookup claim changed the row: %s at attempt %d", rec.Status, rec.Attempts)
	}
}

// testFailedRowPastKeyWindowNeedsLookup: a `failed` row is re-called
// blind only inside the provider's key window. Past it the claim hands it
// out to nobody: it is parked pending (maybe_charged) for a lookup, which
// the reconciler's acquire picks up; a lookup that proves nothing was
// charged starts a fresh window, and only then is the key called again.
func testFailedRowPastKeyWindowNeedsLookup(t *testing.T, newStore NewStore) {
	b := setup(t, newStore)
	r := Req("m_1", "failed-old", 1000)
	l := b.claim(t, "a", r).Lease
	if st, err := b.store.Fail(b.ctx, *l, "429 rate limited"); err != nil || st != ledger.StatusFailed {
		t.Fatalf("fail: %v %v", st, err)
	}
	b.clock.Advance(b.store.ProviderKeyWindow() + time.Minute)

	res := b.claim(t, "b", r)
	if res.Outcome != ledger.NeedsLookup || res.Lease != nil {
		t.Fatalf("failed row past the key window: %v (lease %v), want needs_lookup and no lease", res.Outcome, res.Lease)
	}
	rec := b.get(t, "m_1", "failed-old")
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
	stuck, err := b.store.AcquireStuck(b.ctx, "rec", 0, Lease, 10)
	if err != nil || len(stuck) != 1 || stuck[0].Record.IdempotencyKey != "failed-old" {
		t.Fatalf("reconciler acquire: %+v %v, want the parked row", stuck, err)
	}
	if err := b.store.ResolveNotCharged(b.ctx, stuck[0].Lease, "lookup: nothing under the key"); err != nil {
		t.Fatal(err)
	}
	rec = b.get(t, "m_1", "failed-old")
	if rec.Status != ledger.StatusFailed || !rec.KeyWindowStart.Equal(b.clock.Now()) {
		t.Fatalf("after the lookup: %+v, want failed with a fresh key window", rec)
	}
	if res := b.claim(t, "d", r); res.Outcome != ledger.Reacquired {
		t.Fatalf("after the lookup proved nothing was charged: %v, want reacquired", res.Outcome)
	}
}

// testReacquireOfFailedKeepsKeyWindow: reacquiring a `failed` row does not
// restart its key window; the window counts from the first call under the
// provider key, whatever the row went through since.
func testReacquireOfFailedKeepsKeyWindow(t *testing.T, newStore NewStore) {
	b := setup(t, newStore)
	r := Req("m_1", "failed-twice", 1000)
	l := b.claim(t, "a", r).Lease
	if _, err := b.store.Fail(b.ctx, *l, "429"); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(b.store.ProviderKeyWindow() - time.Hour)
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

func testMerchantScoping(t *testing.T, newStore NewStore) {
	b := setup(t, newStore)
	l1 := b.claim(t, "a", Req("m_1", "shared", 1000))
	if l1.Outcome != ledger.Claimed {
		t.Fatal(l1.Outcome)
	}
	l2 := b.claim(t, "a", Req("m_2", "shared", 1000))
	if l2.Outcome != ledger.Claimed {
		t.Fatalf("second merchant: %v, want claimed", l2.Outcome)
	}
	if l1.Lease.ProviderKey == l2.Lease.ProviderKey {
		t.Fatalf("two merchants share the provider key %s", l1.Lease.ProviderKey)
	}
	if err := b.store.Complete(b.ctx, *l2.Lease, Charged("pi_m2")); err != nil {
		t.Fatal(err)
	}
	if rec := b.get(t, "m_1", "shared"); rec.Status != ledger.StatusPending {
		t.Fatalf("m_1's key is %s after m_2 completed its own, want pending", rec.Status)
	}
	b.noPayment(t, "m_1", "shared")
}

func testLedgerRowWithCompletion(t *testing.T, newStore NewStore) {
	b := setup(t, newStore)
	paid := b.claim(t, "a", Req("m_1", "paid", 1000)).Lease
	declined := b.claim(t, "a", Req("m_1", "declined", 2500)).Lease
	b.noPayment(t, "m_1", "paid")
	if err := b.store.Complete(b.ctx, *paid, Charged("pi_paid")); err != nil {
		t.Fatal(err)
	}
	dc := ledger.Completion{Declined: true, ResponseStatus: 402, Response: json.RawMessage(`{"error":{"code":"card_declined"}}`)}
	if err := b.store.Complete(b.ctx, *declined, dc); err != nil {
		t.Fatal(err)
	}
	p := b.payment(t, "m_1", "paid")
	if p.ChargeID != "pi_paid" || p.Status != ledger.PaymentSucceeded || p.Amount != 1000 || p.Currency != "usd" || p.ProviderKey != paid.ProviderKey {
		t.Errorf("ledger row %+v: want pi_paid succeeded, 1000 usd, provider key %s", p, paid.ProviderKey)
	}
	if p := b.payment(t, "m_1", "declined"); p.Status != ledger.PaymentDeclined || p.ChargeID != "" || p.Amount != 2500 {
		t.Errorf("ledger row %+v: want a declined row of 2500 without a charge id", p)
	}
	if rec := b.get(t, "m_1", "declined"); rec.Status != ledger.StatusCompleted || rec.ResponseStatus != 402 {
		t.Errorf("declined key %s/%d, want completed with 402", rec.Status, rec.ResponseStatus)
	}
}

func testLedgerConflictKeepsKeyPending(t *testing.T, newStore NewStore) {
	b := setup(t, newStore)
	l1 := b.claim(t, "a", Req("m_1", "k1", 1000)).Lease
	l2 := b.claim(t, "a", Req("m_1", "k2", 1000)).Lease
	if err := b.store.Complete(b.ctx, *l1, Charged("pi_same")); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Complete(b.ctx, *l2, Charged("pi_same")); !errors.Is(err, ledger.ErrLedgerConflict) {
		t.Fatalf("second key with the same charge id: %v, want ErrLedgerConflict", err)
	}
	if rec := b.get(t, "m_1", "k2"); rec.Status != ledger.StatusPending {
		t.Fatalf("k2 is %s, want still pending", rec.Status)
	}
	b.noPayment(t, "m_1", "k2")
}

// prepare gives a store a mix of existing rows: completed, failed, pending
// with a live lease, released.
func (b *bundle) prepare(t *testing.T) {
	t.Helper()
	for i := range 100 {
		r := Req("m_1", fmt.Sprintf("k-%d", i), 1000)
		l := b.claim(t, "old", r).Lease
		switch i % 4 {
		case 0:
			if err := b.store.Complete(b.ctx, *l, Charged(fmt.Sprintf("pi_%d", i))); err != nil {
				t.Fatal(err)
			}
		case 1:
			if _, err := b.store.Fail(b.ctx, *l, "429"); err != nil {
				t.Fatal(err)
			}
		case 2: // left with a live lease
		case 3:
			if err := b.store.Release(b.ctx, *l, "crashed"); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func testBatchClaimMatchesOneByOne(t *testing.T, newStore NewStore) {
	batch, single := setup(t, newStore), setup(t, newStore)
	batch.prepare(t)
	single.prepare(t)

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
		reqs[i] = Req("m_1", fmt.Sprintf("k-%d", k), amount)
	}
	got, err := batch.store.ClaimBatch(batch.ctx, "new", Lease, reqs)
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
			(got[i].Lease != nil && (got[i].Lease.Attempt != want.Lease.Attempt || got[i].Lease.MaybeCharged != want.Lease.MaybeCharged ||
				got[i].Lease.ProviderKey != want.Lease.ProviderKey)) {
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

// testBatchClaimRaceAcrossBatches: two holders claim overlapping batches
// in opposite orders at once: no deadlock surfaces, and every key is
// claimed exactly once.
func testBatchClaimRaceAcrossBatches(t *testing.T, newStore NewStore) {
	b := setup(t, newStore)
	var fwd, rev []ledger.ClaimRequest
	for i := range 200 {
		fwd = append(fwd, Req("m_1", fmt.Sprintf("x-%d", i), 1000))
	}
	for i := len(fwd) - 1; i >= 0; i-- {
		rev = append(rev, fwd[i])
	}
	type out struct {
		holder string
		res    []ledger.ClaimResult
		err    error
	}
	ch := make(chan out, 2)
	for i, batch := range [][]ledger.ClaimRequest{fwd, rev} {
		go func() {
			holder := fmt.Sprintf("h-%d", i)
			res, err := b.store.ClaimBatch(b.ctx, holder, Lease, batch)
			ch <- out{holder, res, err}
		}()
	}
	winners := map[string]string{}
	for range 2 {
		o := <-ch
		if o.err != nil {
			t.Fatal(o.err)
		}
		for _, r := range o.res {
			switch r.Outcome {
			case ledger.Claimed:
				if w, ok := winners[r.Lease.IdempotencyKey]; ok {
					t.Errorf("%s claimed by %s and %s", r.Lease.IdempotencyKey, w, o.holder)
				}
				winners[r.Lease.IdempotencyKey] = o.holder
			case ledger.InFlight:
			default:
				t.Errorf("outcome %v", r.Outcome)
			}
		}
	}
	if len(winners) != 200 {
		t.Fatalf("%d keys claimed, want 200", len(winners))
	}
	for k, w := range winners {
		if rec := b.get(t, "m_1", k); rec.LockedBy != w {
			t.Fatalf("%s held by %q, claimed by %q", k, rec.LockedBy, w)
		}
	}
}

// testCompleteBatch: a group commit hands each item its own result: a lost
// lease and a ledger conflict fail their items alone.
func testCompleteBatch(t *testing.T, newStore NewStore) {
	b := setup(t, newStore)
	var items []ledger.CompleteItem
	for i := range 10 {
		l := b.claim(t, "a", Req("m_1", fmt.Sprintf("c-%d", i), 1000)).Lease
		items = append(items, ledger.CompleteItem{Lease: *l, Completion: Charged(fmt.Sprintf("pi_c%d", i))})
	}
	// Item 3's lease is lost to another holder; item 7 repeats item 6's charge
	// id, so the group commit fails on the ledger and falls back per item.
	b.clock.Advance(Lease + time.Second)
	if res := b.claim(t, "thief", Req("m_1", "c-3", 1000)); res.Outcome != ledger.Reacquired {
		t.Fatal(res.Outcome)
	}
	for i := range items {
		if i != 3 {
			var err error
			if items[i].Lease, err = b.store.Heartbeat(b.ctx, items[i].Lease, Lease); err != nil {
				t.Fatal(err)
			}
		}
	}
	items[7].Completion = Charged("pi_c6")
	errs, err := b.store.CompleteBatch(b.ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) != len(items) {
		t.Fatalf("%d results for %d items", len(errs), len(items))
	}
	for i, e := range errs {
		key := fmt.Sprintf("c-%d", i)
		switch i {
		case 3:
			if !errors.Is(e, ledger.ErrLeaseLost) {
				t.Errorf("item 3: %v, want ErrLeaseLost", e)
			}
			b.noPayment(t, "m_1", key)
		case 7:
			if !errors.Is(e, ledger.ErrLedgerConflict) {
				t.Errorf("item 7: %v, want ErrLedgerConflict", e)
			}
			b.noPayment(t, "m_1", key)
			if rec := b.get(t, "m_1", key); rec.Status != ledger.StatusPending {
				t.Errorf("item 7's key is %s, want pending", rec.Status)
			}
		default:
			if e != nil {
				t.Errorf("item %d: %v", i, e)
			}
			if p := b.payment(t, "m_1", key); p.ChargeID != fmt.Sprintf("pi_c%d", i) {
				t.Errorf("item %d: ledger row %+v", i, p)
			}
			if rec := b.get(t, "m_1", key); rec.Status != ledger.StatusCompleted {
				t.Errorf("item %d's key is %s, want completed", i, rec.Status)
			}
		}
	}
}

// testAcquireStuckDisjoint: rows whose holder vanished are taken by the
// reconcilers once the grace has passed, each row by exactly one of them,
// under a new attempt that fences out the old holder.
func testAcquireStuckDisjoint(t *testing.T, newStore NewStore) {
	b := setup(t, newStore)
	const rows = 40
	leases := map[string]ledger.Lease{}
	for i := range rows {
		l := b.claim(t, "crashed", Req("m_1", fmt.Sprintf("s-%d", i), 1000)).Lease
		leases[l.IdempotencyKey] = *l
	}
	if got, err := b.store.AcquireStuck(b.ctx, "rec", time.Minute, Lease, 100); err != nil || len(got) != 0 {
		t.Fatalf("live leases acquired: %d %v", len(got), err)
	}
	b.clock.Advance(Lease + 2*time.Minute)
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				got, err := b.store.AcquireStuck(b.ctx, fmt.Sprintf("rec-%d", r), time.Minute, Lease, 3)
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
					if s.Lease.Attempt != 2 || !s.Lease.MaybeCharged || s.Lease.ProviderKey != leases[s.Lease.IdempotencyKey].ProviderKey {
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
	// The crashed holder's late completion is fenced out.
	if err := b.store.Complete(b.ctx, leases["s-0"], Charged("pi_late")); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Fatalf("the old holder's complete after the reconciler took the row: %v, want ErrLeaseLost", err)
	}
}

// testRefusalOncePerMessageBindsNoKey: a refusal is recorded once per
// refused message (the same stream sequence again writes nothing; another
// message's refusal of the same key is its own), and it binds no key: no
// record, no ledger row, and a valid command under the key is claimed
// afterwards.
func testRefusalOncePerMessageBindsNoKey(t *testing.T, newStore NewStore) {
	b := setup(t, newStore)
	r := ledger.Refusal{MerchantID: "m_1", IdempotencyKey: "refused", StreamSeq: 5, Reason: string(payment.ReasonInvalidAmount), FiledAt: b.clock.Now()}
	for i, want := range []bool{true, false} {
		if wrote, err := b.store.RecordRefusal(b.ctx, r); err != nil || wrote != want {
			t.Fatalf("refusal write %d: %v %v, want %v", i+1, wrote, err, want)
		}
	}
	r.StreamSeq = 6
	if wrote, err := b.store.RecordRefusal(b.ctx, r); err != nil || !wrote {
		t.Fatalf("another message's refusal: %v %v, want written", wrote, err)
	}
	if _, err := b.store.Get(b.ctx, "m_1", "refused"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("get after a refusal: %v, want ErrNotFound (a refusal binds no key)", err)
	}
	b.noPayment(t, "m_1", "refused")
	if res := b.claim(t, "a", Req("m_1", "refused", 1000)); res.Outcome != ledger.Claimed {
		t.Fatalf("claim after a refusal: %+v, want claimed", res)
	}
}
