package provider_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/provider"
)

// step is one scripted answer of a fake provider.
type step func(ctx context.Context) (*provider.Outcome, error)

func answer(out *provider.Outcome, err error) step {
	return func(context.Context) (*provider.Outcome, error) { return out, err }
}

func fail(c provider.Class) step {
	return answer(nil, &provider.Error{Class: c, Message: "scripted " + c.String()})
}

// hang blocks until the attempt's context ends, like a provider that never
// answers.
func hang(ctx context.Context) (*provider.Outcome, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// scripted is a Charger answering from a script and recording every call.
type scripted struct {
	mu    sync.Mutex
	steps []step
	keys  []string
	times []time.Time
}

func (s *scripted) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	s.mu.Lock()
	s.keys = append(s.keys, req.ProviderKey)
	s.times = append(s.times, time.Now())
	next := s.steps[0]
	if len(s.steps) > 1 {
		s.steps = s.steps[1:]
	}
	s.mu.Unlock()
	return next(ctx)
}

func (s *scripted) calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

var chargedOutcome = &provider.Outcome{ChargeID: "pi_1", Status: "succeeded", HTTPStatus: 200}

// fast keeps scripted retries quick.
var fast = provider.RetryPolicy{MaxTries: 3, AttemptTimeout: time.Second, InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond}

func TestChargeWithRetry(t *testing.T) {
	t.Parallel()
	declined := &provider.Outcome{ChargeID: "pi_d", Declined: true, DeclineCode: "generic_decline", HTTPStatus: 402}
	tests := []struct {
		name      string
		steps     []step
		wantOut   *provider.Outcome
		wantClass provider.Class
		wantCalls int
	}{
		{"success first try", []step{answer(chargedOutcome, nil)}, chargedOutcome, 0, 1},
		{"declined stops at once", []step{answer(declined, nil), answer(chargedOutcome, nil)}, declined, 0, 1},
		{"mismatch never retried", []step{fail(provider.ClassMismatch), answer(chargedOutcome, nil)}, nil, provider.ClassMismatch, 1},
		{"declined error never retried", []step{fail(provider.ClassDeclined), answer(chargedOutcome, nil)}, nil, provider.ClassDeclined, 1},
		{"unknown retried then chargedOutcome", []step{fail(provider.ClassUnknown), answer(chargedOutcome, nil)}, chargedOutcome, 0, 2},
		{"retryable retried then chargedOutcome", []step{fail(provider.ClassRetryable), fail(provider.ClassRetryable), answer(chargedOutcome, nil)}, chargedOutcome, 0, 3},
		{"tries run out", []step{fail(provider.ClassRetryable)}, nil, provider.ClassRetryable, 3},
		{"unknown sticks over a later retryable", []step{fail(provider.ClassUnknown), fail(provider.ClassRetryable), fail(provider.ClassRetryable)}, nil, provider.ClassUnknown, 3},
		{"unknown sticks from the middle", []step{fail(provider.ClassRetryable), fail(provider.ClassUnknown), fail(provider.ClassRetryable)}, nil, provider.ClassUnknown, 3},
		{"decline after unknown is definitive", []step{fail(provider.ClassUnknown), answer(declined, nil)}, declined, 0, 2},
		{"bare error is unknown", []step{answer(nil, errors.New("boom"))}, nil, provider.ClassUnknown, 3},
		{"no outcome and no error is unknown", []step{answer(nil, nil)}, nil, provider.ClassUnknown, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := &scripted{steps: tt.steps}
			req := chargeReq("k-retry")
			out, err := provider.ChargeWithRetry(context.Background(), c, req, fast)
			if tt.wantOut != nil {
				if err != nil || out != tt.wantOut {
					t.Fatalf("got %+v, %v; want %+v", out, err, tt.wantOut)
				}
			} else {
				wantClass(t, err, tt.wantClass)
				if out != nil {
					t.Fatalf("outcome = %+v with error", out)
				}
			}
			if c.calls() != tt.wantCalls {
				t.Fatalf("calls = %d, want %d", c.calls(), tt.wantCalls)
			}
			for _, k := range c.keys {
				if k != req.ProviderKey {
					t.Fatalf("provider keys = %v, want all %s", c.keys, req.ProviderKey)
				}
			}
		})
	}
}

func TestChargeWithRetryStickyUnknownKeepsLastError(t *testing.T) {
	t.Parallel()
	rateLimited := &provider.Error{Class: provider.ClassRetryable, HTTPStatus: 429, RetryAfter: time.Millisecond}
	c := &scripted{steps: []step{fail(provider.ClassUnknown), answer(nil, rateLimited)}}
	pol := fast
	pol.MaxTries = 2
	_, err := provider.ChargeWithRetry(context.Background(), c, chargeReq("k"), pol)
	pe := wantClass(t, err, provider.ClassUnknown)
	if pe.HTTPStatus != 429 || !errors.Is(err, rateLimited) {
		t.Fatalf("err = %+v, want the 429 kept inside an unknown outcome", pe)
	}
}

func TestChargeWithRetryContextDeadline(t *testing.T) {
	t.Parallel()
	c := &scripted{steps: []step{hang}}
	pol := provider.RetryPolicy{MaxTries: 5, AttemptTimeout: 10 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := provider.ChargeWithRetry(ctx, c, chargeReq("k"), pol)
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Fatalf("returned after %s, want promptly after the 100ms deadline", elapsed)
	}
	wantClass(t, err, provider.ClassUnknown)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want it to wrap the deadline", err)
	}
	if c.calls() != 1 {
		t.Fatalf("calls = %d, want 1", c.calls())
	}
}

func TestChargeWithRetryNeverSleepsPastDeadline(t *testing.T) {
	t.Parallel()
	c := &scripted{steps: []step{fail(provider.ClassRetryable)}}
	pol := provider.RetryPolicy{MaxTries: 5, AttemptTimeout: time.Second, InitialInterval: 5 * time.Second, MaxInterval: 5 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := provider.ChargeWithRetry(ctx, c, chargeReq("k"), pol)
	if elapsed := time.Since(start); elapsed > 150*time.Millisecond {
		t.Fatalf("returned after %s: it waited for a backoff that ends past the deadline", elapsed)
	}
	// The attempt's own error, not context.DeadlineExceeded.
	wantClass(t, err, provider.ClassRetryable)
	if errors.Is(err, context.DeadlineExceeded) || c.calls() != 1 {
		t.Fatalf("err = %v after %d calls", err, c.calls())
	}
}

func TestChargeWithRetryCanceledWhileWaiting(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	c := &scripted{steps: []step{func(context.Context) (*provider.Outcome, error) {
		cancel() // the caller gives up while we back off
		return nil, &provider.Error{Class: provider.ClassUnknown, HTTPStatus: 500}
	}}}
	pol := provider.RetryPolicy{MaxTries: 3, InitialInterval: time.Minute, MaxInterval: time.Minute}
	_, err := provider.ChargeWithRetry(ctx, c, chargeReq("k"), pol)
	pe := wantClass(t, err, provider.ClassUnknown)
	if pe.HTTPStatus != 500 {
		t.Fatalf("err = %+v, want the attempt's error rather than context.Canceled", pe)
	}
}

func TestChargeWithRetryNotAttemptedAfterContextEnd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c := &scripted{steps: []step{answer(chargedOutcome, nil)}}
	_, err := provider.ChargeWithRetry(ctx, c, chargeReq("k"), fast)
	wantClass(t, err, provider.ClassUnknown)
	if c.calls() != 0 || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v after %d calls", err, c.calls())
	}
}

func TestChargeWithRetryHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	const hint = 300 * time.Millisecond
	c := &scripted{steps: []step{
		answer(nil, &provider.Error{Class: provider.ClassRetryable, HTTPStatus: 429, RetryAfter: hint}),
		answer(chargedOutcome, nil),
	}}
	pol := provider.RetryPolicy{MaxTries: 3, AttemptTimeout: time.Second, InitialInterval: time.Millisecond, MaxInterval: time.Second}
	out, err := provider.ChargeWithRetry(context.Background(), c, chargeReq("k"), pol)
	if err != nil || out != chargedOutcome {
		t.Fatalf("got %+v, %v", out, err)
	}
	if gap := c.times[1].Sub(c.times[0]); gap < hint {
		t.Fatalf("retried after %s, want at least the Retry-After %s", gap, hint)
	}
}

func TestChargeWithRetryAfterPastDeadlineStops(t *testing.T) {
	t.Parallel()
	c := &scripted{steps: []step{
		answer(nil, &provider.Error{Class: provider.ClassRetryable, HTTPStatus: 429, RetryAfter: time.Second}),
		answer(chargedOutcome, nil),
	}}
	pol := provider.RetryPolicy{MaxTries: 3, AttemptTimeout: time.Second, InitialInterval: time.Millisecond, MaxInterval: 2 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := provider.ChargeWithRetry(ctx, c, chargeReq("k"), pol)
	if elapsed := time.Since(start); elapsed > 200*time.Millisecond {
		t.Fatalf("returned after %s, want at once", elapsed)
	}
	pe := wantClass(t, err, provider.ClassRetryable)
	if pe.RetryAfter != time.Second || c.calls() != 1 {
		t.Fatalf("err = %+v after %d calls, want the 429 with its hint", pe, c.calls())
	}
}

func TestChargeWithRetryAfterBeyondMaxIntervalStops(t *testing.T) {
	t.Parallel()
	c := &scripted{steps: []step{
		answer(nil, &provider.Error{Class: provider.ClassRetryable, HTTPStatus: 429, RetryAfter: time.Minute}),
		answer(chargedOutcome, nil),
	}}
	_, err := provider.ChargeWithRetry(context.Background(), c, chargeReq("k"), fast)
	pe := wantClass(t, err, provider.ClassRetryable)
	if pe.RetryAfter != time.Minute || c.calls() != 1 {
		t.Fatalf("err = %+v after %d calls; a hint beyond MaxInterval is the caller's to honour", pe, c.calls())
	}
}

func TestRetryPolicyDefaultsAndBudget(t *testing.T) {
	t.Parallel()
	d := provider.RetryPolicy{}.WithDefaults()
	if d.MaxTries != provider.DefaultMaxTries || d.AttemptTimeout != provider.DefaultAttemptTimeout ||
		d.InitialInterval != provider.DefaultInitialInterval || d.MaxInterval != provider.DefaultMaxInterval {
		t.Fatalf("defaults = %+v", d)
	}
	if got, want := (provider.RetryPolicy{}).Budget(), 3*10*time.Second+2*2*time.Second; got != want {
		t.Fatalf("default budget = %s, want %s", got, want)
	}
	p := provider.RetryPolicy{MaxTries: 5, AttemptTimeout: 2 * time.Second, InitialInterval: time.Second, MaxInterval: 3 * time.Second}
	if got, want := p.Budget(), 5*2*time.Second+4*3*time.Second; got != want {
		t.Fatalf("budget = %s, want %s", got, want)
	}
}

func TestChargeWithRetryBudgetHolds(t *testing.T) {
	t.Parallel()
	c := &scripted{steps: []step{hang}}
	pol := provider.RetryPolicy{MaxTries: 3, AttemptTimeout: 100 * time.Millisecond, InitialInterval: 50 * time.Millisecond, MaxInterval: 100 * time.Millisecond}
	start := time.Now()
	_, err := provider.ChargeWithRetry(context.Background(), c, chargeReq("k"), pol)
	elapsed := time.Since(start)
	wantClass(t, err, provider.ClassUnknown)
	// Scheduling slack aside, the call must fit its budget.
	if elapsed > pol.Budget()+250*time.Millisecond || c.calls() != 3 {
		t.Fatalf("took %s for %d calls, budget %s", elapsed, c.calls(), pol.Budget())
	}
}
