package gateway

import (
	"net/http"
	"strconv"
	"time"

	"github.com/paydedup/paydedup/payment"
)

// bodyLimit is the largest body the route of r reads: webhookLimit for
// Stripe's events, Limits.MaxBodyBytes (PAYDEDUP_MAX_BODY_BYTES) for
// everything else.
func (g *Gateway) bodyLimit(r *http.Request) int64 {
	if r.URL.Path == PathStripeWebhooks {
		return g.webhookLimit()
	}
	return int64(g.cfg.Limits.MaxBodyBytes)
}

// refuseDeclaredTooLarge answers 413 at once to a request whose
// Content-Length already says its body is larger than its route reads,
// without reading any of it, and with Connection: close: otherwise the
// handler would wait for a body that may never come (a client declaring
// 10 GB and sending nothing) until the read timeout, and answer 400. The
// server then closes the connection (net/http first discards up to 256 KiB
// of a declared body, so that a client sending it reads the 413 rather
// than a reset; a larger one not at all). A body without a Content-Length
// (chunked) is still bounded as it is read.
func (g *Gateway) refuseDeclaredTooLarge(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		limit := g.bodyLimit(r)
		if r.ContentLength <= limit {
			next.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		w.Header().Set("Connection", "close")
		writeProblem(w, Problem{Type: ProblemTooLarge, Status: http.StatusRequestEntityTooLarge,
			Detail: "The body exceeds " + strconv.FormatInt(limit, 10) + " bytes (Content-Length " +
				strconv.FormatInt(r.ContentLength, 10) + ").",
			Reason: string(payment.ReasonBodyTooLarge)})
		g.metrics.observe(routeOf(r), http.StatusRequestEntityTooLarge, time.Since(start))
	})
}

// routeOf is the route label routes gives r's path and method, for a
// request answered before the mux sees it.
func routeOf(r *http.Request) string {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/payments":
		return "post_payment"
	case r.Method == http.MethodPost && r.URL.Path == PathStripeWebhooks:
		return "stripe_webhook"
	}
	return "other"
}
