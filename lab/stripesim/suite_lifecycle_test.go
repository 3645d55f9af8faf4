package stripesim_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/providertest"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
)

var _ providertest.Lifecycle = (*stripe.Client)(nil)

// TestLifecycleAgainstSimulator runs the lifecycle suite through the
// Stripe adapter against the simulator, which keeps the payments' state:
// every scenario, the stateful ones too (provider/stripe runs the same
// suite against stripe-mock, stateless).
func TestLifecycleAgainstSimulator(t *testing.T) {
	t.Parallel()
	providertest.RunLifecycleSuite(t, func(t *testing.T, cfg stripesim.Config) *providertest.LifecycleTarget {
		clk := clock.NewFake(time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC))
		cfg.Now, cfg.Seed = clk.Now, 42
		sim := stripesim.New(cfg)
		rec := &providertest.Recorder{Next: sim}
		srv := httptest.NewServer(rec)
		t.Cleanup(srv.Close)
		p := newStripe(t, stripe.Config{APIBase: srv.URL})
		return &providertest.LifecycleTarget{P: p, Sim: sim, Advance: clk.Advance, Sent: rec.Take}
	}, providertest.LifecycleCaps{Stateful: true})
}

// testAuthorizeIsNotACharge: a charge with manual capture is answered
// authorized (requires_capture, its amount capturable), replayed as such,
// found as such by a lookup, and moves no money.
func testAuthorizeIsNotACharge(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{})
	req := chargeReq("k-authorize")
	req.ManualCapture = true
	out := mustCharge(t, env.p, req)
	if !out.Authorized || out.AmountCapturable != req.Amount || out.Status != provider.StatusRequiresCapture || out.Declined || out.Processing || out.HTTPStatus != 200 {
		t.Fatalf("authorize = %+v", out)
	}
	again := mustCharge(t, env.p, req)
	if !again.Replayed || !again.Authorized || again.ChargeID != out.ChargeID {
		t.Fatalf("replay = %+v", again)
	}
	res, err := env.p.Lookup(context.Background(), provider.LookupRequest{ProviderKey: req.ProviderKey, ChargeID: out.ChargeID,
		MerchantID: req.MerchantID, IdempotencyKey: req.IdempotencyKey, Amount: req.Amount, Currency: req.Currency})
	if err != nil || !res.Found || !res.Outcome.Authorized || res.Outcome.Declined {
		t.Fatalf("lookup = %+v, %v", res, err)
	}
	// Without manual capture, the same request under its key is another.
	req.ManualCapture = false
	_, err = env.p.Charge(context.Background(), req)
	wantClass(t, err, provider.ClassMismatch)
	wantCharges(t, env.sim, "k-authorize", 0)
}
