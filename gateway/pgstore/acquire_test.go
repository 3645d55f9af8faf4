package pgstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/gateway/apikey"
	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/ledger"
)

// counted is a store over b's schema whose pool counts its round trips.
func (b *bundle) counted(t *testing.T) (*pgstore.Store, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	cfg := b.pool.Config().Copy()
	pg.WithRoundTripCounter(&n)(cfg)
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := pgstore.New(pool, pgstore.Config{Clock: b.clock})
	if err != nil {
		t.Fatal(err)
	}
	return s, &n
}

// TestAcquireIntakesHeldInOneRoundTrip: a batch that meets rows it cannot
// take over (held by another publisher, or held for another payload) reads
// them in the round trip that acquires the others; each request gets its
// outcome and the row it met.
func TestAcquireIntakesHeldInOneRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const publishLease, retention = 10 * time.Second, 48 * time.Hour
	first := []ledger.ClaimRequest{req("m_1", "held-1", 100), req("m_1", "held-2", 100), req("m_2", "other-payload", 100)}
	if _, err := b.store.AcquireIntakes(b.ctx, first, publishLease, retention); err != nil {
		t.Fatal(err)
	}
	s, trips := b.counted(t)
	batch := []ledger.ClaimRequest{
		req("m_1", "new-1", 100), first[0], req("m_2", "other-payload", 999), req("m_1", "new-2", 100), first[1],
	}
	trips.Store(0)
	res, err := s.AcquireIntakes(b.ctx, batch, publishLease, retention)
	if err != nil {
		t.Fatal(err)
	}
	if n := trips.Load(); n != 1 {
		t.Fatalf("%d round trips, want 1", n)
	}
	want := []ledger.IntakeOutcome{ledger.IntakeAcquired, ledger.IntakeHeld, ledger.IntakeMismatch, ledger.IntakeAcquired, ledger.IntakeHeld}
	for i, r := range res {
		if r.Outcome != want[i] {
			t.Fatalf("%s: outcome %v, want %v", batch[i].IdempotencyKey, r.Outcome, want[i])
		}
		if r.Intake.MerchantID != batch[i].MerchantID || r.Intake.IdempotencyKey != batch[i].IdempotencyKey || r.Intake.Attempt != 1 {
			t.Fatalf("%s: intake %+v", batch[i].IdempotencyKey, r.Intake)
		}
	}
	if res[2].Intake.Amount != 100 {
		t.Fatalf("the mismatched request got the row %+v, want the held payload's", res[2].Intake)
	}
}

// TestAcquireIntakesRace: two batches racing over shared keys: each key
// has exactly one publisher, and the other batch's request for it is held
// and sees the winner's row (attempt 1), whichever batch commits first.
func TestAcquireIntakesRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	raceAcquisitions(t, b, b.store.AcquireIntakes)
}

// TestAcquireNewIntakesRace: the same race between two batches' first
// statements (AcquireNewIntakes): each key has exactly one publisher; the
// other batch's request is held, or, when the winner committed while its
// statement ran, left to be read (IntakeReadFirst), and AcquireIntakes,
// where the gateway then takes it, finds it held by the winner.
func TestAcquireNewIntakesRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key, _, err := b.store.CreateAPIKey(b.ctx, "m_1", "")
	if err != nil {
		t.Fatal(err)
	}
	hash := apikey.Hash(key)
	raceAcquisitions(t, b, func(ctx context.Context, reqs []ledger.ClaimRequest, lease, retention time.Duration) ([]ledger.IntakeResult, error) {
		hashes := make([][]byte, len(reqs))
		for i := range hashes {
			hashes[i] = hash
		}
		res, err := b.store.AcquireNewIntakes(ctx, reqs, hashes, lease, retention)
		if err != nil {
			return nil, err
		}
		var later []ledger.ClaimRequest
		var at []int
		for i, r := range res {
			if r.Outcome == ledger.IntakeReadFirst {
				later, at = append(later, reqs[i]), append(at, i)
			}
		}
		if len(later) == 0 {
			return res, nil
		}
		again, err := b.store.AcquireIntakes(ctx, later, lease, retention)
		if err != nil {
			return nil, err
		}
		for j, r := range again {
			if r.Outcome != ledger.IntakeHeld {
				return nil, fmt.Errorf("%s: left to be read, then %v; want held by the winner", later[j].IdempotencyKey, r.Outcome)
			}
			res[at[j]] = r
		}
		return res, nil
	})
}

// raceAcquisitions races two batches of acquire over shared keys, round
// after round.
func raceAcquisitions(t *testing.T, b *bundle, acquire func(context.Context, []ledger.ClaimRequest, time.Duration, time.Duration) ([]ledger.IntakeResult, error)) {
	t.Helper()
	const publishLease, retention = 10 * time.Second, 48 * time.Hour
	const rounds, size = 20, 40
	for round := range rounds {
		// Each batch holds the shared keys and its own; the statement takes
		// the rows in key order, so the two cannot deadlock.
		batches := make([][]ledger.ClaimRequest, 2)
		for side := range batches {
			for i := range size {
				key := fmt.Sprintf("r%d-shared-%02d", round, i)
				if i%2 == 1 {
					key = fmt.Sprintf("r%d-own-%d-%02d", round, side, i)
				}
				batches[side] = append(batches[side], req("m_1", key, 100))
			}
		}
		results := make([][]ledger.IntakeResult, 2)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for side := range batches {
			wg.Go(func() {
				<-start
				res, err := acquire(b.ctx, batches[side], publishLease, retention)
				if err != nil {
					t.Error(err)
				}
				results[side] = res
			})
		}
		close(start)
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		for i := range size {
			a, c := results[0][i], results[1][i]
			if i%2 == 1 {
				if a.Outcome != ledger.IntakeAcquired || c.Outcome != ledger.IntakeAcquired {
					t.Fatalf("round %d: own keys %v, %v, want both acquired", round, a.Outcome, c.Outcome)
				}
				continue
			}
			if (a.Outcome == ledger.IntakeAcquired) == (c.Outcome == ledger.IntakeAcquired) {
				t.Fatalf("round %d, %s: outcomes %v and %v, want one publisher", round, batches[0][i].IdempotencyKey, a.Outcome, c.Outcome)
			}
			for _, r := range []ledger.IntakeResult{a, c} {
				if r.Outcome != ledger.IntakeAcquired && r.Outcome != ledger.IntakeHeld {
					t.Fatalf("round %d, %s: outcome %v", round, batches[0][i].IdempotencyKey, r.Outcome)
				}
				if r.Intake.IdempotencyKey != batches[0][i].IdempotencyKey || r.Intake.Attempt != 1 {
					t.Fatalf("round %d: intake %+v", round, r.Intake)
				}
			}
		}
	}
}

// TestAcquireNewIntakes: the batched intake's first statement takes in,
// in one round trip, exactly the requests that only their intake row can
// decide (an active API key of their merchant, no record, no ledger row)
// and reads the rows it met for them; every other request is
// IntakeReadFirst and its key is left untouched.
func TestAcquireNewIntakes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const publishLease, retention = 10 * time.Second, 48 * time.Hour
	apiKey := func(merchant string) []byte {
		t.Helper()
		key, _, err := b.store.CreateAPIKey(b.ctx, merchant, "")
		if err != nil {
			t.Fatal(err)
		}
		return apikey.Hash(key)
	}
	m1, m2 := apiKey("m_1"), apiKey("m_2")
	revoked, rk, err := b.store.CreateAPIKey(b.ctx, "m_1", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.RevokeAPIKey(b.ctx, rk.ID); err != nil {
		t.Fatal(err)
	}
	// Keys the worker has seen: claimed, completed, and completed with its
	// record gone (purged; the ledger row stays).
	b.claim(t, "w", req("m_1", "pending", 100))
	for _, k := range []string{"completed", "ledger-only"} {
		c := b.claim(t, "w", req("m_1", k, 100))
		if err := b.worker.Complete(b.ctx, *c.Lease, charged("ch_"+k)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.pool.Exec(b.ctx, `DELETE FROM idempotency_keys WHERE idempotency_key = 'ledger-only'`); err != nil {
		t.Fatal(err)
	}
	// Intake rows: two held by a publisher (one for another payload), one
	// dead-lettered by the worker.
	prior, err := b.store.AcquireIntakes(b.ctx, []ledger.ClaimRequest{req("m_1", "held", 100), req("m_1", "dead", 100),
		req("m_1", "held-other", 999)}, publishLease, retention)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.IntakesPublished(b.ctx, []ledger.Published{{Intake: prior[1].Intake, Seq: 7}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.store.MarkIntakeDeadLettered(b.ctx, "m_1", "dead", 7, "amount_over_limit", "x"); !ok || err != nil {
		t.Fatalf("dead-letter the intake: %v %v", ok, err)
	}

	cases := []struct {
		req    ledger.ClaimRequest
		apiKey []byte
		want   ledger.IntakeOutcome
	}{
		{req("m_1", "new-1", 100), m1, ledger.IntakeAcquired},
		{req("m_1", "pending", 100), m1, ledger.IntakeReadFirst},
		{req("m_1", "completed", 100), m1, ledger.IntakeReadFirst},
		{req("m_1", "ledger-only", 100), m1, ledger.IntakeReadFirst},
		{req("m_1", "revoked-key", 100), apikey.Hash(revoked), ledger.IntakeReadFirst},
		{req("m_1", "other-merchants-key", 100), m2, ledger.IntakeReadFirst},
		{req("m_1", "held", 100), m1, ledger.IntakeHeld},
		{req("m_1", "held-other", 100), m1, ledger.IntakeMismatch},
		{req("m_1", "dead", 100), m1, ledger.IntakeDeadLettered},
		{req("m_2", "new-2", 100), m2, ledger.IntakeAcquired},
	}
	reqs, keys := make([]ledger.ClaimRequest, len(cases)), make([][]byte, len(cases))
	for i, c := range cases {
		reqs[i], keys[i] = c.req, c.apiKey
	}
	s, trips := b.counted(t)
	trips.Store(0)
	res, err := s.AcquireNewIntakes(b.ctx, reqs, keys, publishLease, retention)
	if err != nil {
		t.Fatal(err)
	}
	if n := trips.Load(); n != 1 {
		t.Fatalf("%d round trips, want 1", n)
	}
	for i, r := range res {
		c := cases[i]
		if r.Outcome != c.want {
			t.Errorf("%s: outcome %v, want %v", c.req.IdempotencyKey, r.Outcome, c.want)
			continue
		}
		if c.want == ledger.IntakeReadFirst {
			if r.Intake.MerchantID != "" {
				t.Errorf("%s: read first with the row %+v", c.req.IdempotencyKey, r.Intake)
			}
			continue
		}
		if r.Intake.MerchantID != c.req.MerchantID || r.Intake.IdempotencyKey != c.req.IdempotencyKey || r.Intake.Attempt != 1 {
			t.Errorf("%s: intake %+v", c.req.IdempotencyKey, r.Intake)
		}
	}
	// Nothing was taken in for the keys left to be read.
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM gateway_intake WHERE idempotency_key = ANY($1)`,
		[]string{"pending", "completed", "ledger-only", "revoked-key", "other-merchants-key"}).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d intake rows for keys left to be read, want 0", n)
	}
	if _, err := s.AcquireNewIntakes(b.ctx, reqs[:2], [][]byte{m1}, publishLease, retention); err == nil {
		t.Fatal("a batch with fewer API keys than requests was accepted")
	}
}
