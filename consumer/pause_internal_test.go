package consumer

import (
	"errors"
	"fmt"
	"testing"
	"time"

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
