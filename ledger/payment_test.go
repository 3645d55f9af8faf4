package ledger_test

import (
	"testing"

	"github.com/paydedup/paydedup/ledger"
)

// TestSettleStatus pins what a processing payment settles to once the
// provider's answer is final: failed and 402 for a decline, succeeded and
// 200 for a charge, the provider's own status over either.
func TestSettleStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		declined   bool
		httpStatus int
		status     string
		code       int
	}{
		{false, 0, ledger.PaymentSucceeded, 200},
		{false, 201, ledger.PaymentSucceeded, 201},
		{true, 0, ledger.PaymentFailed, 402},
		{true, 400, ledger.PaymentFailed, 400},
	} {
		status, code := ledger.SettleStatus(tc.declined, tc.httpStatus)
		if status != tc.status || code != tc.code {
			t.Errorf("SettleStatus(%v, %d) = %s, %d; want %s, %d", tc.declined, tc.httpStatus, status, code, tc.status, tc.code)
		}
	}
}
