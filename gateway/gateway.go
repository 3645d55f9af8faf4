// Package gateway owns paydedup's HTTP ingress: POST /v1/payments with an
// Idempotency-Key header (the IETF draft "The Idempotency-Key HTTP Header
// Field", and Stripe's semantics), GET /v1/payments/{idempotency_key}, and
// API-key authentication.
//
// The gateway does not charge. It validates a command, publishes it to the
// worker's stream, and answers from the worker's idempotency records:
//
//   - a completed key with the same fingerprint is replayed (Idempotent-
//     Replayed: true); another fingerprint is 422; a key in flight is 409
//     with Retry-After;
//   - a new key is published once and answered 202 Accepted, or, with
//     Prefer: wait=N, with its outcome once the worker completes it (woken by
//     Postgres LISTEN/NOTIFY, not polling), or 202 when N runs out;
//   - a key whose published command the worker dead-lettered answers the
//     dead letter's reason (400, 413 or 422) from then on.
//
// The message is built and decoded as the worker will decode it before
// anything is taken in (Publisher.Check), so the gateway accepts only what
// the worker accepts. A key whose record was purged is still checked
// against the payments ledger.
//
// The worker's claim happens later, when it consumes the message, so the
// gateway guards concurrent first requests with its own short-lived intake
// row (ledger.Intake): one INSERT … ON CONFLICT decides which request
// publishes; the others see it and answer 409 until the worker's record
// exists. The gateway never writes idempotency_keys: a pending claim there
// would be a lease the worker could not take until it expired.
package gateway

import (
	"net/http"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/propagation"
)

// Gateway is the HTTP ingress. Serve it: POSTs are taken in by the
// batched intake, which runs while Serve does (Handler mounted on a server
// of your own answers them 503 otherwise).
type Gateway struct {
	base
	comp    Completions
	prop    propagation.TextMapPropagator
	handler http.Handler
	batch   *batcher      // takes every POST in (batch.go)
	auths   *authThrottle // nil: off
	pauses  pauseCache

	draining  atomic.Bool
	drain     chan struct{} // closed when shutdown begins
	drainOnce sync.Once
}

// Handler is the gateway's HTTP handler.
func (g *Gateway) Handler() http.Handler { return g.handler }

// Draining reports whether a shutdown has begun; readiness should fail.
func (g *Gateway) Draining() bool { return g.draining.Load() }

// beginDrain makes waiting requests answer 202 at once.
func (g *Gateway) beginDrain() {
	g.drainOnce.Do(func() {
		g.draining.Store(true)
		close(g.drain)
	})
}
