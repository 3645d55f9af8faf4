package stripe_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
)

// TestRateLimitAnswerRead: a 429 as Stripe sends it (code rate_limit,
// Stripe-Rate-Limited-Reason, Stripe-Should-Retry, Retry-After) is read
// whole, for a charge and a lookup alike: a rate limit, with its reason,
// its hint and Stripe's advice.
func TestRateLimitAnswerRead(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(provider.HeaderRateLimitedReason, "endpoint-concurrency")
		w.Header().Set(provider.HeaderShouldRetry, "true")
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"error":{"type":"invalid_request_error","code":"rate_limit","message":"Too many requests hit the API too quickly."}}`))
	}))
	t.Cleanup(srv.Close)
	s := newStripe(t, stripe.Config{APIBase: srv.URL})

	_, cerr := s.Charge(context.Background(), chargeReq("k-429-reason"))
	_, lerr := s.Lookup(context.Background(), provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-429-reason"})
	for name, err := range map[string]error{"charge": cerr, "lookup": lerr} {
		pe := provider.RateLimitOf(err)
		if pe == nil {
			t.Fatalf("%s: err = %v, want a rate limit", name, err)
		}
		if pe.Class != provider.ClassRetryable || pe.RateLimitReason != provider.ReasonEndpointConcurrency ||
			pe.ShouldRetry != provider.AdviceRetry || pe.RetryAfter != 2*time.Second {
			t.Errorf("%s: error = %+v, want retryable, endpoint-concurrency, should retry, 2s", name, pe)
		}
	}
}
