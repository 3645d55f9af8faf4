package providertest

import (
	"context"
	"errors"
	"iter"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider"
)

// Lifecycle is what the operations after a charge need of a provider,
// declared here as a caller declares it; the Stripe adapter has it.
type Lifecycle interface {
	provider.Provider
	Capture(context.Context, provider.CaptureRequest) (*provider.IntentOutcome, error)
	Cancel(context.Context, provider.CancelRequest) (*provider.IntentOutcome, error)
	RetrieveIntent(context.Context, provider.RetrieveIntentRequest) (*provider.IntentOutcome, error)
	Refund(context.Context, provider.RefundRequest) (*provider.RefundOutcome, error)
	LookupRefund(context.Context, provider.RefundLookupRequest) (provider.RefundLookupResult, error)
	ListRefundsSince(ctx context.Context, from time.Time, startingAfter string) iter.Seq2[*provider.RefundOutcome, error]
}

// LifecycleTarget is one provider under the lifecycle suite and what the
// suite may see of the other end.
type LifecycleTarget struct {
	// P is the provider under test.
	P Lifecycle
	// Sim is the simulator behind P and Advance moves its clock; both nil
	// for a stateless mock (stripe-mock).
	Sim     *stripesim.Simulator
	Advance func(time.Duration)
	// Shape, for a stateless mock, makes the objects of the answers that
	// follow (payment intents, refunds) look as the scenario needs: the
	// mock answers fixtures that know nothing of the request. nil for the
	// simulator, whose answers are its own.
	Shape func(func(obj map[string]any))
	// Sent returns the requests P sent since the last call.
	Sent func() []Sent
}

// Sent is one request a provider sent.
type Sent struct {
	Method, Path, IdempotencyKey string
}

// LifecycleCaps says which scenarios apply to a target.
type LifecycleCaps struct {
	// Stateful is set for a target that keeps the payments' state (the
	// simulator): refusals, replays, expiry, faults and the lookups after
	// a lost answer need it. A stateless mock checks the wire: each
	// request accepted, its key sent, its answer read.
	Stateful bool
}

// NewLifecycleTarget builds a target for one scenario; cfg is the
// simulator's (a mock ignores it).
type NewLifecycleTarget func(t *testing.T, cfg stripesim.Config) *LifecycleTarget

// RunLifecycleSuite runs the behavioural suite of the operations after a
// charge (authorize, capture, cancel, refund, their lookups) against a
// target, every scenario that caps says applies (watermill's TestPubSub
// style).
func RunLifecycleSuite(t *testing.T, newTarget NewLifecycleTarget, caps LifecycleCaps) {
	type scenario struct {
		name string
		fn   func(t *testing.T, e *lifeEnv)
		cfg  stripesim.Config
	}
	tests := []scenario{
		{name: "Authorize", fn: testAuthorize},
		{name: "CaptureThenRetrieve", fn: testCaptureThenRetrieve},
		{name: "Cancel", fn: testCancel},
		{name: "RefundThenLookup", fn: testRefundThenLookup},
		{name: "RefundsSince", fn: testRefundsSince},
	}
	if caps.Stateful {
		tests = append(tests,
			scenario{name: "OneCapture", fn: testOneCapture},
			scenario{name: "CaptureTooLarge", fn: testCaptureTooLarge},
			scenario{name: "CaptureWindowExpires", fn: testCaptureWindowExpires, cfg: stripesim.Config{CaptureWindow: time.Hour}},
			scenario{name: "NoCaptureAfterCancel", fn: testNoCaptureAfterCancel},
			scenario{name: "PartialRefundsUpToCaptured", fn: testPartialRefundsUpToCaptured},
			scenario{name: "RefundPendingThenFails", fn: testRefundPendingThenFails,
				cfg: stripesim.Config{Faults: stripesim.Faults{RateRefundFail: 1}, ProcessingDelay: time.Hour}},
			scenario{name: "RefundOfUncaptured", fn: testRefundOfUncaptured},
			scenario{name: "IdempotentReplay", fn: testLifecycleReplay},
			scenario{name: "LostAnswerThenLookup", fn: testLostAnswerThenLookup},
			scenario{name: "FaultClasses", fn: testLifecycleFaultClasses},
		)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tgt := newTarget(t, tt.cfg)
			tt.fn(t, &lifeEnv{LifecycleTarget: tgt})
		})
	}
}

// lifeEnv is a target with the suite's helpers.
type lifeEnv struct {
	*LifecycleTarget
}

// shape makes the answers that follow look like f says, for a mock.
func (e *lifeEnv) shape(f func(obj map[string]any)) {
	if e.Shape != nil {
		e.Shape(f)
	}
}

// intentAs shapes a payment intent as req's, with status and sums.
func intentAs(req provider.ChargeRequest, status string, capturable, received int64) func(map[string]any) {
	return func(obj map[string]any) {
		if obj["object"] != "payment_intent" {
			return
		}
		obj["metadata"] = map[string]any{provider.MetadataMerchantID: req.MerchantID, provider.MetadataIdempotencyKey: req.IdempotencyKey}
		obj["amount"], obj["currency"], obj["status"], obj["last_payment_error"] = req.Amount, req.Currency, status, nil
		obj["amount_capturable"], obj["amount_received"], obj["capture_method"] = capturable, received, "manual"
	}
}

// refundAs shapes a refund as req's, with status.
func refundAs(req provider.RefundRequest, status string) func(map[string]any) {
	return func(obj map[string]any) {
		if obj["object"] != "refund" {
			return
		}
		obj["amount"], obj["status"] = req.Amount, status
		obj["metadata"] = map[string]any{provider.MetadataMerchantID: req.MerchantID, provider.MetadataIdempotencyKey: req.IdempotencyKey}
	}
}

// wantSent checks the requests sent since the last check: their methods
// and paths, and each POST's idempotency key.
func (e *lifeEnv) wantSent(t *testing.T, want ...Sent) {
	t.Helper()
	got := e.Sent()
	if len(got) != len(want) {
		t.Fatalf("sent %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("request %d: sent %+v, want %+v", i, got[i], want[i])
		}
	}
}

func (e *lifeEnv) authorize(t *testing.T, key string) (*provider.Outcome, provider.ChargeRequest) {
	t.Helper()
	req := ChargeReq(key)
	req.ManualCapture = true
	e.shape(intentAs(req, provider.StatusRequiresCapture, req.Amount, 0))
	e.Sent() // what came before
	out := MustCharge(t, e.P, req)
	if !out.Authorized || out.Status != provider.StatusRequiresCapture || out.AmountCapturable != req.Amount || out.Declined || out.Processing || out.ChargeID == "" {
		t.Fatalf("authorize %s = %+v", key, out)
	}
	e.wantSent(t, Sent{http.MethodPost, "/v1/payment_intents", req.ProviderKey})
	return out, req
}

func (e *lifeEnv) capture(t *testing.T, key, id string, amount int64) *provider.IntentOutcome {
	t.Helper()
	out, err := e.P.Capture(context.Background(), provider.CaptureRequest{ProviderKey: key, ChargeID: id, Amount: amount})
	if err != nil {
		t.Fatalf("capture %s: %v", key, err)
	}
	return out
}

func (e *lifeEnv) refund(t *testing.T, key, id string, amount int64) *provider.RefundOutcome {
	t.Helper()
	out, err := e.P.Refund(context.Background(), RefundReq(key, id, amount))
	if err != nil {
		t.Fatalf("refund %s: %v", key, err)
	}
	return out
}

func (e *lifeEnv) retrieve(t *testing.T, id string) *provider.IntentOutcome {
	t.Helper()
	out, err := e.P.RetrieveIntent(context.Background(), provider.RetrieveIntentRequest{ChargeID: id})
	if err != nil {
		t.Fatalf("retrieve %s: %v", id, err)
	}
	return out
}

func (e *lifeEnv) lookupRefund(t *testing.T, id, key string, amount int64) provider.RefundLookupResult {
	t.Helper()
	res, err := e.P.LookupRefund(context.Background(), provider.RefundLookupRequest{ChargeID: id, MerchantID: "m_123", IdempotencyKey: key, Amount: amount})
	if err != nil {
		t.Fatalf("lookup refund %s: %v", key, err)
	}
	return res
}

func (e *lifeEnv) faults(t *testing.T, f stripesim.Faults) {
	t.Helper()
	if err := e.Sim.SetFaults(f); err != nil {
		t.Fatal(err)
	}
}

func (e *lifeEnv) wantCharges(t *testing.T, key string, n int) {
	t.Helper()
	if got := e.Sim.ChargesByKey()["m_123:"+key]; got != n {
		t.Fatalf("ledger charges for %s = %d, want %d (ledger: %+v)", key, got, n, e.Sim.Ledger())
	}
}

// RefundReq is a valid refund of amount (0: the rest) of intent id under
// the refund's own key.
func RefundReq(key, id string, amount int64) provider.RefundRequest {
	return provider.RefundRequest{ProviderKey: "pdr_" + key, ChargeID: id, Amount: amount, MerchantID: "m_123", IdempotencyKey: key,
		Metadata: map[string]string{"reason": "damaged"}}
}

func wantRefused(t *testing.T, refused bool, code, want string) {
	t.Helper()
	if !refused || code != want {
		t.Fatalf("refused = %v, code %q; want refused %q", refused, code, want)
	}
}

// The scenarios every target runs: each operation's success, its key,
// its answer read.

func testAuthorize(t *testing.T, e *lifeEnv) {
	_, req := e.authorize(t, "k-auth")
	if e.Sim != nil {
		// An authorization is not a charge: nothing has moved.
		e.wantCharges(t, req.IdempotencyKey, 0)
	}
}

func testCaptureThenRetrieve(t *testing.T, e *lifeEnv) {
	auth, req := e.authorize(t, "k-capture")
	e.shape(intentAs(req, provider.StatusSucceeded, 0, 1500))
	capt := e.capture(t, "pdc_1", auth.ChargeID, 1500)
	if capt.Refused || !capt.Captured() || capt.AmountReceived != 1500 || capt.AmountCapturable != 0 || capt.Replayed || capt.ChargeID != auth.ChargeID {
		t.Fatalf("capture = %+v", capt)
	}
	e.wantSent(t, Sent{http.MethodPost, "/v1/payment_intents/" + auth.ChargeID + "/capture", "pdc_1"})
	got := e.retrieve(t, auth.ChargeID)
	if !got.Captured() || got.AmountReceived != 1500 || got.Amount != req.Amount {
		t.Fatalf("retrieve = %+v", got)
	}
	e.wantSent(t, Sent{http.MethodGet, "/v1/payment_intents/" + auth.ChargeID, ""})
	if e.Sim != nil {
		e.wantCharges(t, req.IdempotencyKey, 1)
		if c := e.Sim.Charges(); c[0].Amount != 1500 {
			t.Fatalf("ledger charge = %+v, want 1500 captured", c[0])
		}
	}
}

func testCancel(t *testing.T, e *lifeEnv) {
	auth, req := e.authorize(t, "k-void")
	e.shape(intentAs(req, provider.StatusCanceled, 0, 0))
	out, err := e.P.Cancel(context.Background(), provider.CancelRequest{ProviderKey: "pdv_1", ChargeID: auth.ChargeID, Reason: "requested_by_customer"})
	if err != nil || out.Refused || out.Status != provider.StatusCanceled || out.AmountCapturable != 0 {
		t.Fatalf("cancel = %+v, %v", out, err)
	}
	e.wantSent(t, Sent{http.MethodPost, "/v1/payment_intents/" + auth.ChargeID + "/cancel", "pdv_1"})
}

func testRefundThenLookup(t *testing.T, e *lifeEnv) {
	req := ChargeReq("k-refund")
	e.shape(intentAs(req, provider.StatusSucceeded, 0, req.Amount))
	out := MustCharge(t, e.P, req)
	e.Sent()
	rreq := RefundReq("r1", out.ChargeID, 500)
	e.shape(refundAs(rreq, provider.RefundSucceeded))
	ref := e.refund(t, "r1", out.ChargeID, 500)
	if ref.Refused || ref.RefundID == "" || ref.Status != provider.RefundSucceeded || ref.Amount != 500 || !ref.Final() || !ref.Holds() ||
		ref.IdempotencyKey != "r1" || ref.MerchantID != "m_123" {
		t.Fatalf("refund = %+v", ref)
	}
	e.wantSent(t, Sent{http.MethodPost, "/v1/refunds", rreq.ProviderKey})
	res := e.lookupRefund(t, out.ChargeID, "r1", 500)
	if !res.Found || res.Outcome.Amount != 500 || res.Outcome.IdempotencyKey != "r1" {
		t.Fatalf("lookup refund = %+v", res)
	}
	e.wantSent(t, Sent{http.MethodGet, "/v1/refunds", ""})
	// Another key's refund is not this one's: not found.
	if res := e.lookupRefund(t, out.ChargeID, "r-other", 0); res.Found {
		t.Fatalf("lookup of another key = %+v", res.Outcome)
	}
	e.wantSent(t, Sent{http.MethodGet, "/v1/refunds", ""})
}

// testRefundsSince: the account's refunds listed by creation time (the
// audit's read) are one GET /v1/refunds, and decode with their metadata;
// at the simulator, a refund created before from is left out.
func testRefundsSince(t *testing.T, e *lifeEnv) {
	req := ChargeReq("k-refunds-since")
	e.shape(intentAs(req, provider.StatusSucceeded, 0, req.Amount))
	out := MustCharge(t, e.P, req)
	from := time.Now()
	if e.Sim != nil {
		e.refund(t, "rs-before", out.ChargeID, 200)
		e.Advance(10 * time.Second)
		from = e.Sim.Refunds()[0].Created.Add(10 * time.Second)
	}
	rreq := RefundReq("rs1", out.ChargeID, 300)
	e.shape(refundAs(rreq, provider.RefundSucceeded))
	e.refund(t, "rs1", out.ChargeID, 300)
	e.Sent()
	var got []*provider.RefundOutcome
	for re, err := range e.P.ListRefundsSince(context.Background(), from, "") {
		if err != nil {
			t.Fatalf("list refunds since: %v", err)
		}
		got = append(got, re)
	}
	e.wantSent(t, Sent{http.MethodGet, "/v1/refunds", ""})
	if len(got) == 0 || got[0].IdempotencyKey != "rs1" || got[0].MerchantID != "m_123" || got[0].Amount != 300 ||
		got[0].Status != provider.RefundSucceeded || got[0].RefundID == "" {
		t.Fatalf("refunds since = %+v", got)
	}
	if e.Sim != nil && (len(got) != 1 || got[0].ChargeID != out.ChargeID) {
		t.Fatalf("refunds since %s = %d (first %+v), want rs1 of %s only", from, len(got), got[0], out.ChargeID)
	}
}

// The scenarios that need the provider's state.

func testOneCapture(t *testing.T, e *lifeEnv) {
	auth, _ := e.authorize(t, "k-once")
	e.capture(t, "pdc_1", auth.ChargeID, 1500)
	// Stripe captures once (without multicapture): a second capture
	// (another key) is refused, the rest of the authorization released.
	again := e.capture(t, "pdc_2", auth.ChargeID, 400)
	wantRefused(t, again.Refused, again.RefusalCode, "payment_intent_unexpected_state")
	if got := e.retrieve(t, auth.ChargeID); !got.Captured() || got.AmountReceived != 1500 || got.AmountCapturable != 0 {
		t.Fatalf("retrieve = %+v", got)
	}
}

func testCaptureTooLarge(t *testing.T, e *lifeEnv) {
	auth, req := e.authorize(t, "k-big")
	big := e.capture(t, "pdc_big", auth.ChargeID, req.Amount+1)
	wantRefused(t, big.Refused, big.RefusalCode, "amount_too_large")
	if got := e.retrieve(t, auth.ChargeID); got.Status != provider.StatusRequiresCapture || got.AmountCapturable != req.Amount {
		t.Fatalf("after a refused capture: %+v", got)
	}
	all := e.capture(t, "pdc_all", auth.ChargeID, 0)
	if !all.Captured() || all.AmountReceived != req.Amount {
		t.Fatalf("capture all = %+v", all)
	}
}

func testCaptureWindowExpires(t *testing.T, e *lifeEnv) {
	auth, req := e.authorize(t, "k-late")
	e.Advance(time.Hour - time.Second)
	if got := e.retrieve(t, auth.ChargeID); got.Status != provider.StatusRequiresCapture {
		t.Fatalf("within the window: %+v", got)
	}
	e.Advance(time.Second)
	if got := e.retrieve(t, auth.ChargeID); got.Status != provider.StatusCanceled || got.AmountCapturable != 0 {
		t.Fatalf("after the window: %+v, want canceled", got)
	}
	late := e.capture(t, "pdc_late", auth.ChargeID, 0)
	wantRefused(t, late.Refused, late.RefusalCode, "payment_intent_unexpected_state")
	e.wantCharges(t, req.IdempotencyKey, 0)
}

func testNoCaptureAfterCancel(t *testing.T, e *lifeEnv) {
	ctx := context.Background()
	auth, _ := e.authorize(t, "k-void")
	if _, err := e.P.Cancel(ctx, provider.CancelRequest{ProviderKey: "pdv_1", ChargeID: auth.ChargeID}); err != nil {
		t.Fatal(err)
	}
	late := e.capture(t, "pdc_void", auth.ChargeID, 0)
	wantRefused(t, late.Refused, late.RefusalCode, "payment_intent_unexpected_state")

	// No cancel after a capture.
	auth2, _ := e.authorize(t, "k-void2")
	e.capture(t, "pdc_void2", auth2.ChargeID, 0)
	out, err := e.P.Cancel(ctx, provider.CancelRequest{ProviderKey: "pdv_2", ChargeID: auth2.ChargeID})
	if err != nil {
		t.Fatal(err)
	}
	wantRefused(t, out.Refused, out.RefusalCode, "payment_intent_unexpected_state")
	e.wantCharges(t, "k-void", 0)
	e.wantCharges(t, "k-void2", 1)
}

func testPartialRefundsUpToCaptured(t *testing.T, e *lifeEnv) {
	auth, _ := e.authorize(t, "k-refunds")
	e.capture(t, "pdc_r", auth.ChargeID, 1500)

	r1 := e.refund(t, "r1", auth.ChargeID, 1000)
	if r1.Refused || r1.Status != provider.RefundSucceeded || r1.Amount != 1000 || r1.ChargeID != auth.ChargeID {
		t.Fatalf("refund 1 = %+v", r1)
	}
	// More than captured minus refunded (500 left of the 1500 captured,
	// not of the 1999 authorized) is refused.
	big := e.refund(t, "r2", auth.ChargeID, 501)
	wantRefused(t, big.Refused, big.RefusalCode, "amount_too_large")
	rest := e.refund(t, "r3", auth.ChargeID, 0)
	if rest.Refused || rest.Amount != 500 || rest.Status != provider.RefundSucceeded {
		t.Fatalf("refund of the rest = %+v", rest)
	}
	done := e.refund(t, "r4", auth.ChargeID, 1)
	wantRefused(t, done.Refused, done.RefusalCode, "charge_already_refunded")

	refunds := e.Sim.Refunds()
	if len(refunds) != 2 || refunds[0].Amount+refunds[1].Amount != 1500 || refunds[0].IdempotencyKey != "r1" || refunds[1].ProviderKey != "pdr_r3" {
		t.Fatalf("simulator refunds = %+v", refunds)
	}
	for _, key := range []string{"r1", "r3"} {
		if res := e.lookupRefund(t, auth.ChargeID, key, 0); !res.Found || res.Outcome.IdempotencyKey != key || res.Outcome.Status != provider.RefundSucceeded {
			t.Fatalf("lookup %s = %+v", key, res)
		}
	}
	// A refused refund was never made: not found.
	if res := e.lookupRefund(t, auth.ChargeID, "r2", 0); res.Found {
		t.Fatalf("lookup of the refused refund = %+v", res.Outcome)
	}
}

func testRefundPendingThenFails(t *testing.T, e *lifeEnv) {
	out := MustCharge(t, e.P, ChargeReq("k-pending"))
	pending := e.refund(t, "rp1", out.ChargeID, 0)
	if pending.Status != provider.RefundPending || pending.Final() || !pending.Holds() || pending.Amount != 1999 {
		t.Fatalf("refund = %+v, want pending", pending)
	}
	// A pending refund holds its money: nothing is left to refund.
	held := e.refund(t, "rp2", out.ChargeID, 1)
	wantRefused(t, held.Refused, held.RefusalCode, "charge_already_refunded")

	e.Advance(time.Hour)
	res := e.lookupRefund(t, out.ChargeID, "rp1", 1999)
	if !res.Found || res.Outcome.Status != provider.RefundFailed || res.Outcome.FailureReason == "" || res.Outcome.Holds() || !res.Outcome.Final() {
		t.Fatalf("lookup after the delay = %+v; want failed", res.Outcome)
	}
	// The failure put the money back: it can be refunded again.
	e.faults(t, stripesim.Faults{})
	again := e.refund(t, "rp3", out.ChargeID, 0)
	if again.Refused || again.Status != provider.RefundSucceeded || again.Amount != 1999 {
		t.Fatalf("refund after the failure = %+v", again)
	}
}

func testRefundOfUncaptured(t *testing.T, e *lifeEnv) {
	auth, _ := e.authorize(t, "k-uncaptured")
	r := e.refund(t, "ru", auth.ChargeID, 0)
	wantRefused(t, r.Refused, r.RefusalCode, "payment_intent_unexpected_state")
	if len(e.Sim.Refunds()) != 0 {
		t.Fatalf("refunds = %+v, want none", e.Sim.Refunds())
	}
	// No such intent: our request is wrong, not a refusal.
	_, err := e.P.Refund(context.Background(), RefundReq("rx", "pi_missing", 0))
	WantClass(t, err, provider.ClassRejected)
}

func testLifecycleReplay(t *testing.T, e *lifeEnv) {
	ctx := context.Background()
	auth, _ := e.authorize(t, "k-replay")
	first := e.capture(t, "pdc_replay", auth.ChargeID, 1000)
	// The same capture again replays its answer: not a second capture,
	// not a refusal.
	again := e.capture(t, "pdc_replay", auth.ChargeID, 1000)
	if !again.Replayed || again.Refused || string(again.Response) != string(first.Response) {
		t.Fatalf("replayed capture = %+v", again)
	}
	_, err := e.P.Capture(ctx, provider.CaptureRequest{ProviderKey: "pdc_replay", ChargeID: auth.ChargeID, Amount: 999})
	WantClass(t, err, provider.ClassMismatch)

	r1 := e.refund(t, "rr", auth.ChargeID, 300)
	r2 := e.refund(t, "rr", auth.ChargeID, 300)
	if !r2.Replayed || r2.RefundID != r1.RefundID || string(r2.Response) != string(r1.Response) {
		t.Fatalf("replayed refund = %+v, first %+v", r2, r1)
	}
	_, err = e.P.Refund(ctx, RefundReq("rr", auth.ChargeID, 400))
	WantClass(t, err, provider.ClassMismatch)
	// A key of one operation is not another's.
	_, err = e.P.Refund(ctx, provider.RefundRequest{ProviderKey: "pdc_replay", ChargeID: auth.ChargeID, Amount: 1, MerchantID: "m_123", IdempotencyKey: "x"})
	WantClass(t, err, provider.ClassMismatch)
	req := ChargeReq("k-replay-2")
	req.ProviderKey = "pdr_rr"
	_, err = e.P.Charge(ctx, req)
	WantClass(t, err, provider.ClassMismatch)
	if n := len(e.Sim.Refunds()); n != 1 {
		t.Fatalf("refunds = %d, want 1", n)
	}
}

func testLostAnswerThenLookup(t *testing.T, e *lifeEnv) {
	ctx := context.Background()
	auth, _ := e.authorize(t, "k-dropped")
	auth2, _ := e.authorize(t, "k-dropped-2")
	e.faults(t, stripesim.Faults{RateDropAfterCharge: 1})

	// Each acts, and its answer is lost: unknown, never "not done".
	_, err := e.P.Capture(ctx, provider.CaptureRequest{ProviderKey: "pdc_drop", ChargeID: auth.ChargeID, Amount: 1200})
	WantClass(t, err, provider.ClassUnknown)
	_, err = e.P.Cancel(ctx, provider.CancelRequest{ProviderKey: "pdv_drop", ChargeID: auth2.ChargeID})
	WantClass(t, err, provider.ClassUnknown)
	_, err = e.P.Refund(ctx, RefundReq("rd", auth.ChargeID, 700))
	WantClass(t, err, provider.ClassUnknown)

	// The lookups, which never act, say what happened.
	e.faults(t, stripesim.Faults{})
	if got := e.retrieve(t, auth.ChargeID); !got.Captured() || got.AmountReceived != 1200 {
		t.Fatalf("lookup of the lost capture = %+v", got)
	}
	if got := e.retrieve(t, auth2.ChargeID); got.Status != provider.StatusCanceled {
		t.Fatalf("lookup of the lost cancel = %+v", got)
	}
	res := e.lookupRefund(t, auth.ChargeID, "rd", 700)
	if !res.Found || res.Outcome.Status != provider.RefundSucceeded {
		t.Fatalf("lookup of the lost refund = %+v", res)
	}
	// Re-called under their keys, each replays: nothing happens twice.
	if again := e.capture(t, "pdc_drop", auth.ChargeID, 1200); !again.Replayed || again.Refused {
		t.Fatalf("capture re-called = %+v", again)
	}
	if again := e.refund(t, "rd", auth.ChargeID, 700); !again.Replayed || again.RefundID != res.Outcome.RefundID {
		t.Fatalf("refund re-called = %+v", again)
	}
	if refunds := e.Sim.Refunds(); len(refunds) != 1 {
		t.Fatalf("refunds = %+v, want one", refunds)
	}
}

func testLifecycleFaultClasses(t *testing.T, e *lifeEnv) {
	ctx := context.Background()
	auth, _ := e.authorize(t, "k-faults")
	e.faults(t, stripesim.Faults{Rate5xx: 1})
	_, err := e.P.Capture(ctx, provider.CaptureRequest{ProviderKey: "pdc_f", ChargeID: auth.ChargeID})
	WantClass(t, err, provider.ClassUnknown)
	e.faults(t, stripesim.Faults{Rate429: 1})
	_, err = e.P.Refund(ctx, RefundReq("rf", auth.ChargeID, 0))
	if pe := WantClass(t, err, provider.ClassRetryable); !pe.RateLimited() {
		t.Fatalf("429 = %+v, want rate limited", pe)
	}
	e.faults(t, stripesim.Faults{RateFailBeforeCharge: 1})
	_, err = e.P.LookupRefund(ctx, provider.RefundLookupRequest{ChargeID: auth.ChargeID, MerchantID: "m_123", IdempotencyKey: "rf"})
	WantClass(t, err, provider.ClassUnknown)
	e.faults(t, stripesim.Faults{})
	if got := e.retrieve(t, auth.ChargeID); got.Status != provider.StatusRequiresCapture {
		t.Fatalf("after the faults: %+v, want nothing captured", got)
	}
	if _, err := e.P.RetrieveIntent(ctx, provider.RetrieveIntentRequest{ChargeID: "pi_missing"}); !errors.Is(err, provider.ErrNoSuchIntent) {
		t.Fatalf("retrieve of no intent: %v", err)
	}
}

// Recorder is an http.Handler that records the requests it passes to
// Next, for a target's Sent.
type Recorder struct {
	Next http.Handler
	mu   sync.Mutex
	sent []Sent
}

// ServeHTTP records r and serves it with Next.
func (rec *Recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec.Add(Sent{r.Method, r.URL.Path, r.Header.Get("Idempotency-Key")})
	rec.Next.ServeHTTP(w, r)
}

// Add records one request.
func (rec *Recorder) Add(s Sent) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.sent = append(rec.sent, s)
}

// Take returns the requests recorded since the last Take.
func (rec *Recorder) Take() []Sent {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	out := rec.sent
	rec.sent = nil
	return out
}
