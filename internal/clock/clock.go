// Package clock provides the time sources injected into the stores, the
// worker, the reconciler and the gateway, so tests can move time instead of
// sleeping. Clock is the one clock type of every service; System is the
// production default.
//
// Time that decides who holds a lease never comes from a process's wall
// clock: the store lets the database's clock decide (statements take
// coalesce(@now, now()) and the wall clock passes NULL). Only a Fake clock's
// time is passed to the database, so tests can move it.
package clock

import (
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

// Fake is a clock that moves only when told to. It is safe for concurrent use.
type Fake struct {
	mu  sync.Mutex
	now time.Time
}

// NewFake returns a fake clock set to t.
func NewFake(t time.Time) *Fake { return &Fake{now: t} }

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Advance moves the fake time forward by d.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
}

// Set moves the fake time to t.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = t
}
