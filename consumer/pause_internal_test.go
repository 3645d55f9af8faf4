package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
)

// TestGateTellsOutageFromLoneFailure is the rule of OutageAnswers and
// OutageKeys, answer by answer: "ok" is an answer that shows the provider
// works, any other word a call of that key that ended unavailable.
func TestGateTellsOutageFromLoneFailure(t *testing.T) {
	tests := []struct {
		name    string
		answers []string
		paused  bool
	}{
		{"one key failing again and again", []string{"a", "a", "a", "a", "a", "a", "a", "a", "a", "a"}, false},
		{"two keys failing in turn", []string{"a", "b", "a", "b", "a", "b", "a", "b"}, false},
		{"three keys, four answers", []string{"a", "b", "c", "a"}, false},
		{"three keys, five answers", []string{"a", "b", "c", "a", "b"}, true},
		{"five keys", []string{"a", "b", "c", "d", "e"}, true},
		{"an answer between", []string{"a", "b", "c", "d", "ok", "e", "f", "g", "h"}, false},
		{"an answer, then five", []string{"a", "b", "ok", "c", "d", "e", "f", "g"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newGate(time.Minute, time.Hour, time.Now)
			var paused bool
			for _, a := range tt.answers {
				if a == "ok" {
					g.answered()
					continue
				}
				paused = g.unavailable(a, errors.New("429"))
			}
			if paused != tt.paused || (g.closed.Load() != tt.paused) {
				t.Fatalf("paused %v (gate closed %v), want %v", paused, g.closed.Load(), tt.paused)
			}
			if tt.paused {
				if cause, _, _, _, _ := g.state(); cause != PauseProviderUnavailable {
					t.Fatalf("cause %q", cause)
				}
				g.answered()
				if g.closed.Load() {
					t.Fatal("an answer did not open the gate")
				}
			}
		})
	}
}

// Each cause is opened only by what shows it gone.
func TestGateCauses(t *testing.T) {
	g := newGate(time.Minute, time.Hour, time.Now)
	if c := g.storeFailed(fmt.Errorf("claim keys: %w", ledger.ErrLeaseLost)); c != "" || g.closed.Load() {
		t.Fatalf("a lost lease paused the worker (%q)", c)
	}
	if c := g.storeFailed(fmt.Errorf("claim keys: %w: connection refused", ledger.ErrUnavailable)); c != PauseStoreUnavailable {
		t.Fatalf("cause %q, want %q", c, PauseStoreUnavailable)
	}
	g.answered()
	if !g.closed.Load() {
		t.Fatal("a provider answer opened a pause for PostgreSQL")
	}
	g.storeWorks()
	if g.closed.Load() {
		t.Fatal("a statement that reached PostgreSQL did not open the gate")
	}
	g.close(PauseProviderAuth, errors.New("401"))
	g.storeWorks()
	if !g.closed.Load() {
		t.Fatal("PostgreSQL opened a pause for the API key")
	}
	g.keyWorks()
	if g.closed.Load() {
		t.Fatal("an answer that was no refusal did not open the API key's pause")
	}
	for _, tt := range []struct {
		err  error
		want bool
	}{
		// A rate limit is the account's budget, never an outage; not even
		// after an unknown outcome made the call's error unknown.
		{&provider.Error{Class: provider.ClassRetryable, HTTPStatus: 429}, false},
		{&provider.Error{Class: provider.ClassUnknown, HTTPStatus: 429, Code: "rate_limit"}, false},
		{&provider.Error{Class: provider.ClassRetryable, RateLimitReason: provider.ReasonBudget}, false},
		{&provider.Error{Class: provider.ClassRetryable}, true}, // a refused dial
		{&provider.Error{Class: provider.ClassUnknown, HTTPStatus: 503}, true},
		{&provider.Error{Class: provider.ClassUnknown}, true}, // no answer
		{&provider.Error{Class: provider.ClassUnknown, HTTPStatus: 409}, false},
		{&provider.Error{Class: provider.ClassRejected, HTTPStatus: 400}, false},
		{&provider.Error{Class: provider.ClassUnauthorized, HTTPStatus: 401}, false},
		{errors.New("not a provider error"), false},
	} {
		if got := providerUnavailable(tt.err); got != tt.want {
			t.Errorf("providerUnavailable(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// One held message probes when a pause ends; a failed probe doubles the
// pause, up to the longest. The gate reads the worker's clock: a fake one
// moved to the pause's last instant, then past it, instead of waiting.
func TestGateProbes(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	g := newGate(time.Minute, 4*time.Minute, clk.Now)
	g.close(PauseProviderUnavailable, errors.New("503"))
	for i, pause := range []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 4 * time.Minute, 4 * time.Minute} {
		if open, probing, wait, _ := g.probe(); open || probing || wait != pause {
			t.Fatalf("pause %d: open %v, probing %v, wait %v, want a wait of %v", i+1, open, probing, wait, pause)
		}
		clk.Advance(pause - time.Nanosecond)
		if _, probing, _, _ := g.probe(); probing {
			t.Fatalf("pause %d: a probe before the pause ended", i+1)
		}
		clk.Advance(time.Nanosecond)
		if _, probing, _, _ := g.probe(); !probing {
			t.Fatalf("pause %d: no probe when the pause ended", i+1)
		}
		if _, again, _, _ := g.probe(); again {
			t.Fatal("two probes at once")
		}
		if _, _, streak, _, _ := g.state(); streak != i+1 {
			t.Fatalf("streak %d, want %d", streak, i+1)
		}
		g.probed(true)
	}
}

// progressMsg is a held message: it counts the in-progress beats.
type progressMsg struct {
	jetstream.Msg
	beats atomic.Int32
}

func (m *progressMsg) InProgress() error { m.beats.Add(1); return nil }

// A held message waits out the pause on the worker's clock (Config.Clock),
// the gate's own: a test moves a fake one instead of sleeping. It probes
// when the pause ends, not before; a second held message waits while the
// first probes and runs again when the gate opens; a stop lets it go.
func TestHeldMessageWaitsThePauseOnTheClock(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	stop := make(chan struct{})
	g := newGate(time.Minute, 4*time.Minute, clk.Now)
	// A lease of an hour: no in-progress beat (monotonic, as the server's
	// AckWait is) falls inside the test.
	w := &Worker{cfg: Config{Lease: time.Hour, Clock: clk}, proc: &Processor{gate: g}, stop: stop}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type waited struct{ ok, probing bool }
	await := func() (*progressMsg, <-chan waited) {
		msg, done := &progressMsg{}, make(chan waited, 1)
		go func() {
			last := time.Now()
			ok, probing := w.await(&inbound{msg: msg}, &last)
			done <- waited{ok, probing}
		}()
		return msg, done
	}
	returned := func(done <-chan waited) (waited, bool) {
		select {
		case r := <-done:
			return r, true
		default:
			return waited{}, false
		}
	}

	g.close(PauseProviderUnavailable, errors.New("503"))
	first, done1 := await()
	if err := clk.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute - time.Nanosecond)
	if r, ok := returned(done1); ok {
		t.Fatalf("the held message stopped waiting (%+v) before the pause ended", r)
	}
	clk.Advance(time.Nanosecond)
	if r := <-done1; !r.ok || !r.probing {
		t.Fatalf("at the pause's end: %+v, want the held message to probe", r)
	}

	// While it probes, another held message waits (a pause's first length
	// at most) and runs again when the probe opens the gate.
	_, done2 := await()
	if err := clk.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if r, ok := returned(done2); ok {
		t.Fatalf("a second message stopped waiting (%+v) while the first probes", r)
	}
	g.answered()
	if r := <-done2; !r.ok || r.probing {
		t.Fatalf("when the gate opened: %+v, want it to run again, not probe", r)
	}

	// A stop during a pause lets a held message go.
	g.close(PauseStoreUnavailable, errors.New("connection refused"))
	_, done3 := await()
	if err := clk.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	close(stop)
	if r := <-done3; r.ok {
		t.Fatalf("after a stop: %+v, want the message let go", r)
	}
	if n := first.beats.Load(); n != 0 {
		t.Fatalf("%d in-progress beats inside a lease of an hour, want 0", n)
	}
	if n := clk.Waiting(); n != 0 {
		t.Fatalf("%d timers left waiting on the clock", n)
	}
}
