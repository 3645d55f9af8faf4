package reconciler_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/reconciler"
)

// TestLookupOutcomeWithoutStatus: a lookup whose outcome carries no HTTP
// status still completes the row, with 200 for a charge, 202 for a payment
// still processing and 402 for a decline, instead of leaving it pending for
// ever; the provider's status, when given, and its body are stored as they
// came. (A found charge without a body is left pending: see
// TestUnusableAnswersLeaveRowPending.)
func TestLookupOutcomeWithoutStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		declined   bool
		processing bool
		httpStatus int
		want       int
	}{
		{"charged", false, false, 0, 200},
		{"processing", false, true, 0, 202},
		{"declined", true, false, 0, 402},
		{"charged with status", false, false, 201, 201},
		{"declined with status", true, false, 400, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, stripesim.Config{})
			b.claim(t, "k")
			b.clk.Advance(stuckFor)
			body := json.RawMessage(`{"id":"pi_s"}`)
			out := &provider.Outcome{Status: "succeeded", Declined: tc.declined, Processing: tc.processing, HTTPStatus: tc.httpStatus, Response: body}
			if !tc.declined {
				out.ChargeID = "pi_s"
			}
			r := b.reconciler(t, lookerFunc(func(context.Context, provider.LookupRequest) (provider.LookupResult, error) {
				return provider.LookupResult{Found: true, Outcome: out}, nil
			}), reconciler.Config{})
			runOnce(t, r)
			rec := b.get(t, "k")
			if rec.Status != ledger.StatusCompleted || rec.ResponseStatus != tc.want || string(rec.Response) != string(body) {
				t.Fatalf("row %s with HTTP %d and %s, want completed with %d and %s", rec.Status, rec.ResponseStatus, rec.Response, tc.want, body)
			}
		})
	}
}
