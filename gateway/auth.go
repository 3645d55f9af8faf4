package gateway

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/paydedup/paydedup/gateway/apikey"
)

// authMode is how a route authenticates its API key.
type authMode int

const (
	// authLookup looks the key up on every request (a GET).
	authLookup authMode = iota
	// authCached takes a key seen before from the cache (POST
	// /v1/payments: the batched intake re-checks it before anything is
	// done), and keeps its hash for the batch.
	authCached
	// authHashed looks the key up on every request and keeps its hash for
	// the batch (an operation's POST, which may answer from the worker's
	// rows before any batch re-checks the key).
	authHashed
)

// authenticate resolves the bearer API key to its merchant. A missing key
// and a wrong key are both 401; nothing tells a revoked key from an unknown
// one. mode says whether a key seen before is taken from the cache. A
// source address that failed too often is 429 before anything else, a
// cached key included (else a guess that hit the cache would go
// unthrottled).
func (g *Gateway) authenticate(next http.Handler, mode authMode) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.throttled(w, r) {
			return
		}
		scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		token = strings.TrimSpace(token)
		if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
			w.Header().Set("WWW-Authenticate", bearerRealm)
			writeProblem(w, Problem{Type: ProblemUnauthenticated, Status: http.StatusUnauthorized, Detail: problemDetailUnauthorized})
			return
		}
		ctx := r.Context()
		if mode != authLookup {
			if !apikey.ValidShape(token) {
				g.authFailed(r)
				g.unauthenticated(w)
				return
			}
			hash := apikey.Hash(token)
			ctx = context.WithValue(ctx, apiKeyHashKey{}, hash)
			if merchant, ok := g.batch.keys.get(hash); ok && mode == authCached {
				next.ServeHTTP(w, r.WithContext(context.WithValue(ctx, merchantKey{}, merchant)))
				return
			}
		}
		actx, cancel := context.WithTimeout(ctx, g.cfg.RequestTimeout)
		merchant, err := g.store.Authenticate(actx, token)
		cancel()
		switch {
		case errors.Is(err, apikey.ErrUnauthenticated):
			g.authFailed(r)
			g.unauthenticated(w)
			return
		case err != nil:
			g.logRequestError(r, g.log, "authentication failed", err)
			unavailable(w)
			return
		}
		if hash := apiKeyHashFrom(ctx); hash != nil {
			g.batch.keys.put(hash, merchant)
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(ctx, merchantKey{}, merchant)))
	})
}

// throttled answers 429 to a request whose source failed too often, and
// reports whether it did.
func (g *Gateway) throttled(w http.ResponseWriter, r *http.Request) bool {
	if g.auths == nil {
		return false
	}
	src, ok := source(r.RemoteAddr)
	if !ok {
		return false
	}
	wait, blocked := g.auths.blocked(src)
	if !blocked {
		return false
	}
	g.metrics.authThrottled.Inc()
	setRetryAfter(w, wait)
	writeProblem(w, Problem{Type: ProblemAuthThrottled, Status: http.StatusTooManyRequests, Detail: problemDetailAuthThrottled})
	return true
}

// authFailed spends one of the request's source's failures.
func (g *Gateway) authFailed(r *http.Request) {
	if g.auths == nil {
		return
	}
	if src, ok := source(r.RemoteAddr); ok {
		g.auths.fail(src)
	}
}
