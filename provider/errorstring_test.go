package provider_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/provider"
)

// TestErrorStringEdges: a payment method id right after a kept "xpm_" word,
// and one at the very end of the text made of the edge characters of an id
// (0 9 a z A Z _), is redacted whole; a Retry-After hint is shown only when
// there is one.
func TestErrorStringEdges(t *testing.T) {
	t.Parallel()
	s := (&provider.Error{Class: provider.ClassRetryable, Message: "xpm_pm_secret1", Err: errors.New("last pm_09azAZ_secret2")}).Error()
	for _, leak := range []string{"pm_secret1", "pm_secret2"} {
		if strings.Contains(s, leak) {
			t.Errorf("Error() = %q leaks %s", s, leak)
		}
	}
	if !strings.HasSuffix(s, "last pm_[redacted]") {
		t.Errorf("Error() = %q, want it to end in the redacted id", s)
	}
	if s := (&provider.Error{Class: provider.ClassRetryable, HTTPStatus: 429, RetryAfter: 2 * time.Second}).Error(); !strings.Contains(s, "(retry after 2s)") {
		t.Errorf("Error() = %q, want the retry-after hint", s)
	}
	if s := (&provider.Error{Class: provider.ClassRetryable, HTTPStatus: 429}).Error(); strings.Contains(s, "retry after") {
		t.Errorf("Error() = %q shows a retry-after hint it does not have", s)
	}
}
