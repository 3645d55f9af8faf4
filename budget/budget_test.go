package budget_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paydedup/paydedup/budget"
	"github.com/paydedup/paydedup/provider"
)

// fakeStore answers every Take with grant (or err, after delay) and
// counts the Takes.
type fakeStore struct {
	mu    sync.Mutex
	grant budget.Grant
	err   error
	delay time.Duration
	takes atomic.Int64
}

func (s *fakeStore) set(g budget.Grant, err error, delay time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.grant, s.err, s.delay = g, err, delay
}

func (s *fakeStore) Take(ctx context.Context, _ budget.Take) (budget.Grant, error) {
	s.takes.Add(1)
	s.mu.Lock()
	g, err, d := s.grant, s.err, s.delay
	s.mu.Unlock()
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return budget.Grant{}, ctx.Err()
		}
	}
	return g, err
}

func (s *fakeStore) Slow(context.Context, budget.Slow) (float64, bool, error) {
	return 0, false, errors.New("fake store: no slow")
}

// spend runs callers goroutines that take tokens until ctx ends, and
// returns how many they got.
func spend(ctx context.Context, b *budget.Budget, callers int) int64 {
	var passed atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if b.Wait(ctx, "") == nil && ctx.Err() == nil {
					passed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return passed.Load()
}

// TestStarvedProcessAsksOncePerRetryIn: while the fleet's bucket is
// empty (every grant 0 tokens, ask again in 50 ms), sixteen callers of one
// process ask the store about once per 50 ms between them, not each: the
// process waits out the RetryIn as one.
func TestStarvedProcessAsksOncePerRetryIn(t *testing.T) {
	t.Parallel()
	const retryIn, window = 50 * time.Millisecond, 600 * time.Millisecond
	s := &fakeStore{}
	s.set(budget.Grant{Tokens: 0, Rate: 10, RetryIn: retryIn}, nil, 0)
	b, err := budget.New(s, budget.Config{Rate: 10})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	start := time.Now()
	passed := spend(ctx, b, 16)
	elapsed := time.Since(start)
	takes := s.takes.Load()
	most := int64(elapsed/retryIn) + 2
	t.Logf("%d takes in %v with 16 callers starved (RetryIn %v; at most %d)", takes, elapsed, retryIn, most)
	if passed != 0 {
		t.Fatalf("%d calls passed with no token granted", passed)
	}
	if takes > most {
		t.Fatalf("%d takes in %v: the callers asked the store each, not once per RetryIn (%d at most)", takes, elapsed, most)
	}
}

// TestStoreDownPacesAShareWithoutAsking: after the store fails once, the
// process stops asking it for a backoff (1 s at first) and paces its
// callers from the local limiter at a conservative share: at most half
// the fleet's last rate, and no more than this process was granted
// lately. Eight callers for 800 ms on a store that fails after 5 ms
// (its statement timeout) ask it once, and pass no more than the share
// allows.
func TestStoreDownPacesAShareWithoutAsking(t *testing.T) {
	t.Parallel()
	const rate, window = 100.0, 800 * time.Millisecond
	s := &fakeStore{}
	s.set(budget.Grant{Tokens: 10, Rate: rate}, nil, 0)
	b, err := budget.New(s, budget.Config{Rate: rate})
	if err != nil {
		t.Fatal(err)
	}
	// This process took grants at the fleet's whole rate for a while.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	spend(ctx, b, 4)
	cancel()
	s.set(budget.Grant{}, errors.New("fake store: unreachable"), 5*time.Millisecond)
	before := s.takes.Load()
	ctx, cancel = context.WithTimeout(context.Background(), window)
	defer cancel()
	start := time.Now()
	passed := spend(ctx, b, 8)
	elapsed := time.Since(start)
	takes := s.takes.Load() - before
	// Half the rate, its burst, a grant's tokens left in hand, and a few
	// for the timers' granularity under -race.
	most := rate/2*elapsed.Seconds() + rate/2*budget.DefaultBurst.Seconds() + 10 + 5
	t.Logf("store down: %d takes, %d calls passed in %v (at most %.0f)", takes, passed, elapsed, most)
	if takes > 1 {
		t.Fatalf("%d takes in %v of a failing store: every caller asked it", takes, elapsed)
	}
	if float64(passed) > most {
		t.Fatalf("%d calls passed in %v with the store down, over half the fleet's rate (%.0f)", passed, elapsed, most)
	}
	if passed < 5 {
		t.Fatalf("only %d calls passed in %v with the store down", passed, elapsed)
	}
}

// TestWaitedRecordsTheBudgetsHold: under WithWaitRecorder, Waited sums
// the waits for a token and the time from a refusal (no token before the
// deadline) to the next call, the caller's backoff; not the rest.
func TestWaitedRecordsTheBudgetsHold(t *testing.T) {
	t.Parallel()
	s := &fakeStore{}
	s.set(budget.Grant{Tokens: 0, Rate: 10, RetryIn: 100 * time.Millisecond}, nil, 0)
	b, err := budget.New(s, budget.Config{Rate: 10})
	if err != nil {
		t.Fatal(err)
	}
	ctx := budget.WithWaitRecorder(context.Background())
	if budget.Waited(ctx) != 0 || budget.Waited(context.Background()) != 0 {
		t.Fatal("a new recorder, or none, has waited")
	}
	start := time.Now()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err = b.Wait(short, "") // refused at once: 100 ms does not fit in 50
	cancel()
	if err == nil {
		t.Fatal("a token with none granted")
	}
	time.Sleep(30 * time.Millisecond) // the caller's backoff
	s.set(budget.Grant{Tokens: 5, Rate: 10}, nil, 0)
	// The process waits out its RetryIn before it asks again.
	if err := b.Wait(ctx, ""); err != nil {
		t.Fatal(err)
	}
	held := time.Since(start)
	time.Sleep(20 * time.Millisecond) // after the budget: not its hold
	if w := budget.Waited(ctx); w < 100*time.Millisecond || w > held {
		t.Fatalf("waited %v, want the 100 ms the budget held the calls (at most %v)", w, held)
	}
}

// gateStore answers each Take with the next grant the test sends.
type gateStore struct {
	grants chan budget.Grant
	takes  atomic.Int64
}

func (s *gateStore) Take(ctx context.Context, _ budget.Take) (budget.Grant, error) {
	s.takes.Add(1)
	select {
	case g := <-s.grants:
		return g, nil
	case <-ctx.Done():
		return budget.Grant{}, ctx.Err()
	}
}

func (s *gateStore) Slow(context.Context, budget.Slow) (float64, bool, error) {
	return 0, false, errors.New("gate store: no slow")
}

// TestWaitIsFairBetweenMerchants: the callers waiting for the fleet's
// tokens are served round robin by merchant. Eight calls of merchant A
// wait (the first asking the store), then two of merchant B: the grants
// of two tokens each go to A's first and B's first, then A's second and
// B's second, then A's; B's calls do not wait behind A's line.
func TestWaitIsFairBetweenMerchants(t *testing.T) {
	t.Parallel()
	s := &gateStore{grants: make(chan budget.Grant)}
	b, err := budget.New(s, budget.Config{Rate: 10})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	passed := make(chan string, 16)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	call := func(merchant, name string, waiting int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.Wait(ctx, merchant); err == nil {
				passed <- name
			}
		}()
		for b.Waiting() != waiting {
			if ctx.Err() != nil {
				t.Fatalf("%s: %d callers waiting, want %d", name, b.Waiting(), waiting)
			}
			time.Sleep(time.Millisecond)
		}
	}
	for i := range 8 {
		call("m_a", fmt.Sprintf("a%d", i+1), i+1)
	}
	call("m_b", "b1", 9)
	call("m_b", "b2", 10)
	for round, want := range [][2]string{{"a1", "b1"}, {"a2", "b2"}, {"a3", "a4"}} {
		s.grants <- budget.Grant{Tokens: 2, Rate: 10}
		got := map[string]bool{}
		for range 2 {
			select {
			case name := <-passed:
				got[name] = true
			case <-ctx.Done():
				t.Fatalf("round %d: only %v passed", round+1, got)
			}
		}
		if !got[want[0]] || !got[want[1]] {
			t.Fatalf("round %d: the two tokens went to %v, want %v: the budget's wait is not fair between merchants", round+1, got, want)
		}
	}
}

// TestWaitInLineRefusesBeforeTheDeadline: a caller that waits in line
// for a token is refused (the budget's rate limit: nothing was sent) once
// half of the time its deadline left has passed, rather than be served at
// its deadline and have its request time out, an unknown outcome.
func TestWaitInLineRefusesBeforeTheDeadline(t *testing.T) {
	t.Parallel()
	s := &gateStore{grants: make(chan budget.Grant)}
	b, err := budget.New(s, budget.Config{Rate: 10})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := make(chan error, 1)
	go func() { first <- b.Wait(ctx, "m_a") }() // asks the store, which holds it
	for s.takes.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelShort()
	start := time.Now()
	err = b.Wait(short, "m_b")
	waited := time.Since(start)
	var pe *provider.Error
	if !errors.As(err, &pe) || pe.RateLimitReason != provider.ReasonBudget || short.Err() != nil {
		t.Fatalf("after %v in line: %v, want the budget's refusal before the deadline", waited, err)
	}
	if waited < 90*time.Millisecond {
		t.Fatalf("refused after %v, want about half the 200 ms the deadline left", waited)
	}
	if b.Waiting() != 1 {
		t.Fatalf("%d callers in line after the refusal, want 1", b.Waiting())
	}
	s.grants <- budget.Grant{Tokens: 1, Rate: 10}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

// TestSlowGrantIsRefusedNotSpentLate: the caller that asks the store is
// held to its giveUp (half the time its deadline left) as the callers in
// line are: a grant slower than that (the store's statement timeout is
// 2 s, a call's 10 s) is cut at the giveUp and the caller refused
// (the budget's rate limit: nothing sent), rather than handed a token
// with too little time left for its request, which would then time out
// as an unknown outcome.
func TestSlowGrantIsRefusedNotSpentLate(t *testing.T) {
	t.Parallel()
	s := &fakeStore{}
	s.set(budget.Grant{Tokens: 1, Rate: 10}, nil, 180*time.Millisecond)
	b, err := budget.New(s, budget.Config{Rate: 10})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = b.Wait(ctx, "m_a")
	waited := time.Since(start)
	dl, _ := ctx.Deadline()
	left := time.Until(dl)
	if err == nil {
		t.Fatalf("Wait granted the token with %v of 200 ms left, want at least half or a refusal", left)
	}
	var pe *provider.Error
	if !errors.As(err, &pe) || pe.RateLimitReason != provider.ReasonBudget || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("with %v left: %v, want the budget's refusal before the deadline", left, err)
	}
	if waited >= 170*time.Millisecond {
		t.Fatalf("refused after %v, when the store answered: want the grant cut at the giveUp (100 ms)", waited)
	}
	if b.Waiting() != 0 {
		t.Fatalf("%d callers in line after the refusal, want none", b.Waiting())
	}
}

// lateStore grants after delay whatever the caller's context says: the
// answer of a store that acted (the row's tokens are taken) comes back
// after the caller gave up.
type lateStore struct {
	grant budget.Grant
	delay time.Duration
	takes atomic.Int64
}

func (s *lateStore) Take(context.Context, budget.Take) (budget.Grant, error) {
	s.takes.Add(1)
	time.Sleep(s.delay) // the store's own time, not the caller's
	return s.grant, nil
}

func (s *lateStore) Slow(context.Context, budget.Slow) (float64, bool, error) {
	return 0, false, errors.New("late store: no slow")
}

// TestGrantAfterGiveUpGoesToTheLine: a grant that comes back after the
// asking caller's giveUp is not spent by it (it is refused, nothing
// sent): its token goes to the next caller in line, which has the time
// to spend it, so the token the fleet's row gave is neither spent late
// nor lost.
func TestGrantAfterGiveUpGoesToTheLine(t *testing.T) {
	t.Parallel()
	s := &lateStore{grant: budget.Grant{Tokens: 1, Rate: 10}, delay: 130 * time.Millisecond}
	b, err := budget.New(s, budget.Config{Rate: 10})
	if err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancelShort()
	first := make(chan error, 1)
	go func() { first <- b.Wait(short, "m_a") }() // asks the store
	for s.takes.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	long, cancelLong := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelLong()
	second := make(chan error, 1)
	go func() { second <- b.Wait(long, "m_b") }() // waits in line
	err = <-first
	dl, _ := short.Deadline()
	if err == nil {
		t.Fatalf("the asking caller spent a grant that came with %v of its 200 ms left", time.Until(dl))
	}
	var pe *provider.Error
	if !errors.As(err, &pe) || pe.RateLimitReason != provider.ReasonBudget || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the asking caller: %v, want the budget's refusal before its deadline", err)
	}
	select {
	case err := <-second:
		if err != nil {
			t.Fatalf("the next in line: %v, want the token given back", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the token granted after the giveUp did not go to the next in line")
	}
	if n := s.takes.Load(); n != 1 {
		t.Fatalf("%d takes, want the one grant shared", n)
	}
	if b.Waiting() != 0 {
		t.Fatalf("%d callers in line, want none", b.Waiting())
	}
}
