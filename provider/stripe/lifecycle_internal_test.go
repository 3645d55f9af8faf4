package stripe

import (
	"net/http"
	"testing"
	"time"

	stripego "github.com/stripe/stripe-go/v82"

	"github.com/paydedup/paydedup/provider"
)

// TestOpFailureAfterResend: a capture's, cancel's or refund's refusal, or
// a "not executed" answer, speaks only for the copy it answers. When
// net/http wrote an earlier copy (its own resend), that copy may have
// acted — a capture refused as already captured may be refused because of
// it — so the answer is unknown.
func TestOpFailureAfterResend(t *testing.T) {
	t.Parallel()
	s := &Client{now: func() time.Time { return time.Unix(0, 0) }}
	refused := &stripego.Error{HTTPStatusCode: http.StatusBadRequest, Type: stripego.ErrorTypeInvalidRequest, Code: "payment_intent_unexpected_state"}
	limited := &stripego.Error{HTTPStatusCode: http.StatusTooManyRequests, Type: stripego.ErrorTypeInvalidRequest, Code: "rate_limit"}
	for _, tt := range []struct {
		name     string
		err      error
		written  int32
		wantCode string
		want     provider.Class
	}{
		{"refusal of the only copy", refused, 1, "payment_intent_unexpected_state", 0},
		{"refusal after a resend", refused, 2, "", provider.ClassUnknown},
		{"rate limit of the only copy", limited, 1, "", provider.ClassRetryable},
		{"rate limit after a resend", limited, 2, "", provider.ClassUnknown},
	} {
		copies := &writtenCopies{}
		copies.n.Store(tt.written)
		code, err := s.opFailure(tt.err, copies)
		if tt.wantCode != "" {
			if err != nil || code != tt.wantCode {
				t.Errorf("%s: opFailure = %q, %v; want refusal %q", tt.name, code, err, tt.wantCode)
			}
			continue
		}
		if code != "" || provider.ClassOf(err) != tt.want || err == nil {
			t.Errorf("%s: opFailure = %q, %v; want class %s", tt.name, code, err, tt.want)
		}
	}
}
