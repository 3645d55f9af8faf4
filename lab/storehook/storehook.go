// Package storehook wraps the worker's store for tests and the lab: the
// wrapper forwards every method to the store inside and lets a test hook
// any of them, before the store is called (to fail the Nth call, block,
// count, or kill the worker's view of the store) or after (to see or
// change the answer, or lose it as a dropped connection would). It
// replaces the hand-written forwarding wrappers the tests each kept.
// (River's testsignal plays a like part.)
//
// It is lab code, for tests only; nothing that ships imports it.
package storehook

import (
	"context"
	"sync"
	"time"

	"github.com/paydedup/paydedup/ledger"
)

// Store is the worker's store: consumer.Store's methods, restated here so
// the consumer's own tests can use the wrapper.
type Store interface {
	ClaimBatch(ctx context.Context, holder string, lease time.Duration, reqs []ledger.ClaimRequest) ([]ledger.ClaimResult, error)
	Heartbeat(ctx context.Context, l ledger.Lease, d time.Duration) (ledger.Lease, error)
	Complete(ctx context.Context, l ledger.Lease, c ledger.Completion) error
	CompleteBatch(ctx context.Context, items []ledger.CompleteItem) ([]error, error)
	Fail(ctx context.Context, l ledger.Lease, reason string) (ledger.Status, error)
	Release(ctx context.Context, l ledger.Lease, reason string) error
	RecordRefusal(ctx context.Context, r ledger.Refusal) (bool, error)
	ProviderKeyWindow() time.Duration
}

// Method names a method of Store that can be hooked.
type Method string

// The hookable methods; Any hooks every one of them.
const (
	ClaimBatch    Method = "ClaimBatch"
	Heartbeat     Method = "Heartbeat"
	Complete      Method = "Complete"
	CompleteBatch Method = "CompleteBatch"
	Fail          Method = "Fail"
	Release       Method = "Release"
	RecordRefusal Method = "RecordRefusal"
	Any           Method = "*"
)

// Call is one call of the store as its hooks see it: the arguments, which
// the method's name says are set, and, for an after hook, the answer.
type Call struct {
	Method Method
	// N counts the calls of this method, from 1.
	N int

	Holder string                // ClaimBatch
	Lease  ledger.Lease          // Heartbeat, Complete, Fail, Release
	Reqs   []ledger.ClaimRequest // ClaimBatch
	Items  []ledger.CompleteItem // CompleteBatch
	// Reason is Fail's and Release's reason.
	Reason     string
	Completion ledger.Completion // Complete
	Refusal    ledger.Refusal    // RecordRefusal

	// The answer, set when an after hook runs: Err is the call's error,
	// Results ClaimBatch's, Errs CompleteBatch's, Status Fail's, Renewed
	// Heartbeat's lease, and Wrote RecordRefusal's.
	Err     error
	Results []ledger.ClaimResult
	Errs    []error
	Status  ledger.Status
	Renewed ledger.Lease
	Wrote   bool
}

// Hook runs around a call. A before hook's error is the call's answer and
// the store is not called; an after hook's error replaces the answer (its
// other values are dropped), as when a connection drops after the
// database committed.
type Hook func(ctx context.Context, c *Call) error

// Wrapper is a Store that forwards to the one inside through its hooks.
// It is safe for concurrent use; hooks run on the caller's goroutine, so a
// hook that shares state must guard it.
type Wrapper struct {
	inner Store

	mu     sync.Mutex
	calls  map[Method]int
	before map[Method][]Hook
	after  map[Method][]Hook
}

// Wrap returns a wrapper of s with no hooks: it forwards every call.
func Wrap(s Store) *Wrapper {
	return &Wrapper{inner: s, calls: map[Method]int{}, before: map[Method][]Hook{}, after: map[Method][]Hook{}}
}

// Before adds a hook run before each call of m (or of every method, Any).
func (w *Wrapper) Before(m Method, h Hook) *Wrapper {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.before[m] = append(w.before[m], h)
	return w
}

// After adds a hook run after each call of m that reached the store.
func (w *Wrapper) After(m Method, h Hook) *Wrapper {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.after[m] = append(w.after[m], h)
	return w
}

// Calls reports how many calls of m (of every method, Any) were made,
// including those a before hook answered.
func (w *Wrapper) Calls(m Method) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if m == Any {
		n := 0
		for _, c := range w.calls {
			n += c
		}
		return n
	}
	return w.calls[m]
}

// start counts the call and returns it with the hooks to run around it.
func (w *Wrapper) start(c *Call) (before, after []Hook) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls[c.Method]++
	c.N = w.calls[c.Method]
	before = append(append(before, w.before[Any]...), w.before[c.Method]...)
	after = append(append(after, w.after[Any]...), w.after[c.Method]...)
	return before, after
}

// call runs c's hooks around do, which calls the store and fills in c's
// answer. It reports whether the answer is the store's (false: a hook's
// error replaced it).
func (w *Wrapper) call(ctx context.Context, c *Call, do func()) bool {
	before, after := w.start(c)
	for _, h := range before {
		if err := h(ctx, c); err != nil {
			c.Err = err
			return false
		}
	}
	do()
	for _, h := range after {
		if err := h(ctx, c); err != nil {
			c.Err = err
			return false
		}
	}
	return true
}

// ClaimBatch forwards to the store's ClaimBatch.
func (w *Wrapper) ClaimBatch(ctx context.Context, holder string, lease time.Duration, reqs []ledger.ClaimRequest) ([]ledger.ClaimResult, error) {
	c := &Call{Method: ClaimBatch, Holder: holder, Reqs: reqs}
	if !w.call(ctx, c, func() { c.Results, c.Err = w.inner.ClaimBatch(ctx, holder, lease, reqs) }) {
		return nil, c.Err
	}
	return c.Results, c.Err
}

// Heartbeat forwards to the store's Heartbeat.
func (w *Wrapper) Heartbeat(ctx context.Context, l ledger.Lease, d time.Duration) (ledger.Lease, error) {
	c := &Call{Method: Heartbeat, Lease: l}
	if !w.call(ctx, c, func() { c.Renewed, c.Err = w.inner.Heartbeat(ctx, l, d) }) {
		return l, c.Err
	}
	return c.Renewed, c.Err
}

// Complete forwards to the store's Complete.
func (w *Wrapper) Complete(ctx context.Context, l ledger.Lease, comp ledger.Completion) error {
	c := &Call{Method: Complete, Lease: l, Completion: comp}
	w.call(ctx, c, func() { c.Err = w.inner.Complete(ctx, l, comp) })
	return c.Err
}

// CompleteBatch forwards to the store's CompleteBatch.
func (w *Wrapper) CompleteBatch(ctx context.Context, items []ledger.CompleteItem) ([]error, error) {
	c := &Call{Method: CompleteBatch, Items: items}
	if !w.call(ctx, c, func() { c.Errs, c.Err = w.inner.CompleteBatch(ctx, items) }) {
		return nil, c.Err
	}
	return c.Errs, c.Err
}

// Fail forwards to the store's Fail.
func (w *Wrapper) Fail(ctx context.Context, l ledger.Lease, reason string) (ledger.Status, error) {
	c := &Call{Method: Fail, Lease: l, Reason: reason}
	if !w.call(ctx, c, func() { c.Status, c.Err = w.inner.Fail(ctx, l, reason) }) {
		return "", c.Err
	}
	return c.Status, c.Err
}

// Release forwards to the store's Release.
func (w *Wrapper) Release(ctx context.Context, l ledger.Lease, reason string) error {
	c := &Call{Method: Release, Lease: l, Reason: reason}
	w.call(ctx, c, func() { c.Err = w.inner.Release(ctx, l, reason) })
	return c.Err
}

// RecordRefusal forwards to the store's RecordRefusal.
func (w *Wrapper) RecordRefusal(ctx context.Context, r ledger.Refusal) (bool, error) {
	c := &Call{Method: RecordRefusal, Refusal: r}
	if !w.call(ctx, c, func() { c.Wrote, c.Err = w.inner.RecordRefusal(ctx, r) }) {
		return false, c.Err
	}
	return c.Wrote, c.Err
}

// ProviderKeyWindow forwards to the store's; it is not hooked.
func (w *Wrapper) ProviderKeyWindow() time.Duration { return w.inner.ProviderKeyWindow() }

// FailNth returns a before hook that answers the nth call of the hooked
// method (Call.N) with err, and lets every other call through.
func FailNth(n int, err error) Hook {
	return func(_ context.Context, c *Call) error {
		if c.N == n {
			return err
		}
		return nil
	}
}
