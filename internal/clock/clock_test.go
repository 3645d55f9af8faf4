package clock_test

import (
	"context"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/clock"
)

// TestFakeTimersFireWhenTheTimeMoves: a fake's timer fires when Advance or
// Set reaches its time, not before, earliest first; a stopped one never
// does; BlockUntil returns once the code under test waits.
func TestFakeTimersFireWhenTheTimeMoves(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	waited := make(chan time.Time)
	go func() {
		tm := clock.NewTimer(clk, time.Second)
		waited <- <-tm.C()
	}()
	if err := clk.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second - time.Nanosecond)
	select {
	case at := <-waited:
		t.Fatalf("timer of 1s fired at %v, after 1s-1ns", at)
	default:
	}
	clk.Advance(time.Nanosecond)
	if at := <-waited; !at.Equal(t0.Add(time.Second)) {
		t.Fatalf("fired at %v, want %v", at, t0.Add(time.Second))
	}

	late, early, stopped := clk.NewTimer(3*time.Second), clk.NewTimer(2*time.Second), clk.NewTimer(time.Second)
	if n := clk.Waiting(); n != 3 {
		t.Fatalf("Waiting = %d, want 3", n)
	}
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop of a pending timer must report true once")
	}
	clk.Set(t0.Add(time.Hour))
	if len(early.C()) != 1 || len(late.C()) != 1 || len(stopped.C()) != 0 || clk.Waiting() != 0 {
		t.Fatalf("after Set past them: early %d late %d stopped %d waiting %d, want 1 1 0 0",
			len(early.C()), len(late.C()), len(stopped.C()), clk.Waiting())
	}
	if early.Stop() {
		t.Fatal("Stop of a fired timer reported true")
	}
	if now := clk.NewTimer(0); len(now.C()) != 1 {
		t.Fatal("a timer of 0 must fire at once")
	}
}

// TestNewTimerOfTheSystemClock: the system clock's timers are the
// runtime's.
func TestNewTimerOfTheSystemClock(t *testing.T) {
	tm := clock.NewTimer(clock.System{Offset: time.Hour}, time.Millisecond)
	select {
	case <-tm.C():
	case <-time.After(10 * time.Second):
		t.Fatal("a 1 ms system timer did not fire")
	}
}
