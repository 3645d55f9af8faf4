package pgstore_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paydedup/paydedup/budget"
	"github.com/paydedup/paydedup/budget/pgstore"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/provider"
)

// tooMany is a 429 as Stripe answers it, with reason and Retry-After.
func tooMany(reason string, retryAfter time.Duration) error {
	return &provider.Error{Class: provider.ClassRetryable, HTTPStatus: 429, Code: "rate_limit", RateLimitReason: reason, RetryAfter: retryAfter}
}

// TestTwoBudgetsShareOneRate: two budgets (two workers' processes) on one
// row, eight callers each, for a real 1.5 s window at a ceiling of
// 100/s: together they never pass more than the rate allows (its
// seconds plus one bucket, plus one grant each in hand), and they get
// most of it.
func TestTwoBudgetsShareOneRate(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	const rate, window = 100.0, 1500 * time.Millisecond
	var budgets []*budget.Budget
	for range 2 {
		s, err := pgstore.New(pool, pgstore.Config{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := budget.New(s, budget.Config{Rate: rate})
		if err != nil {
			t.Fatal(err)
		}
		budgets = append(budgets, b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	var passed atomic.Int64
	var wg sync.WaitGroup
	for _, b := range budgets {
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for b.Wait(ctx, "m_1") == nil {
					if ctx.Err() != nil {
						return
					}
					passed.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	n := float64(passed.Load())
	most := rate*window.Seconds() + rate*budget.DefaultBurst.Seconds() + 2*rate*budget.DefaultGrantPeriod.Seconds()
	t.Logf("%v calls passed in %v at %v/s (at most %v)", n, window, rate, most)
	if n > most {
		t.Fatalf("%v calls passed in %v, over the %v the rate allows", n, window, most)
	}
	if n < 0.6*rate*window.Seconds() {
		t.Fatalf("only %v calls passed in %v at %v/s", n, window, rate)
	}
}

// fleet is two budgets on one row with a fake clock for the database's
// time.
type fleet struct {
	a, b *budget.Budget
	clk  *clock.Fake
}

func newFleet(t *testing.T, cfg budget.Config) fleet {
	t.Helper()
	pool := testenv.Pool(t)
	clk := clock.NewFake(time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC))
	var bs []*budget.Budget
	for range 2 {
		s, err := pgstore.New(pool, pgstore.Config{Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		b, err := budget.New(s, cfg)
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	return fleet{a: bs[0], b: bs[1], clk: clk}
}

// waitShort takes a token with a short deadline: nil, or the budget's
// rate limit. One second: the budget gives up at half of it, and a round
// trip to PostgreSQL under -race on a loaded machine took more than the
// 75 ms a 150 ms deadline left.
func waitShort(b *budget.Budget) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return b.Wait(ctx, "m_1")
}

// TestRateLimitLowersAndRecovers: a 429 global-rate seen by one process
// lowers the fleet's rate by the decrease, once per interval however many
// 429s come (from either process); a concurrency 429 does not lower it;
// the rate recovers additively towards the ceiling as the database's time
// passes, and never above it.
func TestRateLimitLowersAndRecovers(t *testing.T) {
	t.Parallel()
	f := newFleet(t, budget.Config{Rate: 100, GrantTTL: time.Millisecond})
	ctx := context.Background()
	f.clk.Advance(time.Second)
	if err := waitShort(f.a); err != nil {
		t.Fatal(err)
	}
	if r := f.a.Rate(); r != 100 {
		t.Fatalf("rate %v, want the ceiling 100", r)
	}
	f.a.Observe(ctx, tooMany(provider.ReasonGlobalRate, 0))
	f.b.Observe(ctx, tooMany(provider.ReasonGlobalRate, 0)) // same interval: the fleet lowers once
	f.a.Observe(ctx, tooMany(provider.ReasonEndpointConcurrency, 0))
	f.clk.Advance(100 * time.Millisecond)
	if err := waitShort(f.b); err != nil {
		t.Fatal(err)
	}
	if r := f.b.Rate(); r < 70 || r > 71 {
		t.Fatalf("rate after a burst of 429s %v, want 70 (100 × 0.7 once) plus 0.1 s of recovery", r)
	}
	// A 429 that names no limiter is not known to be the account's: it
	// lowers nothing, one interval later or not.
	f.clk.Advance(2 * time.Second)
	time.Sleep(budget.DefaultInterval) // the process's own once-per-interval
	f.b.Observe(ctx, tooMany("", 0))
	if err := waitShort(f.a); err != nil {
		t.Fatal(err)
	}
	// The rate as last stored (70.3) and its recovery since the last grant
	// (2 s): 70.3 + 6.7.
	if r := f.a.Rate(); r < 76 || r > 78 {
		t.Fatalf("rate after a 429 with no reason %v, want about 70.3 + 2 s × 100/30 ≈ 77, not lowered", r)
	}
	f.clk.Advance(5 * time.Second)
	if err := waitShort(f.a); err != nil {
		t.Fatal(err)
	}
	if r := f.a.Rate(); r < 93 || r > 94.5 {
		t.Fatalf("rate 5 s later %v, want about 77 + 5 × 100/30 ≈ 93.7", r)
	}
	f.clk.Advance(time.Minute)
	if err := waitShort(f.b); err != nil {
		t.Fatal(err)
	}
	if r := f.b.Rate(); r != 100 {
		t.Fatalf("rate a minute later %v, want back at the ceiling 100", r)
	}
}

// TestRetryAfterHoldsTheFleet: a 429 with Retry-After: 2 seen by one
// process stops the other's calls until the database's time passes it:
// its Wait answers the budget's own rate limit, not executed, with the
// time left as RetryAfter; once that time has passed it passes.
func TestRetryAfterHoldsTheFleet(t *testing.T) {
	t.Parallel()
	f := newFleet(t, budget.Config{GrantTTL: time.Millisecond}) // no ceiling: only learned
	ctx := context.Background()
	if err := waitShort(f.b); err != nil {
		t.Fatal(err)
	}
	f.a.Observe(ctx, tooMany(provider.ReasonGlobalConcurrency, 2*time.Second))
	err := waitShort(f.b)
	var pe *provider.Error
	if !errors.As(err, &pe) || !pe.RateLimited() || pe.RateLimitReason != provider.ReasonBudget || pe.Class != provider.ClassRetryable ||
		pe.RetryAfter < 1900*time.Millisecond || pe.RetryAfter > 2*time.Second {
		t.Fatalf("wait during the fleet's Retry-After: %v, want the budget's rate limit with about 2 s to wait", err)
	}
	f.clk.Advance(2 * time.Second)
	// The process itself asks again only once the wait it was told has
	// passed on its own clock (one Take per RetryIn, not per caller).
	for deadline := time.Now().Add(3 * time.Second); ; {
		err := waitShort(f.b)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("wait after the Retry-After: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r := f.b.Rate(); r != 0 {
		t.Fatalf("rate %v after a concurrency 429: want still unlimited", r)
	}
}

// TestLearnedRateRecoversNoHigher: with no ceiling configured, a 429
// lowers the fleet's rate from its observed one (20/s here); while the
// fleet then stays quiet (uses less than half of it) the rate does not
// climb, on the process that saw the 429 and on the one that did not.
func TestLearnedRateRecoversNoHigher(t *testing.T) {
	t.Parallel()
	f := newFleet(t, budget.Config{GrantTTL: time.Millisecond})
	ctx := context.Background()
	// Forty grants of one token in no database time: an observed rate of
	// 20/s (the row's average adds half of each grant).
	for range 20 {
		for _, b := range []*budget.Budget{f.a, f.b} {
			if err := waitShort(b); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Millisecond) // past the grant's TTL
		}
	}
	f.a.Observe(ctx, tooMany(provider.ReasonGlobalRate, 0))
	f.clk.Advance(200 * time.Millisecond) // the emptied bucket refills
	if err := waitShort(f.b); err != nil {
		t.Fatal(err)
	}
	if r := f.b.Rate(); r < 13 || r > 15 {
		t.Fatalf("rate after the 429 %v, want 0.7 × the observed 20", r)
	}
	f.clk.Advance(10 * time.Minute)
	for _, b := range []*budget.Budget{f.b, f.a, f.b} {
		time.Sleep(2 * time.Millisecond)
		if err := waitShort(b); err != nil {
			t.Fatal(err)
		}
		// 14 plus the 0.2 s it recovered while the fleet still used it.
		if r := b.Rate(); r > 15 {
			t.Fatalf("rate ten quiet minutes after the 429 %v, want still about 14.4", r)
		}
	}
}

// TestTakeAfterAnIdleHour: a bucket nobody took from for an hour still
// grants: the decay of its observed rate over that time is nothing, not
// an error (PostgreSQL's exp underflows past about 25 minutes of it),
// which made every grant fail and every process pace itself alone for
// good once the fleet had been idle that long.
func TestTakeAfterAnIdleHour(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	clk := clock.NewFake(time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC))
	s, err := pgstore.New(pool, pgstore.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	take := budget.Take{Name: "idle", Want: 4, Ceiling: 100, Increase: 100.0 / 30, Burst: 0.25}
	if g, err := s.Take(ctx, take); err != nil || g.Tokens != 4 {
		t.Fatalf("first take: %+v, %v", g, err)
	}
	clk.Advance(time.Hour)
	g, err := s.Take(ctx, take)
	if err != nil {
		t.Fatalf("take after an idle hour: %v", err)
	}
	if g.Tokens != 4 || g.Rate != 100 {
		t.Fatalf("take after an idle hour: %+v, want 4 tokens at 100/s", g)
	}
}
