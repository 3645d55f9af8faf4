package procstat

import (
	"fmt"
	"testing"

	"github.com/paydedup/paydedup/internal/redact"
)

// TestRunSuffixNeverMakesACardNumber: the benches' keys are a prefix, the
// run's suffix and a number; an all-digit suffix (one run in 40) joined to
// that number made about one key in ten a card number, refused 422 at the
// door, and TestBenchGatewayWithWorker counted 30 of 300 payments
// unaccepted.
func TestRunSuffixNeverMakesACardNumber(t *testing.T) {
	for range 200 {
		s := RunSuffix()
		if len(s) != 8 || s[0] < 'a' || s[0] > 'z' {
			t.Fatalf("RunSuffix() = %q: want 8 characters starting with a letter", s)
		}
	}
	for _, s := range []string{"r1234567", "r4111111"} {
		for i := range 2000 {
			if k := fmt.Sprintf("gwb-%s-%08d", s, i); redact.ContainsPAN(k) {
				t.Fatalf("the key %q holds a card number", k)
			}
		}
	}
}
