// Package clock provides the time sources injected into the stores, the
// worker, the reconciler and the gateway, so tests can move time instead of
// sleeping. Clock is the one clock type of every service; System is the
// production default. Waits on a clock's time take their timer from
// NewTimer: the runtime's for System, one that fires when the test moves the
// time for Fake.
//
// Time that decides who holds a lease never comes from a process's wall
// clock: the store lets the database's clock decide (statements take
// coalesce(@now, now()) and the wall clock passes NULL). Only a Fake clock's
// time is passed to the database, so tests can move it.
package clock

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Clock tells the time.
type Clock interface {
	Now() time.Time
}

// System is the process's wall clock. Offset shifts it, to stand for a host
// whose clock is wrong (tests of clock skew); production leaves it zero.
type System struct {
	Offset time.Duration
}

// Now returns time.Now() shifted by Offset.
func (s System) Now() time.Time { return time.Now().Add(s.Offset) }

// Wall reports that this is a process's wall clock: a store given it lets
// the database's clock decide lease times instead.
func (System) Wall() bool { return true }

// Timer is a one-shot timer of a Clock (see NewTimer).
type Timer interface {
	// C receives once, when the timer fires.
	C() <-chan time.Time
	// Stop keeps the timer from firing; it reports whether it did (false:
	// it had fired or was stopped already).
	Stop() bool
}

// Timers is a Clock that makes timers on its own time, as Fake does.
type Timers interface {
	Clock
	NewTimer(d time.Duration) Timer
}

// NewTimer returns a timer that fires once c's time has moved on by d: c's
// own timer when c makes them (a Fake: it fires when the test moves the
// time), else the runtime's (System: an Offset shifts no duration).
func NewTimer(c Clock, d time.Duration) Timer {
	if t, ok := c.(Timers); ok {
		return t.NewTimer(d)
	}
	return runtimeTimer{time.NewTimer(d)}
}

type runtimeTimer struct{ t *time.Timer }

func (r runtimeTimer) C() <-chan time.Time { return r.t.C }
func (r runtimeTimer) Stop() bool          { return r.t.Stop() }

// Fake is a clock that moves only when told to. It is safe for concurrent use.
// Its timers (NewTimer) fire when Advance or Set moves it to their time.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*fakeTimer  // pending, in no order
	changed chan struct{} // closed when a timer is added
}

// NewFake returns a fake clock set to t.
func NewFake(t time.Time) *Fake { return &Fake{now: t} }

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Advance moves the fake time forward by d, and fires the timers it
// reaches.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	f.fireLocked()
}

// Set moves the fake time to t, and fires the timers it reaches.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = t
	f.fireLocked()
}

// NewTimer returns a timer that fires when the fake time reaches now + d:
// at once when d <= 0.
func (f *Fake) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTimer{f: f, at: f.now.Add(d), c: make(chan time.Time, 1)}
	if d <= 0 {
		t.c <- f.now
		return t
	}
	f.timers = append(f.timers, t)
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
	return t
}

// Waiting is how many of the fake's timers have not fired nor been
// stopped.
func (f *Fake) Waiting() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// BlockUntil waits until at least n of the fake's timers wait (Waiting), so
// that a test moves the time only once the code under test waits on it. It
// returns ctx's error if ctx ends first.
func (f *Fake) BlockUntil(ctx context.Context, n int) error {
	for {
		f.mu.Lock()
		if len(f.timers) >= n {
			f.mu.Unlock()
			return nil
		}
		if f.changed == nil {
			f.changed = make(chan struct{})
		}
		changed := f.changed
		f.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// fireLocked fires, earliest first, the timers the fake time reached.
func (f *Fake) fireLocked() {
	var due []*fakeTimer
	f.timers = slices.DeleteFunc(f.timers, func(t *fakeTimer) bool {
		if t.at.After(f.now) {
			return false
		}
		due = append(due, t)
		return true
	})
	slices.SortStableFunc(due, func(a, b *fakeTimer) int { return a.at.Compare(b.at) })
	for _, t := range due {
		t.c <- f.now
	}
}

type fakeTimer struct {
	f  *Fake
	at time.Time
	c  chan time.Time // buffered: a timer fires once
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	n := len(t.f.timers)
	t.f.timers = slices.DeleteFunc(t.f.timers, func(o *fakeTimer) bool { return o == t })
	return len(t.f.timers) < n
}
