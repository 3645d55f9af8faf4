package dedup_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/pg"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
)

// TestReacquireRaceOneWinner races claimers on a row whose lease expired,
// round after round, and wants exactly one re-acquirer each time. The
// racers run on a pool whose connections are all open beforehand (no racer
// waits for a connect) and are released together by a start barrier. Since
// migration 00013 the claim takes a per-key advisory lock before its
// statement's snapshot, so the racers queue on it and each later one reads
// the winner's lease; the claim's re-check of the row's latest version is
// the second net (TestClaimCannotStealReconcilerLease races it).
func TestReacquireRaceOneWinner(t *testing.T) {
	t.Parallel()
	const (
		racers = 6
		rounds = 60
	)
	u := testenv.PostgresURL(t)
	ctx := context.Background()
	pool, err := pg.Connect(ctx, u+fmt.Sprintf("&pool_max_conns=%d", racers))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// Open every connection now: acquire them all at once, then release.
	var warm sync.WaitGroup
	for range racers {
		warm.Add(1)
		go func() {
			defer warm.Done()
			c, err := pool.Acquire(ctx)
			if err != nil {
				t.Errorf("warm a connection: %v", err)
				return
			}
			defer c.Release()
			if _, err := c.Exec(ctx, `SELECT 1`); err != nil {
				t.Errorf("warm a connection: %v", err)
			}
		}()
	}
	warm.Wait()
	if t.Failed() {
		t.FailNow()
	}
	clk := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	store, err := dedup.New(pool, dedup.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}

	deadline := time.Now().Add(20 * time.Second) // bounds the test on a slow machine
	ran, overlapped := 0, 0
	for round := range rounds {
		if time.Now().After(deadline) {
			t.Logf("stopped after %d rounds at the time bound", round)
			break
		}
		r := req("m_1", fmt.Sprintf("race-%d", round), 1000)
		if res, err := store.Claim(ctx, "first", lease, r); err != nil || res.Outcome != ledger.Claimed {
			t.Fatalf("round %d: first claim %v %v", round, res.Outcome, err)
		}
		clk.Advance(lease + time.Second)

		results := make([]ledger.ClaimResult, racers)
		errs := make([]error, racers)
		var ready, done sync.WaitGroup
		start := make(chan struct{})
		for i := range racers {
			ready.Add(1)
			done.Add(1)
			go func() {
				defer done.Done()
				ready.Done()
				<-start
				results[i], errs[i] = store.Claim(ctx, fmt.Sprintf("r%d-%d", round, i), lease, r)
			}()
		}
		ready.Wait()
		close(start)
		done.Wait()

		reacquired, inFlight, raced := 0, 0, 0
		for i, res := range results {
			if errs[i] != nil {
				t.Fatalf("round %d racer %d: %v", round, i, errs[i])
			}
			switch res.Outcome {
			case ledger.Reacquired:
				reacquired++
			case ledger.InFlight:
				inFlight++
				if res.Record.LockedBy == "first" {
					raced++ // its snapshot showed the expired lease: the re-check refused it
				}
			default:
				t.Fatalf("round %d racer %d: outcome %v", round, i, res.Outcome)
			}
		}
		if reacquired != 1 {
			t.Fatalf("round %d: %d racers re-acquired the expired lease, want exactly 1 (%d in flight)", round, reacquired, inFlight)
		}
		rec, err := store.Get(ctx, "m_1", r.IdempotencyKey)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Attempts != 2 {
			t.Fatalf("round %d: attempts %d after one re-acquire, want 2", round, rec.Attempts)
		}
		ran++
		if raced > 0 {
			overlapped++
		}
	}
	// The advisory lock serialises the racers: a loser that read the
	// expired lease would mean two claims of one key shared a snapshot.
	t.Logf("%d of %d rounds had racers that read the expired lease together", overlapped, ran)
	if overlapped != 0 {
		t.Fatalf("%d of %d rounds had losers that read the expired lease: the claim's per-key lock did not serialise them", overlapped, ran)
	}
}
