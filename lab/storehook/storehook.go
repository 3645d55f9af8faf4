// Package storehook wraps the worker's store for tests and the lab: the
// wrapper forwards every method to the store inside and lets a test hook
// any of them, before the store is called (to fail the Nth call, block,
// count, or kill the worker's view of the store) or after (to see or
// change the answer, or lose it as a dropped connection would). It
// replaces the hand-written forwarding wrappers the tests each kept.
// (River's testsignal plays a like part.)
//
// The worker finds a store's refunds and payment operations (captures and
// cancels) by a type assertion (consumer.RefundStore,
// consumer.PaymentOpStore) and dead-letters those commands when its store
// has none. A wrapper keeps that true: Wrap returns a wrapper whose
// dynamic type has the refunds' methods exactly when the store inside has
// them, and the payment operations' likewise (one of four types, behind
// the Wrapper interface), so a wrapped store takes the commands the store
// takes, no more and no fewer.
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

// RefundStore is consumer.RefundStore, restated: the optional part of a
// store that takes refunds.
type RefundStore interface {
	ClaimRefund(ctx context.Context, holder string, lease time.Duration, req ledger.RefundRequest) (ledger.RefundClaim, error)
	CompleteRefund(ctx context.Context, l ledger.Lease, c ledger.RefundCompletion) error
	ReleaseRefund(ctx context.Context, l ledger.Lease, reason string) error
}

// PaymentOpStore is consumer.PaymentOpStore, restated: the optional part
// of a store that takes captures and cancels.
type PaymentOpStore interface {
	ClaimPaymentOp(ctx context.Context, holder string, lease time.Duration, req ledger.PaymentOpRequest) (ledger.PaymentOpClaim, error)
	CompletePaymentOp(ctx context.Context, l ledger.Lease, c ledger.PaymentOpCompletion) error
	ReleasePaymentOp(ctx context.Context, l ledger.Lease, reason string) error
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

	ClaimRefund       Method = "ClaimRefund"
	CompleteRefund    Method = "CompleteRefund"
	ReleaseRefund     Method = "ReleaseRefund"
	ClaimPaymentOp    Method = "ClaimPaymentOp"
	CompletePaymentOp Method = "CompletePaymentOp"
	ReleasePaymentOp  Method = "ReleasePaymentOp"

	Any Method = "*"
)

// Call is one call of the store as its hooks see it: the arguments, which
// the method's name says are set, and, for an after hook, the answer.
type Call struct {
	Method Method
	// N counts the calls of this method, from 1.
	N int

	// Holder is ClaimBatch's, ClaimRefund's and ClaimPaymentOp's.
	Holder string
	// Lease is the lease of Heartbeat, Complete, Fail, Release and of the
	// refunds' and payment operations' completes and releases.
	Lease ledger.Lease
	Reqs  []ledger.ClaimRequest // ClaimBatch
	Items []ledger.CompleteItem // CompleteBatch
	// Reason is the reason of Fail, Release, ReleaseRefund and
	// ReleasePaymentOp.
	Reason              string
	Completion          ledger.Completion          // Complete
	Refusal             ledger.Refusal             // RecordRefusal
	RefundReq           ledger.RefundRequest       // ClaimRefund
	RefundCompletion    ledger.RefundCompletion    // CompleteRefund
	PaymentOpReq        ledger.PaymentOpRequest    // ClaimPaymentOp
	PaymentOpCompletion ledger.PaymentOpCompletion // CompletePaymentOp

	// The answer, set when an after hook runs: Err is the call's error,
	// Results ClaimBatch's, Errs CompleteBatch's, Status Fail's, Renewed
	// Heartbeat's lease, Wrote RecordRefusal's, RefundClaim ClaimRefund's
	// and PaymentOpClaim ClaimPaymentOp's.
	Err            error
	Results        []ledger.ClaimResult
	Errs           []error
	Status         ledger.Status
	Renewed        ledger.Lease
	Wrote          bool
	RefundClaim    ledger.RefundClaim
	PaymentOpClaim ledger.PaymentOpClaim
}

// Hook runs around a call. A before hook's error is the call's answer and
// the store is not called; an after hook's error replaces the answer (its
// other values are dropped), as when a connection drops after the
// database committed.
type Hook func(ctx context.Context, c *Call) error

// Wrapper is a Store that forwards to the one inside through its hooks.
// Its dynamic type is also a RefundStore when the store inside is one,
// and a PaymentOpStore likewise, never when the store is not (an
// interface, since one static type either has a method or has not: a
// wrapper with every method would take refunds for a store without them).
// It is safe for concurrent use; hooks run on the caller's goroutine, so a
// hook that shares state must guard it.
type Wrapper interface {
	Store
	// Before adds a hook run before each call of m (or of every method,
	// Any), and returns the wrapper.
	Before(m Method, h Hook) Wrapper
	// After adds a hook run after each call of m that reached the store,
	// and returns the wrapper.
	After(m Method, h Hook) Wrapper
	// Calls reports how many calls of m (of every method, Any) were made,
	// including those a before hook answered.
	Calls(m Method) int
}

// hooks is a wrapper's hooks and counts, and its charges' methods.
type hooks struct {
	inner Store
	self  Wrapper // the wrapper hooks is part of, which Before and After return

	mu     sync.Mutex
	calls  map[Method]int
	before map[Method][]Hook
	after  map[Method][]Hook
}

// refunds forwards the refunds' methods to rs through h's hooks.
type refunds struct {
	h  *hooks
	rs RefundStore
}

// paymentOps forwards the captures' and cancels' methods to ps through
// h's hooks.
type paymentOps struct {
	h  *hooks
	ps PaymentOpStore
}

// The wrappers, one per set of the store's optional parts.
type (
	withRefunds struct {
		*hooks
		refunds
	}
	withPaymentOps struct {
		*hooks
		paymentOps
	}
	withBoth struct {
		*hooks
		refunds
		paymentOps
	}
)

// Wrap returns a wrapper of s with no hooks: it forwards every call. It
// has s's refunds and payment operations if s has them.
func Wrap(s Store) Wrapper {
	h := &hooks{inner: s, calls: map[Method]int{}, before: map[Method][]Hook{}, after: map[Method][]Hook{}}
	rs, hasRefunds := s.(RefundStore)
	ps, hasOps := s.(PaymentOpStore)
	switch {
	case hasRefunds && hasOps:
		h.self = &withBoth{h, refunds{h, rs}, paymentOps{h, ps}}
	case hasRefunds:
		h.self = &withRefunds{h, refunds{h, rs}}
	case hasOps:
		h.self = &withPaymentOps{h, paymentOps{h, ps}}
	default:
		h.self = h
	}
	return h.self
}

// Before adds a hook run before each call of m (or of every method, Any).
func (w *hooks) Before(m Method, h Hook) Wrapper {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.before[m] = append(w.before[m], h)
	return w.self
}

// After adds a hook run after each call of m that reached the store.
func (w *hooks) After(m Method, h Hook) Wrapper {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.after[m] = append(w.after[m], h)
	return w.self
}

// Calls reports how many calls of m (of every method, Any) were made,
// including those a before hook answered.
func (w *hooks) Calls(m Method) int {
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
func (w *hooks) start(c *Call) (before, after []Hook) {
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
func (w *hooks) call(ctx context.Context, c *Call, do func()) bool {
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
func (w *hooks) ClaimBatch(ctx context.Context, holder string, lease time.Duration, reqs []ledger.ClaimRequest) ([]ledger.ClaimResult, error) {
	c := &Call{Method: ClaimBatch, Holder: holder, Reqs: reqs}
	if !w.call(ctx, c, func() { c.Results, c.Err = w.inner.ClaimBatch(ctx, holder, lease, reqs) }) {
		return nil, c.Err
	}
	return c.Results, c.Err
}

// Heartbeat forwards to the store's Heartbeat.
func (w *hooks) Heartbeat(ctx context.Context, l ledger.Lease, d time.Duration) (ledger.Lease, error) {
	c := &Call{Method: Heartbeat, Lease: l}
	if !w.call(ctx, c, func() { c.Renewed, c.Err = w.inner.Heartbeat(ctx, l, d) }) {
		return l, c.Err
	}
	return c.Renewed, c.Err
}

// Complete forwards to the store's Complete.
func (w *hooks) Complete(ctx context.Context, l ledger.Lease, comp ledger.Completion) error {
	c := &Call{Method: Complete, Lease: l, Completion: comp}
	w.call(ctx, c, func() { c.Err = w.inner.Complete(ctx, l, comp) })
	return c.Err
}

// CompleteBatch forwards to the store's CompleteBatch.
func (w *hooks) CompleteBatch(ctx context.Context, items []ledger.CompleteItem) ([]error, error) {
	c := &Call{Method: CompleteBatch, Items: items}
	if !w.call(ctx, c, func() { c.Errs, c.Err = w.inner.CompleteBatch(ctx, items) }) {
		return nil, c.Err
	}
	return c.Errs, c.Err
}

// Fail forwards to the store's Fail.
func (w *hooks) Fail(ctx context.Context, l ledger.Lease, reason string) (ledger.Status, error) {
	c := &Call{Method: Fail, Lease: l, Reason: reason}
	if !w.call(ctx, c, func() { c.Status, c.Err = w.inner.Fail(ctx, l, reason) }) {
		return "", c.Err
	}
	return c.Status, c.Err
}

// Release forwards to the store's Release.
func (w *hooks) Release(ctx context.Context, l ledger.Lease, reason string) error {
	c := &Call{Method: Release, Lease: l, Reason: reason}
	w.call(ctx, c, func() { c.Err = w.inner.Release(ctx, l, reason) })
	return c.Err
}

// RecordRefusal forwards to the store's RecordRefusal.
func (w *hooks) RecordRefusal(ctx context.Context, r ledger.Refusal) (bool, error) {
	c := &Call{Method: RecordRefusal, Refusal: r}
	if !w.call(ctx, c, func() { c.Wrote, c.Err = w.inner.RecordRefusal(ctx, r) }) {
		return false, c.Err
	}
	return c.Wrote, c.Err
}

// ProviderKeyWindow forwards to the store's; it is not hooked.
func (w *hooks) ProviderKeyWindow() time.Duration { return w.inner.ProviderKeyWindow() }

// ClaimRefund forwards to the store's ClaimRefund.
func (r refunds) ClaimRefund(ctx context.Context, holder string, lease time.Duration, req ledger.RefundRequest) (ledger.RefundClaim, error) {
	c := &Call{Method: ClaimRefund, Holder: holder, RefundReq: req}
	if !r.h.call(ctx, c, func() { c.RefundClaim, c.Err = r.rs.ClaimRefund(ctx, holder, lease, req) }) {
		return ledger.RefundClaim{}, c.Err
	}
	return c.RefundClaim, c.Err
}

// CompleteRefund forwards to the store's CompleteRefund.
func (r refunds) CompleteRefund(ctx context.Context, l ledger.Lease, comp ledger.RefundCompletion) error {
	c := &Call{Method: CompleteRefund, Lease: l, RefundCompletion: comp}
	r.h.call(ctx, c, func() { c.Err = r.rs.CompleteRefund(ctx, l, comp) })
	return c.Err
}

// ReleaseRefund forwards to the store's ReleaseRefund.
func (r refunds) ReleaseRefund(ctx context.Context, l ledger.Lease, reason string) error {
	c := &Call{Method: ReleaseRefund, Lease: l, Reason: reason}
	r.h.call(ctx, c, func() { c.Err = r.rs.ReleaseRefund(ctx, l, reason) })
	return c.Err
}

// ClaimPaymentOp forwards to the store's ClaimPaymentOp.
func (o paymentOps) ClaimPaymentOp(ctx context.Context, holder string, lease time.Duration, req ledger.PaymentOpRequest) (ledger.PaymentOpClaim, error) {
	c := &Call{Method: ClaimPaymentOp, Holder: holder, PaymentOpReq: req}
	if !o.h.call(ctx, c, func() { c.PaymentOpClaim, c.Err = o.ps.ClaimPaymentOp(ctx, holder, lease, req) }) {
		return ledger.PaymentOpClaim{}, c.Err
	}
	return c.PaymentOpClaim, c.Err
}

// CompletePaymentOp forwards to the store's CompletePaymentOp.
func (o paymentOps) CompletePaymentOp(ctx context.Context, l ledger.Lease, comp ledger.PaymentOpCompletion) error {
	c := &Call{Method: CompletePaymentOp, Lease: l, PaymentOpCompletion: comp}
	o.h.call(ctx, c, func() { c.Err = o.ps.CompletePaymentOp(ctx, l, comp) })
	return c.Err
}

// ReleasePaymentOp forwards to the store's ReleasePaymentOp.
func (o paymentOps) ReleasePaymentOp(ctx context.Context, l ledger.Lease, reason string) error {
	c := &Call{Method: ReleasePaymentOp, Lease: l, Reason: reason}
	o.h.call(ctx, c, func() { c.Err = o.ps.ReleasePaymentOp(ctx, l, reason) })
	return c.Err
}

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
