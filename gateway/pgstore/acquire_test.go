package pgstore_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/internal/pg"
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
	first := []dedup.ClaimRequest{req("m_1", "held-1", 100), req("m_1", "held-2", 100), req("m_2", "other-payload", 100)}
	if _, err := b.store.AcquireIntakes(b.ctx, first, publishLease, retention); err != nil {
		t.Fatal(err)
	}
	s, trips := b.counted(t)
	batch := []dedup.ClaimRequest{
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
	want := []pgstore.IntakeOutcome{pgstore.IntakeAcquired, pgstore.IntakeHeld, pgstore.IntakeMismatch, pgstore.IntakeAcquired, pgstore.IntakeHeld}
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
	const publishLease, retention = 10 * time.Second, 48 * time.Hour
	const rounds, size = 20, 40
	for round := range rounds {
		// Each batch holds the shared keys and its own; the statement takes
		// the rows in key order, so the two cannot deadlock.
		batches := make([][]dedup.ClaimRequest, 2)
		for side := range batches {
			for i := range size {
				key := fmt.Sprintf("r%d-shared-%02d", round, i)
				if i%2 == 1 {
					key = fmt.Sprintf("r%d-own-%d-%02d", round, side, i)
				}
				batches[side] = append(batches[side], req("m_1", key, 100))
			}
		}
		results := make([][]pgstore.IntakeResult, 2)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for side := range batches {
			wg.Go(func() {
				<-start
				res, err := b.store.AcquireIntakes(b.ctx, batches[side], publishLease, retention)
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
				if a.Outcome != pgstore.IntakeAcquired || c.Outcome != pgstore.IntakeAcquired {
					t.Fatalf("round %d: own keys %v, %v, want both acquired", round, a.Outcome, c.Outcome)
				}
				continue
			}
			if (a.Outcome == pgstore.IntakeAcquired) == (c.Outcome == pgstore.IntakeAcquired) {
				t.Fatalf("round %d, %s: outcomes %v and %v, want one publisher", round, batches[0][i].IdempotencyKey, a.Outcome, c.Outcome)
			}
			for _, r := range []pgstore.IntakeResult{a, c} {
				if r.Outcome != pgstore.IntakeAcquired && r.Outcome != pgstore.IntakeHeld {
					t.Fatalf("round %d, %s: outcome %v", round, batches[0][i].IdempotencyKey, r.Outcome)
				}
				if r.Intake.IdempotencyKey != batches[0][i].IdempotencyKey || r.Intake.Attempt != 1 {
					t.Fatalf("round %d: intake %+v", round, r.Intake)
				}
			}
		}
	}
}
