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
// status still completes the row, with 200 for a charge and 402 for a
// decline, instead of leaving it pending for ever.
func TestLookupOutcomeWithoutStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		declined bool
		want     int
	}{{"charged", false, 200}, {"declined", true, 402}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, stripesim.Config{})
			b.claim(t, "k")
			b.clk.Advance(stuckFor)
			out := &provider.Outcome{Status: "succeeded", Declined: tc.declined, Response: json.RawMessage(`{"id":"pi_s"}`)}
			if !tc.declined {
				out.ChargeID = "pi_s"
			}
			r := b.reconciler(t, lookerFunc(func(context.Context, provider.LookupRequest) (provider.LookupResult, error) {
				return provider.LookupResult{Found: true, Outcome: out}, nil
			}), reconciler.Config{})
			runOnce(t, r)
			rec := b.get(t, "k")
			if rec.Status != ledger.StatusCompleted || rec.ResponseStatus != tc.want {
				t.Fatalf("row %s with HTTP %d, want completed with %d", rec.Status, rec.ResponseStatus, tc.want)
			}
		})
	}
}
