package stripesim_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
)

// lifecycle is what the operations after a charge need of a provider,
// declared here as a caller declares it; the Stripe adapter has it.
type lifecycle interface {
	provider.Provider
	Capture(context.Context, provider.CaptureRequest) (*provider.IntentOutcome, error)
	Cancel(context.Context, provider.CancelRequest) (*provider.IntentOutcome, error)
	RetrieveIntent(context.Context, provider.RetrieveIntentRequest) (*provider.IntentOutcome, error)
	Refund(context.Context, provider.RefundRequest) (*provider.RefundOutcome, error)
	LookupRefund(context.Context, provider.RefundLookupRequest) (provider.RefundLookupResult, error)
}

var _ lifecycle = (*stripe.Client)(nil)

// lifeEnv is one lifecycle scenario: the simulator, its clock, and the
// Stripe adapter over HTTP in front of it.
type lifeEnv struct {
	sim *stripesim.Simulator
	clk *clock.Fake
	p   lifecycle
}

func setupLifecycle(t *testing.T, cfg stripesim.Config) *lifeEnv {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC))
	cfg.Now = clk.Now
	env := setupSuite(t, func(t *testing.T, _ *stripesim.Simulator, baseURL string) provider.Provider {
		return newStripe(t, stripe.Config{APIBase: baseURL})
	}, cfg)
	return &lifeEnv{sim: env.sim, clk: clk, p: env.p.(lifecycle)}
}

func (e *lifeEnv) faults(t *testing.T, f stripesim.Faults) {
	t.Helper()
	if err := e.sim.SetFaults(f); err != nil {
		t.Fatal(err)
	}
}

func (e *lifeEnv) authorize(t *testing.T, key string) *provider.Outcome {
	t.Helper()
	req := chargeReq(key)
	req.ManualCapture = true
	out := mustCharge(t, e.p, req)
	if !out.Authorized || out.Status != provider.StatusRequiresCapture || out.AmountCapturable != req.Amount || out.Declined || out.Processing {
		t.Fatalf("authorize %s = %+v", key, out)
	}
	return out
}

func (e *lifeEnv) capture(t *testing.T, key, id string, amount int64) *provider.IntentOutcome {
	t.Helper()
	out, err := e.p.Capture(context.Background(), provider.CaptureRequest{ProviderKey: key, ChargeID: id, Amount: amount})
	if err != nil {
		t.Fatalf("capture %s: %v", key, err)
	}
	return out
}

func (e *lifeEnv) refund(t *testing.T, key, id string, amount int64) *provider.RefundOutcome {
	t.Helper()
	out, err := e.p.Refund(context.Background(), refundReq(key, id, amount))
	if err != nil {
		t.Fatalf("refund %s: %v", key, err)
	}
	return out
}

func (e *lifeEnv) retrieve(t *testing.T, id string) *provider.IntentOutcome {
	t.Helper()
	out, err := e.p.RetrieveIntent(context.Background(), provider.RetrieveIntentRequest{ChargeID: id})
	if err != nil {
		t.Fatalf("retrieve %s: %v", id, err)
	}
	return out
}

func refundReq(key, id string, amount int64) provider.RefundRequest {
	return provider.RefundRequest{ProviderKey: "pdr_" + key, ChargeID: id, Amount: amount, MerchantID: "m_123", IdempotencyKey: key}
}

func wantRefused(t *testing.T, refused bool, code, want string) {
	t.Helper()
	if !refused || code != want {
		t.Fatalf("refused = %v, code %q; want refused %q", refused, code, want)
	}
}

// TestLifecycleAgainstSimulator runs the operations after a charge through
// the Stripe adapter against the simulator, which keeps their state: what
// stripe-mock, stateless, cannot show (provider/stripe's
// TestStripeLifecycleConformsToStripeAPI checks the wire there).
func TestLifecycleAgainstSimulator(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"AuthorizeThenCapturePart", testAuthorizeThenCapturePart},
		{"CaptureTooLarge", testCaptureTooLarge},
		{"CaptureWindowExpires", testCaptureWindowExpires},
		{"CancelAuthorization", testCancelAuthorization},
		{"PartialRefundsUpToCaptured", testPartialRefundsUpToCaptured},
		{"RefundPendingThenFails", testRefundPendingThenFails},
		{"RefundOfUncaptured", testRefundOfUncaptured},
		{"IdempotentReplay", testLifecycleReplay},
		{"DropAfterActingThenLookup", testLifecycleDropAfterActing},
		{"FaultClasses", testLifecycleFaultClasses},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t)
		})
	}
}

func testAuthorizeThenCapturePart(t *testing.T) {
	env := setupLifecycle(t, stripesim.Config{})
	auth := env.authorize(t, "k-auth")
	// An authorization is not a charge: nothing has moved.
	wantCharges(t, env.sim, "k-auth", 0)

	capt := env.capture(t, "pdc_1", auth.ChargeID, 1500)
	if capt.Refused || !capt.Captured() || capt.AmountReceived != 1500 || capt.AmountCapturable != 0 || capt.Replayed {
		t.Fatalf("capture = %+v", capt)
	}
	wantCharges(t, env.sim, "k-auth", 1)
	if c := env.sim.Charges(); c[0].Amount != 1500 {
		t.Fatalf("ledger charge = %+v, want 1500 captured", c[0])
	}
	// One capture per intent: a second (another key) is refused, the
	// rest of the authorization was released.
	again := env.capture(t, "pdc_2", auth.ChargeID, 400)
	wantRefused(t, again.Refused, again.RefusalCode, "payment_intent_unexpected_state")
	if got := env.retrieve(t, auth.ChargeID); !got.Captured() || got.AmountReceived != 1500 || got.Amount != 1999 {
		t.Fatalf("retrieve = %+v", got)
	}
}

func testCaptureTooLarge(t *testing.T) {
	env := setupLifecycle(t, stripesim.Config{})
	auth := env.authorize(t, "k-big")
	big := env.capture(t, "pdc_big", auth.ChargeID, 5000)
	wantRefused(t, big.Refused, big.RefusalCode, "amount_too_large")
	if got := env.retrieve(t, auth.ChargeID); got.Status != provider.StatusRequiresCapture || got.AmountCapturable != 1999 {
		t.Fatalf("after a refused capture: %+v", got)
	}
	all := env.capture(t, "pdc_all", auth.ChargeID, 0)
	if !all.Captured() || all.AmountReceived != 1999 {
		t.Fatalf("capture all = %+v", all)
	}
}

func testCaptureWindowExpires(t *testing.T) {
	env := setupLifecycle(t, stripesim.Config{CaptureWindow: time.Hour})
	auth := env.authorize(t, "k-late")
	env.clk.Advance(time.Hour - time.Second)
	if got := env.retrieve(t, auth.ChargeID); got.Status != provider.StatusRequiresCapture {
		t.Fatalf("within the window: %+v", got)
	}
	env.clk.Advance(time.Second)
	if got := env.retrieve(t, auth.ChargeID); got.Status != provider.StatusCanceled || got.AmountCapturable != 0 {
		t.Fatalf("after the window: %+v, want canceled", got)
	}
	late := env.capture(t, "pdc_late", auth.ChargeID, 0)
	wantRefused(t, late.Refused, late.RefusalCode, "payment_intent_unexpected_state")
	wantCharges(t, env.sim, "k-late", 0)
}

func testCancelAuthorization(t *testing.T) {
	env := setupLifecycle(t, stripesim.Config{})
	ctx := context.Background()
	auth := env.authorize(t, "k-void")
	out, err := env.p.Cancel(ctx, provider.CancelRequest{ProviderKey: "pdv_1", ChargeID: auth.ChargeID, Reason: "requested_by_customer"})
	if err != nil || out.Refused || out.Status != provider.StatusCanceled {
		t.Fatalf("cancel = %+v, %v", out, err)
	}
	late := env.capture(t, "pdc_void", auth.ChargeID, 0)
	wantRefused(t, late.Refused, late.RefusalCode, "payment_intent_unexpected_state")

	// No cancel after a capture.
	auth2 := env.authorize(t, "k-void2")
	env.capture(t, "pdc_void2", auth2.ChargeID, 0)
	out, err = env.p.Cancel(ctx, provider.CancelRequest{ProviderKey: "pdv_2", ChargeID: auth2.ChargeID})
	if err != nil {
		t.Fatal(err)
	}
	wantRefused(t, out.Refused, out.RefusalCode, "payment_intent_unexpected_state")
	wantCharges(t, env.sim, "k-void", 0)
	wantCharges(t, env.sim, "k-void2", 1)
}

func testPartialRefundsUpToCaptured(t *testing.T) {
	env := setupLifecycle(t, stripesim.Config{})
	auth := env.authorize(t, "k-refunds")
	env.capture(t, "pdc_r", auth.ChargeID, 1500)

	r1 := env.refund(t, "r1", auth.ChargeID, 1000)
	if r1.Refused || r1.Status != provider.RefundSucceeded || r1.Amount != 1000 || r1.RefundID == "" || r1.ChargeID != auth.ChargeID {
		t.Fatalf("refund 1 = %+v", r1)
	}
	// More than captured minus refunded (500 left of the 1500 captured,
	// not of the 1999 authorized) is refused.
	big := env.refund(t, "r2", auth.ChargeID, 501)
	wantRefused(t, big.Refused, big.RefusalCode, "amount_too_large")
	rest := env.refund(t, "r3", auth.ChargeID, 0)
	if rest.Refused || rest.Amount != 500 || rest.Status != provider.RefundSucceeded {
		t.Fatalf("refund of the rest = %+v", rest)
	}
	done := env.refund(t, "r4", auth.ChargeID, 1)
	wantRefused(t, done.Refused, done.RefusalCode, "charge_already_refunded")

	refunds := env.sim.Refunds()
	if len(refunds) != 2 || refunds[0].Amount+refunds[1].Amount != 1500 || refunds[0].IdempotencyKey != "r1" || refunds[1].ProviderKey != "pdr_r3" {
		t.Fatalf("simulator refunds = %+v", refunds)
	}
	for _, key := range []string{"r1", "r3"} {
		res, err := env.p.LookupRefund(context.Background(), provider.RefundLookupRequest{ChargeID: auth.ChargeID, MerchantID: "m_123", IdempotencyKey: key})
		if err != nil || !res.Found || res.Outcome.IdempotencyKey != key || res.Outcome.Status != provider.RefundSucceeded {
			t.Fatalf("lookup %s = %+v, %v", key, res, err)
		}
	}
	// A refused refund was never made: not found.
	res, err := env.p.LookupRefund(context.Background(), provider.RefundLookupRequest{ChargeID: auth.ChargeID, MerchantID: "m_123", IdempotencyKey: "r2"})
	if err != nil || res.Found {
		t.Fatalf("lookup of the refused refund = %+v, %v", res, err)
	}
}

func testRefundPendingThenFails(t *testing.T) {
	env := setupLifecycle(t, stripesim.Config{Faults: stripesim.Faults{RateRefundFail: 1}, ProcessingDelay: time.Hour})
	out := mustCharge(t, env.p, chargeReq("k-pending"))
	pending := env.refund(t, "rp1", out.ChargeID, 0)
	if pending.Status != provider.RefundPending || pending.Final() || !pending.Holds() || pending.Amount != 1999 {
		t.Fatalf("refund = %+v, want pending", pending)
	}
	// A pending refund holds its money: nothing is left to refund.
	held := env.refund(t, "rp2", out.ChargeID, 1)
	wantRefused(t, held.Refused, held.RefusalCode, "charge_already_refunded")

	env.clk.Advance(time.Hour)
	res, err := env.p.LookupRefund(context.Background(), provider.RefundLookupRequest{ChargeID: out.ChargeID, MerchantID: "m_123", IdempotencyKey: "rp1", Amount: 1999})
	if err != nil || !res.Found || res.Outcome.Status != provider.RefundFailed || res.Outcome.FailureReason == "" || res.Outcome.Holds() {
		t.Fatalf("lookup after the delay = %+v, %v; want failed", res.Outcome, err)
	}
	// The failure put the money back: it can be refunded again.
	env.faults(t, stripesim.Faults{})
	again := env.refund(t, "rp3", out.ChargeID, 0)
	if again.Refused || again.Status != provider.RefundSucceeded || again.Amount != 1999 {
		t.Fatalf("refund after the failure = %+v", again)
	}
}

func testRefundOfUncaptured(t *testing.T) {
	env := setupLifecycle(t, stripesim.Config{})
	auth := env.authorize(t, "k-uncaptured")
	r := env.refund(t, "ru", auth.ChargeID, 0)
	wantRefused(t, r.Refused, r.RefusalCode, "payment_intent_unexpected_state")
	if len(env.sim.Refunds()) != 0 {
		t.Fatalf("refunds = %+v, want none", env.sim.Refunds())
	}
	// No such intent: our request is wrong, not a refusal.
	_, err := env.p.Refund(context.Background(), refundReq("rx", "pi_missing", 0))
	wantClass(t, err, provider.ClassRejected)
}

func testLifecycleReplay(t *testing.T) {
	env := setupLifecycle(t, stripesim.Config{})
	ctx := context.Background()
	auth := env.authorize(t, "k-replay")
	first := env.capture(t, "pdc_replay", auth.ChargeID, 1000)
	// The same capture again replays its answer: not a second capture,
	// not a refusal.
	again := env.capture(t, "pdc_replay", auth.ChargeID, 1000)
	if !again.Replayed || again.Refused || string(again.Response) != string(first.Response) {
		t.Fatalf("replayed capture = %+v", again)
	}
	_, err := env.p.Capture(ctx, provider.CaptureRequest{ProviderKey: "pdc_replay", ChargeID: auth.ChargeID, Amount: 999})
	wantClass(t, err, provider.ClassMismatch)

	r1 := env.refund(t, "rr", auth.ChargeID, 300)
	r2 := env.refund(t, "rr", auth.ChargeID, 300)
	if !r2.Replayed || r2.RefundID != r1.RefundID || string(r2.Response) != string(r1.Response) {
		t.Fatalf("replayed refund = %+v, first %+v", r2, r1)
	}
	_, err = env.p.Refund(ctx, refundReq("rr", auth.ChargeID, 400))
	wantClass(t, err, provider.ClassMismatch)
	// A key of one operation is not another's.
	_, err = env.p.Refund(ctx, provider.RefundRequest{ProviderKey: "pdc_replay", ChargeID: auth.ChargeID, Amount: 1, MerchantID: "m_123", IdempotencyKey: "x"})
	wantClass(t, err, provider.ClassMismatch)
	req := chargeReq("k-replay-2")
	req.ProviderKey = "pdr_rr"
	_, err = env.p.Charge(ctx, req)
	wantClass(t, err, provider.ClassMismatch)
	if n := len(env.sim.Refunds()); n != 1 {
		t.Fatalf("refunds = %d, want 1", n)
	}
}

func testLifecycleDropAfterActing(t *testing.T) {
	env := setupLifecycle(t, stripesim.Config{})
	ctx := context.Background()
	auth := env.authorize(t, "k-dropped")
	auth2 := env.authorize(t, "k-dropped-2")
	env.faults(t, stripesim.Faults{RateDropAfterCharge: 1})

	// The capture happens, its answer is lost: unknown, and the lookup
	// (a retrieve) says it was captured.
	_, err := env.p.Capture(ctx, provider.CaptureRequest{ProviderKey: "pdc_drop", ChargeID: auth.ChargeID, Amount: 1200})
	wantClass(t, err, provider.ClassUnknown)
	_, err = env.p.Cancel(ctx, provider.CancelRequest{ProviderKey: "pdv_drop", ChargeID: auth2.ChargeID})
	wantClass(t, err, provider.ClassUnknown)
	_, err = env.p.Refund(ctx, refundReq("rd", auth.ChargeID, 700))
	wantClass(t, err, provider.ClassUnknown)

	env.faults(t, stripesim.Faults{})
	if got := env.retrieve(t, auth.ChargeID); !got.Captured() || got.AmountReceived != 1200 {
		t.Fatalf("lookup of the dropped capture = %+v", got)
	}
	if got := env.retrieve(t, auth2.ChargeID); got.Status != provider.StatusCanceled {
		t.Fatalf("lookup of the dropped cancel = %+v", got)
	}
	res, err := env.p.LookupRefund(ctx, provider.RefundLookupRequest{ChargeID: auth.ChargeID, MerchantID: "m_123", IdempotencyKey: "rd", Amount: 700})
	if err != nil || !res.Found || res.Outcome.Status != provider.RefundSucceeded {
		t.Fatalf("lookup of the dropped refund = %+v, %v", res, err)
	}
	// Re-called under their keys, each replays: nothing happens twice.
	if again := env.capture(t, "pdc_drop", auth.ChargeID, 1200); !again.Replayed || again.Refused {
		t.Fatalf("capture re-called = %+v", again)
	}
	if again := env.refund(t, "rd", auth.ChargeID, 700); !again.Replayed || again.RefundID != res.Outcome.RefundID {
		t.Fatalf("refund re-called = %+v", again)
	}
	if refunds := env.sim.Refunds(); len(refunds) != 1 {
		t.Fatalf("refunds = %+v, want one", refunds)
	}
}

func testLifecycleFaultClasses(t *testing.T) {
	env := setupLifecycle(t, stripesim.Config{})
	ctx := context.Background()
	auth := env.authorize(t, "k-faults")
	env.faults(t, stripesim.Faults{Rate5xx: 1})
	_, err := env.p.Capture(ctx, provider.CaptureRequest{ProviderKey: "pdc_f", ChargeID: auth.ChargeID})
	wantClass(t, err, provider.ClassUnknown)
	env.faults(t, stripesim.Faults{Rate429: 1})
	_, err = env.p.Refund(ctx, refundReq("rf", auth.ChargeID, 0))
	if pe := wantClass(t, err, provider.ClassRetryable); !pe.RateLimited() {
		t.Fatalf("429 = %+v, want rate limited", pe)
	}
	env.faults(t, stripesim.Faults{RateFailBeforeCharge: 1})
	_, err = env.p.LookupRefund(ctx, provider.RefundLookupRequest{ChargeID: auth.ChargeID, MerchantID: "m_123", IdempotencyKey: "rf"})
	if err == nil {
		t.Fatal("lookup over a dropped connection answered")
	}
	env.faults(t, stripesim.Faults{})
	if got := env.retrieve(t, auth.ChargeID); got.Status != provider.StatusRequiresCapture {
		t.Fatalf("after the faults: %+v, want nothing captured", got)
	}
	if _, err := env.p.RetrieveIntent(ctx, provider.RetrieveIntentRequest{ChargeID: "pi_missing"}); !errors.Is(err, provider.ErrNoSuchIntent) {
		t.Fatalf("retrieve of no intent: %v", err)
	}
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
