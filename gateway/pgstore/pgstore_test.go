package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/gateway/apikey"
	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/storetest"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
)

// lease is the worker's lease in these tests.
const lease = 30 * time.Second

// bundle is one test's schema: the gateway's store and the worker's, on
// one fake clock.
type bundle struct {
	store  *pgstore.Store
	worker *dedup.Store
	pool   *pgxpool.Pool
	clock  *clock.Fake
	ctx    context.Context
}

func setup(t testing.TB) *bundle {
	t.Helper()
	pool := testenv.Pool(t)
	clk := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	w, err := dedup.New(pool, dedup.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	s, err := pgstore.New(pool, pgstore.Config{Clock: clk, Records: w})
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{store: s, worker: w, pool: pool, clock: clk, ctx: context.Background()}
}

// The fixtures the store's tests share with the worker store's
// conformance suite.
var (
	req     = storetest.Req
	charged = storetest.Charged
)

// acquireOne takes in one request by the batched acquisition the gateway
// runs (AcquireIntakes), as a batch of one.
func acquireOne(ctx context.Context, s *pgstore.Store, r ledger.ClaimRequest, lease, retention time.Duration) (ledger.IntakeResult, error) {
	res, err := s.AcquireIntakes(ctx, []ledger.ClaimRequest{r}, lease, retention)
	if err != nil {
		return ledger.IntakeResult{}, err
	}
	return res[0], nil
}

// claim claims r for the worker holder.
func (b *bundle) claim(t testing.TB, holder string, r ledger.ClaimRequest) ledger.ClaimResult {
	t.Helper()
	res, err := b.worker.Claim(b.ctx, holder, lease, r)
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

// TestListenerWakesSubscribers: a subscriber of a key is woken when it
// completes, and only then.
func TestListenerWakesSubscribers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	comp, err := pgstore.NewListener(b.pool, pgstore.ListenerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- comp.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !comp.Listening() {
		if time.Now().After(deadline) {
			t.Fatal("not listening")
		}
		time.Sleep(10 * time.Millisecond)
	}
	x, y := comp.Subscribe("m_1", "x"), comp.Subscribe("m_1", "y")
	defer x.Close()
	defer y.Close()
	if _, err := acquireOne(b.ctx, b.store, req("m_1", "x", 100), time.Second, time.Hour); err != nil {
		t.Fatal(err)
	}
	l := b.claim(t, "h", req("m_1", "x", 100)).Lease
	if err := b.worker.Complete(b.ctx, *l, charged("ch_x")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-x.C:
	case <-time.After(10 * time.Second):
		t.Fatal("subscriber not woken by the completion")
	}
	select {
	case <-y.C:
		t.Fatal("a subscriber of another key was woken")
	default:
	}
	y.Close()
	y.Close() // idempotent
}

// TestIntakeGuard: one publisher among concurrent first requests; the row
// is held while publishing and after, taken over when its lock passes, and
// fenced by attempt.
func TestIntakeGuard(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const publishLease, retention = 10 * time.Second, 48 * time.Hour
	r := req("m_1", "k", 100)

	const racers = 20
	outcomes := make([]ledger.IntakeOutcome, racers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range racers {
		wg.Go(func() {
			<-start
			res, err := acquireOne(b.ctx, b.store, r, publishLease, retention)
			if err != nil {
				t.Error(err)
			}
			outcomes[i] = res.Outcome
		})
	}
	close(start)
	wg.Wait()
	acquired := 0
	for _, o := range outcomes {
		switch o {
		case ledger.IntakeAcquired:
			acquired++
		case ledger.IntakeHeld:
		default:
			t.Fatalf("outcome %v", o)
		}
	}
	if acquired != 1 {
		t.Fatalf("%d publishers, want 1", acquired)
	}
	in, err := b.store.GetIntake(b.ctx, "m_1", "k")
	if err != nil || in.Attempt != 1 || !in.PublishedAt.IsZero() {
		t.Fatalf("intake %+v %v", in, err)
	}
	if res, _ := acquireOne(b.ctx, b.store, req("m_1", "k", 999), publishLease, retention); res.Outcome != ledger.IntakeMismatch {
		t.Fatalf("other payload: %v", res.Outcome)
	}
	if err := b.store.IntakePublished(b.ctx, in, 1, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(5 * time.Minute)
	if res, _ := acquireOne(b.ctx, b.store, r, publishLease, retention); res.Outcome != ledger.IntakeHeld || res.Intake.PublishedAt.IsZero() {
		t.Fatalf("published row: %+v", res)
	}
	b.clock.Advance(6 * time.Minute)
	res, err := acquireOne(b.ctx, b.store, r, publishLease, retention)
	if err != nil || res.Outcome != ledger.IntakeAcquired || res.Intake.Attempt != 2 {
		t.Fatalf("takeover after the hold: %+v %v", res, err)
	}
	if err := b.store.IntakePublished(b.ctx, in, 1, time.Minute); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Fatalf("stale publisher: %v", err)
	}
	if err := b.store.AbandonIntake(b.ctx, res.Intake); err != nil {
		t.Fatal(err)
	}
	if res, _ = acquireOne(b.ctx, b.store, r, publishLease, retention); res.Outcome != ledger.IntakeAcquired || res.Intake.Attempt != 3 {
		t.Fatalf("after abandon: %+v", res)
	}
	// Past retention the row is purged, or taken over by any payload.
	b.clock.Advance(retention + time.Hour)
	if n, err := b.store.PurgeIntakes(b.ctx, 10); err != nil || n != 1 {
		t.Fatalf("purge: %d %v", n, err)
	}
	if _, err := b.store.GetIntake(b.ctx, "m_1", "k"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("after purge: %v", err)
	}
	if _, err := acquireOne(b.ctx, b.store, r, publishLease, retention); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(retention + time.Hour)
	if res, _ = acquireOne(b.ctx, b.store, req("m_1", "k", 999), publishLease, retention); res.Outcome != ledger.IntakeAcquired || res.Intake.Amount != 999 {
		t.Fatalf("expired row not reusable: %+v", res)
	}
}

// TestIntakeFate: a never-published intake is forgotten on abandon (and
// taken over only by its own payload once its lock passed); a dead letter marks only
// the intake that published that very stream sequence, and makes it
// terminal until it expires; the ledger outlives the record.
func TestIntakeFate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const lease, retention = 10 * time.Second, 48 * time.Hour

	// Abandoned before any publish: gone, and another payload is new.
	res, err := acquireOne(b.ctx, b.store, req("m_1", "a", 100), lease, retention)
	if err != nil || res.Outcome != ledger.IntakeAcquired {
		t.Fatalf("%+v %v", res, err)
	}
	if err := b.store.AbandonIntake(b.ctx, res.Intake); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.GetIntake(b.ctx, "m_1", "a"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("abandoned unpublished intake: %v", err)
	}
	// A publisher that died before its PubAck (it may have sent): its lock
	// passes, and the key stays bound to its payload; only a refusal
	// frees it for a corrected payload.
	if _, err := acquireOne(b.ctx, b.store, req("m_1", "a", 100), lease, retention); err != nil {
		t.Fatal(err)
	}
	if res, _ := acquireOne(b.ctx, b.store, req("m_1", "a", 150), lease, retention); res.Outcome != ledger.IntakeMismatch {
		t.Fatalf("while the lock is held: %v", res.Outcome)
	}
	b.clock.Advance(lease + time.Second)
	if res, _ := acquireOne(b.ctx, b.store, req("m_1", "a", 150), lease, retention); res.Outcome != ledger.IntakeMismatch {
		t.Fatalf("corrected payload after a dead publisher: %v, want a mismatch", res.Outcome)
	}
	res, err = acquireOne(b.ctx, b.store, req("m_1", "a", 100), lease, retention)
	if err != nil || res.Outcome != ledger.IntakeAcquired || res.Intake.Attempt != 2 {
		t.Fatalf("the same payload after a dead publisher: %+v %v", res, err)
	}
	if err := b.store.AbandonIntake(b.ctx, res.Intake); err != nil {
		t.Fatal(err)
	}
	res, err = acquireOne(b.ctx, b.store, req("m_1", "a", 150), lease, retention)
	if err != nil || res.Outcome != ledger.IntakeAcquired || res.Intake.Amount != 150 {
		t.Fatalf("corrected payload after a refusal: %+v %v", res, err)
	}

	// Published as sequence 7, then dead-lettered.
	if err := b.store.IntakePublished(b.ctx, res.Intake, 7, time.Minute); err != nil {
		t.Fatal(err)
	}
	if in, _ := b.store.GetIntake(b.ctx, "m_1", "a"); in.StreamSeq != 7 || !in.Published() || in.DeadLettered() {
		t.Fatalf("published intake %+v", in)
	}
	for _, other := range []struct {
		key string
		seq uint64
	}{{"a", 8}, {"b", 7}, {"a", 0}} {
		if ok, err := b.store.MarkIntakeDeadLettered(b.ctx, "m_1", other.key, other.seq, "key_reused", "x"); ok || err != nil {
			t.Fatalf("%+v marked another copy: %v %v", other, ok, err)
		}
	}
	ok, err := b.store.MarkIntakeDeadLettered(b.ctx, "m_1", "a", 7, "amount_over_limit", strings.Repeat("e", 2000))
	if !ok || err != nil {
		t.Fatalf("mark: %v %v", ok, err)
	}
	if ok, _ := b.store.MarkIntakeDeadLettered(b.ctx, "m_1", "a", 7, "max_deliveries", ""); ok {
		t.Fatal("a second dead letter overwrote the first")
	}
	b.clock.Advance(2 * time.Minute) // past the republish hold
	res, err = acquireOne(b.ctx, b.store, req("m_1", "a", 150), lease, retention)
	if err != nil || res.Outcome != ledger.IntakeDeadLettered || res.Intake.DeadLetterReason != "amount_over_limit" ||
		len(res.Intake.DeadLetterError) != 1024 || res.Intake.Attempt != 1 {
		t.Fatalf("dead-lettered intake: %+v %v", res, err)
	}
	if res, _ := acquireOne(b.ctx, b.store, req("m_1", "a", 100), lease, retention); res.Outcome != ledger.IntakeMismatch {
		t.Fatalf("other payload on a dead letter: %v", res.Outcome)
	}
	// Expired: taken over afresh, its publish and dead letter forgotten.
	b.clock.Advance(retention)
	res, err = acquireOne(b.ctx, b.store, req("m_1", "a", 150), lease, retention)
	if err != nil || res.Outcome != ledger.IntakeAcquired || res.Intake.Published() || res.Intake.DeadLettered() || res.Intake.StreamSeq != 0 {
		t.Fatalf("expired dead letter: %+v %v", res, err)
	}

	// A dead letter faster than the gateway's record of its PubAck is kept
	// when the sequences agree, and dropped when it was another copy's.
	for _, c := range []struct {
		key      string
		pubSeq   uint64
		terminal bool
	}{{"p", 5, true}, {"q", 6, false}} {
		res, err := acquireOne(b.ctx, b.store, req("m_1", c.key, 100), lease, retention)
		if err != nil || res.Outcome != ledger.IntakeAcquired {
			t.Fatalf("%s: %+v %v", c.key, res, err)
		}
		if ok, err := b.store.MarkIntakeDeadLettered(b.ctx, "m_1", c.key, 5, "key_mismatch", "x"); !ok || err != nil {
			t.Fatalf("%s: early dead letter not recorded: %v %v", c.key, ok, err)
		}
		if err := b.store.IntakePublished(b.ctx, res.Intake, c.pubSeq, time.Minute); err != nil {
			t.Fatal(err)
		}
		if in, _ := b.store.GetIntake(b.ctx, "m_1", c.key); in.DeadLettered() != c.terminal || in.StreamSeq != c.pubSeq {
			t.Fatalf("%s: after the PubAck's record: %+v", c.key, in)
		}
	}
}

func TestAPIKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key, k, err := b.store.CreateAPIKey(b.ctx, "m_1", "ci")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(key, apikey.Prefix+k.ID+"_") || k.MerchantID != "m_1" {
		t.Fatalf("key %q, %+v", key, k)
	}
	if m, err := b.store.Authenticate(b.ctx, key); err != nil || m != "m_1" {
		t.Fatalf("authenticate: %q %v", m, err)
	}
	if n := b.count(t, `SELECT count(*) FROM api_keys WHERE key_hash = $1`, apikey.Hash(key)); n != 1 {
		t.Fatal("the key's hash is not what is stored")
	}
	// One character changed: a different last character, whatever it was.
	last := "A"
	if strings.HasSuffix(key, "A") {
		last = "B"
	}
	for _, bad := range []string{"", key + "x", key[:len(key)-1] + last, strings.ToUpper(key)} {
		if _, err := b.store.Authenticate(b.ctx, bad); !errors.Is(err, apikey.ErrUnauthenticated) {
			t.Fatalf("%q: %v", bad, err)
		}
	}
	if _, _, err := b.store.CreateAPIKey(b.ctx, "m.bad", ""); err == nil {
		t.Fatal("invalid merchant accepted")
	}
	key2, k2, err := b.store.CreateAPIKey(b.ctx, "m_2", "")
	if err != nil {
		t.Fatal(err)
	}
	list, err := b.store.ListAPIKeys(b.ctx, "m_1")
	if err != nil || len(list) != 1 || list[0].ID != k.ID {
		t.Fatalf("list: %+v %v", list, err)
	}
	if all, _ := b.store.ListAPIKeys(b.ctx, ""); len(all) != 2 {
		t.Fatalf("list all: %+v", all)
	}
	rk, err := b.store.RevokeAPIKey(b.ctx, k.ID)
	if err != nil || rk.RevokedAt.IsZero() {
		t.Fatalf("revoke by id: %+v %v", rk, err)
	}
	if _, err := b.store.Authenticate(b.ctx, key); !errors.Is(err, apikey.ErrUnauthenticated) {
		t.Fatalf("revoked key: %v", err)
	}
	if _, err := b.store.RevokeAPIKey(b.ctx, key2); err != nil { // by the key itself
		t.Fatal(err)
	}
	if _, err := b.store.Authenticate(b.ctx, key2); !errors.Is(err, apikey.ErrUnauthenticated) {
		t.Fatalf("key revoked by value: %v (id %s)", err, k2.ID)
	}
	if _, err := b.store.RevokeAPIKey(b.ctx, "000000000000"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
}

// TestReadBatch: the batched intake's one round trip reads what the three
// reads it replaces read: the active keys among the hashes (not a revoked
// one), the keys' records once each, and their ledger rows.
func TestReadBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _, err := b.store.CreateAPIKey(b.ctx, "m_1", "")
	if err != nil {
		t.Fatal(err)
	}
	revoked, rk, err := b.store.CreateAPIKey(b.ctx, "m_1", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.RevokeAPIKey(b.ctx, rk.ID); err != nil {
		t.Fatal(err)
	}
	b.claim(t, "w", req("m_1", "pending", 100))
	done := b.claim(t, "w", req("m_1", "done", 200))
	if err := b.worker.Complete(b.ctx, *done.Lease, charged("ch_done")); err != nil {
		t.Fatal(err)
	}
	refs := []ledger.KeyRef{{MerchantID: "m_1", IdempotencyKey: "pending"}, {MerchantID: "m_1", IdempotencyKey: "done"},
		{MerchantID: "m_1", IdempotencyKey: "none"}, {MerchantID: "m_1", IdempotencyKey: "done"}}
	got, err := b.store.ReadBatch(b.ctx, [][]byte{apikey.Hash(live), apikey.Hash(revoked)}, refs)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Active) != 1 || got.Active[string(apikey.Hash(live))] != "m_1" {
		t.Errorf("active keys %v, want the live one only", got.Active)
	}
	status := map[string]ledger.Status{}
	for _, r := range got.Records {
		status[r.IdempotencyKey] = r.Status
	}
	if len(got.Records) != 2 || status["pending"] != ledger.StatusPending || status["done"] != ledger.StatusCompleted {
		t.Errorf("records %+v, want pending and done once each", got.Records)
	}
	want, err := b.worker.PaymentsFor(b.ctx, refs)
	if err != nil {
		t.Fatal(err)
	}
	var charge string
	for _, p := range got.Payments {
		if p.IdempotencyKey == "done" {
			charge = p.ChargeID
		}
	}
	if len(got.Payments) != len(want) || charge != "ch_done" {
		t.Errorf("ledger %+v, want %+v", got.Payments, want)
	}
}
