package provider_test

import (
	"fmt"
	"testing"

	"github.com/paydedup/paydedup/provider"
)

// TestRateLimited: a 429 or code rate_limit is a rate limit, Stripe's 429
// lock_timeout (one key busy) and every other answer are not, and a
// rate limit wrapped by a caller is still found.
func TestRateLimited(t *testing.T) {
	t.Parallel()
	tests := []struct {
		e    provider.Error
		want bool
	}{
		{provider.Error{Class: provider.ClassRetryable, HTTPStatus: 429, Code: "rate_limit"}, true},
		{provider.Error{Class: provider.ClassRetryable, HTTPStatus: 429}, true},
		{provider.Error{Class: provider.ClassUnknown, HTTPStatus: 429, Code: "rate_limit"}, true},
		{provider.Error{Class: provider.ClassRetryable, Type: "rate_limit_error"}, true},
		{provider.Error{Class: provider.ClassRetryable, RateLimitReason: provider.ReasonBudget}, true},
		{provider.Error{Class: provider.ClassUnknown, HTTPStatus: 429, Code: "lock_timeout"}, false},
		{provider.Error{Class: provider.ClassUnknown, HTTPStatus: 503}, false},
		{provider.Error{Class: provider.ClassRetryable, HTTPStatus: 0}, false},
		{provider.Error{Class: provider.ClassUnknown, HTTPStatus: 409, Code: "idempotency_key_in_use"}, false},
	}
	for _, tt := range tests {
		if got := tt.e.RateLimited(); got != tt.want {
			t.Errorf("%+v.RateLimited() = %v, want %v", tt.e, got, tt.want)
		}
		wrapped := fmt.Errorf("charge: %w", &tt.e)
		if got := provider.RateLimitOf(wrapped) != nil; got != tt.want {
			t.Errorf("RateLimitOf(%v) found = %v, want %v", wrapped, got, tt.want)
		}
	}
	for in, want := range map[string]provider.Advice{"true": provider.AdviceRetry, " False ": provider.AdviceNoRetry, "": provider.AdviceNone, "maybe": provider.AdviceNone} {
		if got := provider.ParseAdvice(in); got != want {
			t.Errorf("ParseAdvice(%q) = %v, want %v", in, got, want)
		}
	}
}
