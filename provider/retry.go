package provider

import (
	"context"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Defaults for RetryPolicy; the worker's lease must exceed Budget().
const (
	DefaultMaxTries        = 3
	DefaultAttemptTimeout  = 10 * time.Second
	DefaultInitialInterval = 100 * time.Millisecond
	DefaultMaxInterval     = 2 * time.Second
)

// RetryPolicy bounds ChargeWithRetry; zero fields take the defaults.
type RetryPolicy struct {
	// MaxTries is the total number of attempts per call.
	MaxTries int
	// AttemptTimeout bounds each attempt.
	AttemptTimeout time.Duration
	// InitialInterval is the first backoff wait.
	InitialInterval time.Duration
	// MaxInterval caps every wait, including one asked for by Retry-After: a
	// longer Retry-After ends the call and is left to the caller (it is in
	// the returned *Error's RetryAfter).
	MaxInterval time.Duration
}

// WithDefaults returns p with every zero or negative field set to its
// default.
func (p RetryPolicy) WithDefaults() RetryPolicy {
	if p.MaxTries <= 0 {
		p.MaxTries = DefaultMaxTries
	}
	if p.AttemptTimeout <= 0 {
		p.AttemptTimeout = DefaultAttemptTimeout
	}
	if p.InitialInterval <= 0 {
		p.InitialInterval = DefaultInitialInterval
	}
	if p.MaxInterval <= 0 {
		p.MaxInterval = DefaultMaxInterval
	}
	if p.InitialInterval > p.MaxInterval {
		p.InitialInterval = p.MaxInterval
	}
	return p
}

// Budget returns the worst-case wall time of one ChargeWithRetry under p:
// MaxTries attempts of AttemptTimeout plus MaxTries-1 waits, each at most
// MaxInterval (ChargeWithRetry caps every wait, Retry-After included, at
// MaxInterval).
func (p RetryPolicy) Budget() time.Duration {
	p = p.WithDefaults()
	return time.Duration(p.MaxTries)*p.AttemptTimeout +
		time.Duration(p.MaxTries-1)*p.MaxInterval
}

// ChargeWithRetry calls c.Charge with the same req — the same ProviderKey, so
// the provider replays rather than charges twice — until it gets an Outcome
// (charged or declined), a ClassMismatch, ClassDeclined, ClassRejected or
// ClassUnauthorized error (never retried: the same request gets the same
// answer), or runs out of tries or time.
//
// ClassRetryable and ClassUnknown are retried with exponential backoff. A
// Retry-After hint is honoured: the wait is at least that long; if it is longer
// than pol.MaxInterval or would end past ctx's deadline, ChargeWithRetry stops
// and returns that error so the caller can reschedule. It never sleeps past
// ctx's deadline, and when ctx ends after a failed attempt it returns that
// attempt's *Error (which still wraps the context error), not a bare context
// error. Every error it returns is an *Error.
//
// Unknown sticks: if any attempt ended ClassUnknown, the returned error is
// ClassUnknown even when the last attempt was ClassRetryable (e.g. a 429),
// because the earlier attempt may have charged. The last attempt's error is
// kept as the returned *Error's Err.
func ChargeWithRetry(ctx context.Context, c Charger, req ChargeRequest, pol RetryPolicy) (*Outcome, error) {
	pol = pol.WithDefaults()
	if err := ctx.Err(); err != nil {
		// We sent nothing, but the caller's history may hold an unknown
		// attempt; only the safe answer fits every caller.
		return nil, &Error{Class: ClassUnknown, Message: "not attempted", Err: err}
	}

	// The first attempt runs before any retry state is made: almost every
	// call ends with it, and the state (the backoff, its context wrapper,
	// the operation) would be allocated for nothing.
	a := attempts{c: c, req: req, timeout: pol.AttemptTimeout}
	out, err := a.try(ctx)
	if err == nil {
		return out, nil
	}
	if a.permanent() {
		return nil, a.last
	}

	r := &retry{attempts: a, pol: pol, ctx: ctx}
	r.inner = backoff.NewExponentialBackOff(backoff.WithInitialInterval(pol.InitialInterval), backoff.WithMaxInterval(pol.MaxInterval), backoff.WithMaxElapsedTime(0))
	first := true
	op := func() (*Outcome, error) {
		if first {
			// The attempt made above: backoff decides on it as on the others.
			first = false
			return nil, r.last
		}
		out, err := r.try(ctx)
		if err == nil {
			return out, nil
		}
		if r.permanent() {
			return nil, backoff.Permanent(r.last)
		}
		return nil, r.last
	}

	out, err = backoff.RetryNotifyWithData(op, backoff.WithContext(r, ctx), nil)
	if err == nil {
		return out, nil
	}
	last := r.last
	if last == nil {
		return nil, asError(err)
	}
	if r.sawUnknown {
		return nil, AfterUnknown(last)
	}
	return nil, last
}

// AfterUnknown is err as it stands when an earlier attempt under the same
// provider key ended ClassUnknown (in this call or an earlier one under
// the same claim): an error that is no final answer (not ClassUnknown,
// ClassMismatch or ClassDeclined) becomes ClassUnknown, because the
// earlier attempt may have charged; err is kept as its Err, and its
// status, codes and Retry-After are copied. It returns an *Error.
func AfterUnknown(err error) *Error {
	last := asError(err)
	if last.Class == ClassUnknown || last.Class == ClassMismatch || last.Class == ClassDeclined {
		return last
	}
	return &Error{
		Class:      ClassUnknown,
		HTTPStatus: last.HTTPStatus,
		Type:       last.Type,
		Code:       last.Code,
		Message:    fmt.Sprintf("an earlier attempt had an unknown outcome; last attempt: %s", last.Class),
		RetryAfter: last.RetryAfter,

		RateLimitReason: last.RateLimitReason,
		ShouldRetry:     last.ShouldRetry,
		Err:             last,
	}
}

// attempts makes one call's attempts and remembers what they ended with.
type attempts struct {
	c          Charger
	req        ChargeRequest
	timeout    time.Duration
	tries      int
	last       *Error // the last failed attempt's error
	sawUnknown bool   // some attempt ended ClassUnknown
}

// try makes one attempt, bounded by the attempt timeout.
func (a *attempts) try(ctx context.Context) (*Outcome, error) {
	a.tries++
	actx, cancel := context.WithTimeout(ctx, a.timeout)
	out, err := a.c.Charge(actx, a.req)
	cancel()
	if err == nil && out == nil {
		err = &Error{Class: ClassUnknown, Message: "provider returned neither outcome nor error"}
	}
	if err == nil {
		return out, nil
	}
	a.last = asError(err)
	if a.last.Class == ClassUnknown {
		a.sawUnknown = true
	}
	return nil, a.last
}

// permanent reports whether the last attempt's error is never retried: the
// same request gets the same answer.
func (a *attempts) permanent() bool {
	switch a.last.Class {
	case ClassMismatch, ClassDeclined, ClassRejected, ClassUnauthorized:
		return true
	}
	return false
}

// retry is a call past its first failed attempt. As a backoff.BackOff it
// adapts backoff's exponential policy to RetryPolicy: it counts tries,
// honours Retry-After, caps every wait at MaxInterval and stops rather than
// wait past the context's deadline.
type retry struct {
	attempts
	pol   RetryPolicy
	inner *backoff.ExponentialBackOff
	ctx   context.Context
}

func (b *retry) Reset() { b.inner.Reset() }

func (b *retry) NextBackOff() time.Duration {
	if b.tries >= b.pol.MaxTries {
		return backoff.Stop
	}
	wait := min(b.inner.NextBackOff(), b.pol.MaxInterval)
	if last := b.last; last != nil && last.RetryAfter > 0 {
		if last.RetryAfter > b.pol.MaxInterval {
			return backoff.Stop
		}
		wait = max(wait, last.RetryAfter)
	}
	if dl, ok := b.ctx.Deadline(); ok && time.Until(dl) <= wait {
		return backoff.Stop
	}
	return wait
}
