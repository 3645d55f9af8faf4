package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paydedup/paydedup/budget"
	budgetstore "github.com/paydedup/paydedup/budget/pgstore"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
	"github.com/paydedup/paydedup/reconciler"
	"github.com/paydedup/paydedup/stream"
)

// opBody is a capture (amount 0: all of it) or a cancel command.
func opBody(kind, merchant, key, pay string, amount int64) []byte {
	b, _ := json.Marshal(payment.Command{MerchantID: merchant, IdempotencyKey: key, Kind: kind, PaymentKey: pay, Amount: amount})
	return b
}

// authorizedPay publishes an authorize and waits for it; it returns the
// payment's intent.
func (e *env) authorizedPay(merchant, key string, amount int64) string {
	e.t.Helper()
	e.publish(merchant, authorizeBody(merchant, key, amount), "", nil)
	return e.authorizedRow(merchant, key, amount).ChargeID
}

// opDone waits for the capture's or cancel's row to be final.
func (e *env) opDone(merchant, key string) ledger.PaymentOp {
	e.t.Helper()
	e.eventually(key+" final", func() bool {
		o, err := e.store.GetPaymentOp(e.ctx, merchant, key)
		return err == nil && o.Final()
	})
	o, _ := e.store.GetPaymentOp(e.ctx, merchant, key)
	return o
}

// simOps is how many captures and cancels reached the simulator.
func (e *env) simOps() (captures, cancels int64) {
	st := e.sim.Stats()
	return st.Requests[stripesim.KindCapture], st.Requests[stripesim.KindCancel]
}

// movingProvider is the provider, counting the captures and cancels the
// workers ask of it (a retrieve is not one).
type movingProvider struct {
	*stripe.Client
	captures, cancels atomic.Int64
}

func (m *movingProvider) Capture(ctx context.Context, req provider.CaptureRequest) (*provider.IntentOutcome, error) {
	m.captures.Add(1)
	return m.Client.Capture(ctx, req)
}

func (m *movingProvider) Cancel(ctx context.Context, req provider.CancelRequest) (*provider.IntentOutcome, error) {
	m.cancels.Add(1)
	return m.Client.Cancel(ctx, req)
}

// TestCaptureThenRefundsOnTheStream: an authorization captured in part on
// the stream, through the fleet's budget as the binary wires it: the
// payment ends succeeded with what was captured, the captured event is
// written; a duplicate is acked without a second capture; a second
// capture and a cancel are dead-lettered with their reasons, never sent;
// refunds then take at most what was captured, end to end.
func TestCaptureThenRefundsOnTheStream(t *testing.T) {
	t.Parallel()
	e := setup(t)
	bs, err := budgetstore.New(e.pool, budgetstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := budget.New(bs, budget.Config{Rate: 1000})
	if err != nil {
		t.Fatal(err)
	}
	e.startWorker("w1", b.Wrap(e.stripe))
	pi := e.authorizedPay("m_1", "auth", 100)

	e.publish("m_1", opBody(payment.KindCapture, "m_1", "c-1", "auth", 60), "", nil)
	if o := e.opDone("m_1", "c-1"); o.Status != ledger.OpSucceeded || o.AmountReceived != 60 || o.ChargeID != pi {
		t.Fatalf("capture %+v", o)
	}
	pay, err := e.store.GetPayment(e.ctx, "m_1", "auth")
	if err != nil || pay.Status != ledger.PaymentSucceeded {
		t.Fatalf("payment %+v %v, want succeeded", pay, err)
	}
	if in := e.intentOf("m_1", "auth"); in.Status != provider.StatusSucceeded || in.AmountReceived != 60 {
		t.Fatalf("provider's intent %+v, want succeeded with 60 received", in)
	}
	e.publish("m_1", opBody(payment.KindCapture, "m_1", "c-1", "auth", 60), "", nil) // a duplicate
	e.publish("m_1", opBody(payment.KindCapture, "m_1", "c-2", "auth", 40), "", nil)
	e.publish("m_1", opBody(payment.KindCancel, "m_1", "v-1", "auth", 0), "", nil)
	if d := e.deadLetterOf("c-2"); d.Reason != ledger.RefuseAlreadyCaptured {
		t.Fatalf("second capture: dead letter %+v", d)
	}
	if d := e.deadLetterOf("v-1"); d.Reason != ledger.RefuseCaptured {
		t.Fatalf("cancel after capture: dead letter %+v", d)
	}
	e.publish("m_1", refundBody("m_1", "r-1", "auth", 40), "", nil)
	if r := e.refundDone("m_1", "r-1"); r.Status != ledger.RefundSucceeded || r.Amount != 40 {
		t.Fatalf("refund %+v", r)
	}
	e.publish("m_1", refundBody("m_1", "r-2", "auth", 0), "", nil) // the rest, once r-1 holds its 40
	if r := e.refundDone("m_1", "r-2"); r.Status != ledger.RefundSucceeded || r.Amount != 20 {
		t.Fatalf("refund of the rest %+v, want 20 (60 captured, 40 refunded)", r)
	}
	e.publish("m_1", refundBody("m_1", "r-3", "auth", 1), "", nil)
	if d := e.deadLetterOf("r-3"); d.Reason != ledger.RefuseOverRefundable {
		t.Fatalf("one cent more: dead letter %+v", d)
	}
	e.quiescent()
	if captures, cancels := e.simOps(); captures != 1 || cancels != 0 {
		t.Fatalf("provider saw %d captures and %d cancels, want one capture", captures, cancels)
	}
	if n := e.count(`SELECT count(*) FROM outcome_events WHERE idempotency_key = 'c-1' AND kind = 'captured' AND amount = 60`); n != 1 {
		t.Fatalf("%d captured events, want 1", n)
	}
}

// TestCancelOnTheStream: an authorization canceled on the stream: the
// payment ends canceled, the intent too, the canceled event is written;
// a capture after it is dead-lettered payment_canceled, never sent.
func TestCancelOnTheStream(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.startWorker("w1", nil)
	e.authorizedPay("m_1", "auth", 100)
	e.publish("m_1", opBody(payment.KindCancel, "m_1", "v-1", "auth", 0), "", nil)
	if o := e.opDone("m_1", "v-1"); o.Status != ledger.OpSucceeded {
		t.Fatalf("cancel %+v", o)
	}
	if pay, err := e.store.GetPayment(e.ctx, "m_1", "auth"); err != nil || pay.Status != ledger.PaymentCanceled {
		t.Fatalf("payment %+v %v, want canceled", pay, err)
	}
	if in := e.intentOf("m_1", "auth"); in.Status != provider.StatusCanceled {
		t.Fatalf("provider's intent %+v, want canceled", in)
	}
	e.publish("m_1", opBody(payment.KindCapture, "m_1", "c-1", "auth", 0), "", nil)
	if d := e.deadLetterOf("c-1"); d.Reason != ledger.RefuseCanceled {
		t.Fatalf("capture after cancel: dead letter %+v", d)
	}
	e.quiescent()
	if captures, cancels := e.simOps(); captures != 0 || cancels != 1 {
		t.Fatalf("provider saw %d captures and %d cancels, want one cancel", captures, cancels)
	}
	if n := e.count(`SELECT count(*) FROM outcome_events WHERE idempotency_key = 'v-1' AND kind = 'canceled'`); n != 1 {
		t.Fatalf("%d canceled events, want 1", n)
	}
}

// TestTwoWorkersRaceCaptures: two workers take two captures of all of an
// authorization, for several: for each, exactly one capture reaches the
// provider and succeeds, the other is dead-lettered already_captured,
// never sent.
func TestTwoWorkersRaceCaptures(t *testing.T) {
	t.Parallel()
	e := setup(t)
	mp := &movingProvider{Client: e.stripe}
	e.startWorker("w1", mp)
	e.startWorker("w2", mp)
	const n = 6
	for i := range n {
		e.authorizedPay("m_1", fmt.Sprintf("auth-%d", i), 100)
	}
	for i := range n {
		e.publish("m_1", opBody(payment.KindCapture, "m_1", fmt.Sprintf("a-%d", i), fmt.Sprintf("auth-%d", i), 0), "", nil)
		e.publish("m_1", opBody(payment.KindCapture, "m_1", fmt.Sprintf("b-%d", i), fmt.Sprintf("auth-%d", i), 0), "", nil)
	}
	e.eventually("every capture decided", func() bool {
		return e.count(`SELECT count(*) FROM payment_ops WHERE status = 'succeeded'`)+len(e.deadLetters()) == 2*n
	})
	e.quiescent()
	if got := e.count(`SELECT count(*) FROM payment_ops WHERE status = 'succeeded'`); got != n {
		t.Fatalf("%d captures succeeded, want %d", got, n)
	}
	if calls := mp.captures.Load(); calls != n {
		t.Fatalf("%d captures reached the provider, want %d: a refused capture is never sent", calls, n)
	}
	for _, m := range e.deadLetters() {
		if p, err := stream.ParseDeadLetter(m.Header); err != nil || p.Reason != ledger.RefuseAlreadyCaptured {
			t.Fatalf("dead letter %+v %v, want already_captured", p, err)
		}
	}
}

// TestCaptureRacesCancel: a capture and a cancel of one authorization,
// taken by two workers, for several: exactly one of them reaches the
// provider and wins; the other is dead-lettered, never sent.
func TestCaptureRacesCancel(t *testing.T) {
	t.Parallel()
	e := setup(t)
	mp := &movingProvider{Client: e.stripe}
	e.startWorker("w1", mp)
	e.startWorker("w2", mp)
	const n = 6
	for i := range n {
		e.authorizedPay("m_1", fmt.Sprintf("auth-%d", i), 100)
	}
	for i := range n {
		e.publish("m_1", opBody(payment.KindCapture, "m_1", fmt.Sprintf("c-%d", i), fmt.Sprintf("auth-%d", i), 0), "", nil)
		e.publish("m_1", opBody(payment.KindCancel, "m_1", fmt.Sprintf("v-%d", i), fmt.Sprintf("auth-%d", i), 0), "", nil)
	}
	e.eventually("every operation decided", func() bool {
		return e.count(`SELECT count(*) FROM payment_ops WHERE status = 'succeeded'`)+len(e.deadLetters()) == 2*n
	})
	e.quiescent()
	for i := range n {
		won := e.count(`SELECT count(*) FROM payment_ops WHERE payment_key = $1 AND status = 'succeeded'`, fmt.Sprintf("auth-%d", i))
		if won != 1 {
			t.Errorf("payment %d: %d operations won, want exactly one", i, won)
		}
	}
	if calls := mp.captures.Load() + mp.cancels.Load(); calls != n {
		t.Fatalf("%d captures and cancels reached the provider, want %d", calls, n)
	}
	for _, m := range e.deadLetters() {
		if p, err := stream.ParseDeadLetter(m.Header); err != nil || (p.Reason != ledger.RefuseCanceled && p.Reason != ledger.RefuseCaptured) {
			t.Fatalf("dead letter %+v %v, want payment_canceled or payment_captured", p, err)
		}
	}
}

// TestCaptureMadeThenWorkerDiedLookedUp: a worker claimed a capture, the
// provider captured, and the worker died before its commit. The
// redelivery's worker, once the lease ran out, retrieves the intent,
// sees it captured and records it: the provider was asked to capture once.
func TestCaptureMadeThenWorkerDiedLookedUp(t *testing.T) {
	t.Parallel()
	e := setup(t)
	stop := e.startWorker("w1", nil)
	pi := e.authorizedPay("m_1", "auth", 100)
	stop()
	cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: "c-1", Kind: payment.KindCapture, PaymentKey: "auth", Amount: 70}
	claim, err := e.store.ClaimPaymentOp(e.ctx, "dead-worker", time.Second, ledger.NewPaymentOpRequest(cmd))
	if err != nil || claim.Outcome != ledger.Claimed {
		t.Fatalf("claim %+v %v", claim, err)
	}
	made, err := e.stripe.Capture(e.ctx, provider.CaptureRequest{ProviderKey: claim.Lease.ProviderKey, ChargeID: pi, Amount: 70})
	if err != nil || made.Status != provider.StatusSucceeded {
		t.Fatalf("capture %+v %v", made, err)
	}
	// Died here. Its message is redelivered to a healthy worker.
	mp := &movingProvider{Client: e.stripe}
	e.startWorker("healthy", mp)
	e.publish("m_1", opBody(payment.KindCapture, "m_1", "c-1", "auth", 70), "", nil)
	o := e.opDone("m_1", "c-1")
	if o.Status != ledger.OpSucceeded || o.AmountReceived != 70 || o.LockedBy != "healthy" || o.Attempts != 2 {
		t.Fatalf("capture %+v, want the dead worker's capture recorded by the healthy one", o)
	}
	e.quiescent()
	if calls := mp.captures.Load(); calls != 0 {
		t.Fatalf("the healthy worker asked for %d captures, want none: it looks up, it never re-calls", calls)
	}
	if captures, _ := e.simOps(); captures != 1 {
		t.Fatalf("provider saw %d captures, want one", captures)
	}
}

// TestCancelMadeThenWorkerDiedLookedUp: a worker claims a cancel, the
// provider voids the authorization, and the worker dies before its commit;
// the redelivery's worker retrieves the intent, records the one cancel and
// never asks for another; the payment ends canceled with one event.
func TestCancelMadeThenWorkerDiedLookedUp(t *testing.T) {
	t.Parallel()
	e := setup(t)
	stop := e.startWorker("w1", nil)
	pi := e.authorizedPay("m_1", "auth", 100)
	stop()
	cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: "v-1", Kind: payment.KindCancel, PaymentKey: "auth"}
	claim, err := e.store.ClaimPaymentOp(e.ctx, "dead-worker", time.Second, ledger.NewPaymentOpRequest(cmd))
	if err != nil || claim.Outcome != ledger.Claimed {
		t.Fatalf("claim %+v %v", claim, err)
	}
	made, err := e.stripe.Cancel(e.ctx, provider.CancelRequest{ProviderKey: claim.Lease.ProviderKey, ChargeID: pi})
	if err != nil || made.Status != provider.StatusCanceled {
		t.Fatalf("cancel %+v %v", made, err)
	}
	// Died here. Its message is redelivered to a healthy worker.
	mp := &movingProvider{Client: e.stripe}
	e.startWorker("healthy", mp)
	e.publish("m_1", opBody(payment.KindCancel, "m_1", "v-1", "auth", 0), "", nil)
	o := e.opDone("m_1", "v-1")
	if o.Status != ledger.OpSucceeded || o.LockedBy != "healthy" || o.Attempts != 2 {
		t.Fatalf("cancel %+v, want the dead worker's cancel recorded by the healthy one", o)
	}
	e.quiescent()
	if calls := mp.cancels.Load(); calls != 0 {
		t.Fatalf("the healthy worker asked for %d cancels, want none: it looks up, it never re-calls", calls)
	}
	if _, cancels := e.simOps(); cancels != 1 {
		t.Fatalf("provider saw %d cancels, want one", cancels)
	}
	if pay, err := e.store.GetPayment(e.ctx, "m_1", "auth"); err != nil || pay.Status != ledger.PaymentCanceled {
		t.Fatalf("payment %+v %v, want canceled", pay, err)
	}
	if n := e.count(`SELECT count(*) FROM outcome_events WHERE idempotency_key = 'v-1' AND kind = 'canceled'`); n != 1 {
		t.Fatalf("%d canceled events, want 1", n)
	}
}

// TestCaptureAnswerLostAfterProviderActed: the provider captures and the
// connection drops before its answer: the capture's row is unknown, and
// still holds the payment (a cancel is refused); the redelivery retrieves
// the intent before any re-call and records the one capture.
func TestCaptureAnswerLostAfterProviderActed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	mp := &movingProvider{Client: e.stripe}
	e.startWorker("w1", mp)
	e.authorizedPay("m_1", "auth", 100)
	if err := e.sim.SetFaults(stripesim.Faults{RateDropAfterCharge: 1}); err != nil {
		t.Fatal(err)
	}
	e.publish("m_1", opBody(payment.KindCapture, "m_1", "c-1", "auth", 0), "", nil)
	e.eventually("captured at the provider, answer lost", func() bool {
		o, err := e.store.GetPaymentOp(e.ctx, "m_1", "c-1")
		captures, _ := e.simOps()
		return err == nil && o.Status == ledger.OpUnknown && captures >= 1
	})
	e.publish("m_1", opBody(payment.KindCancel, "m_1", "v-1", "auth", 0), "", nil)
	if d := e.deadLetterOf("v-1"); d.Reason != ledger.RefuseCaptured {
		t.Fatalf("a capture of unknown outcome must hold the payment: dead letter %+v", d)
	}
	if err := e.sim.SetFaults(stripesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	o := e.opDone("m_1", "c-1")
	e.quiescent()
	if o.Status != ledger.OpSucceeded || o.AmountReceived != 100 {
		t.Fatalf("capture %+v, want the one capture recorded", o)
	}
	if calls := mp.captures.Load(); calls != 1 {
		t.Fatalf("the worker asked for %d captures, want one: the redelivery looks up, it never re-calls", calls)
	}
	if pay, err := e.store.GetPayment(e.ctx, "m_1", "auth"); err != nil || pay.Status != ledger.PaymentSucceeded {
		t.Fatalf("payment %+v %v", pay, err)
	}
}

// TestReconcilerResolvesAbandonedCapture: a capture whose worker died
// with its message gone, made at the provider, and a cancel not made: the
// reconciler, once their leases ran out, retrieves both intents, records
// the capture, and leaves the cancel unknown (its intent still
// requires_capture), holding its payment, without calling.
func TestReconcilerResolvesAbandonedCapture(t *testing.T) {
	t.Parallel()
	e := setup(t)
	stop := e.startWorker("w1", nil)
	pi := e.authorizedPay("m_1", "auth", 100)
	e.authorizedPay("m_1", "auth2", 100)
	stop()
	claim := func(kind, key, pay string) ledger.PaymentOpClaim {
		cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: key, Kind: kind, PaymentKey: pay}
		c, err := e.store.ClaimPaymentOp(e.ctx, "dead-worker", time.Second, ledger.NewPaymentOpRequest(cmd))
		if err != nil || c.Outcome != ledger.Claimed {
			t.Fatalf("claim %s: %+v %v", key, c, err)
		}
		return c
	}
	made := claim(payment.KindCapture, "c-1", "auth")
	claim(payment.KindCancel, "v-1", "auth2")
	if _, err := e.stripe.Capture(e.ctx, provider.CaptureRequest{ProviderKey: made.Lease.ProviderKey, ChargeID: pi}); err != nil {
		t.Fatal(err)
	}
	mp := &movingProvider{Client: e.stripe}
	rec, err := reconciler.New(e.store, mp, reconciler.Config{Grace: time.Millisecond, SearchLag: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	resolved, left := 0, 0
	e.eventually("both leases ran out and were looked up", func() bool {
		r, err := rec.RunOnce(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		resolved, left = resolved+r.PaymentOpsResolved, left+r.PaymentOpsLeft
		return resolved == 1 && left >= 1
	})
	if o := e.opDone("m_1", "c-1"); o.Status != ledger.OpSucceeded || o.AmountReceived != 100 {
		t.Fatalf("c-1 %+v, want the capture made", o)
	}
	if o, _ := e.store.GetPaymentOp(e.ctx, "m_1", "v-1"); o.Status != ledger.OpUnknown {
		t.Fatalf("v-1 %s, want unknown", o.Status)
	}
	if mp.captures.Load()+mp.cancels.Load() != 0 {
		t.Fatal("the reconciler asked the provider to capture or cancel; it only looks up")
	}
	e.startWorker("w2", nil)
	e.publish("m_1", opBody(payment.KindCancel, "m_1", "v-1", "auth2", 0), "", nil)
	if o := e.opDone("m_1", "v-1"); o.Status != ledger.OpSucceeded {
		t.Fatalf("v-1 %+v", o)
	}
}

// TestCaptureOutcomesOnTheStream: a capture's and a cancel's outcomes
// reach the outcomes stream: captured and canceled events under their own
// keys, and a refused event with its reason for ones the ledger's rules
// refuse (never sent).
func TestCaptureOutcomesOnTheStream(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.withOutcomes()
	e.startWorker("w1", nil)
	e.authorizedPay("m_1", "a1", 100)
	e.authorizedPay("m_1", "a2", 100)
	e.publish("m_1", opBody(payment.KindCapture, "m_1", "c-over", "a1", 101), "", nil)
	e.publish("m_1", opBody(payment.KindCancel, "m_1", "v-none", "nope", 0), "", nil)
	e.eventually("two dead letters", func() bool { return len(e.deadLetters()) == 2 })
	e.publish("m_1", opBody(payment.KindCapture, "m_1", "c-1", "a1", 0), "", nil)
	e.publish("m_1", opBody(payment.KindCancel, "m_1", "v-1", "a2", 0), "", nil)
	e.opDone("m_1", "c-1")
	e.opDone("m_1", "v-1")
	e.quiescent()
	evs, _ := e.relayedOutcomes()
	for key, reason := range map[string]string{"c-over": ledger.RefuseOverCapturable, "v-none": ledger.RefuseNoPayment} {
		if got := refused(evs, key); len(got) != 1 || got[0].Reason != reason {
			t.Fatalf("%s: refused events %+v, want one with reason %s", key, got, reason)
		}
	}
	want := map[string]string{"m_1:c-1:captured": ledger.OutcomeCaptured, "m_1:v-1:canceled": ledger.OutcomeCanceled}
	for _, ev := range evs {
		if k, ok := want[ev.EventID]; ok && ev.Kind == k && ev.Amount == 100 {
			delete(want, ev.EventID)
		}
	}
	if len(want) != 0 {
		t.Fatalf("events not relayed: %v (relayed %+v)", want, evs)
	}
}

// rejectingProvider rejects the first capture, as the provider does a
// request it refuses definitively, before anything is written.
type rejectingProvider struct {
	*stripe.Client
	rejected atomic.Bool
}

func (m *rejectingProvider) Capture(ctx context.Context, req provider.CaptureRequest) (*provider.IntentOutcome, error) {
	if m.rejected.CompareAndSwap(false, true) {
		return nil, &provider.Error{Class: provider.ClassRejected, HTTPStatus: 400, Type: "invalid_request_error",
			Code: "parameter_invalid_integer", Message: "Invalid integer"}
	}
	return m.Client.Capture(ctx, req)
}

// TestRejectedCaptureFreesThePayment: a capture the provider rejects
// definitively (nothing written) is recorded refused with the provider's
// reason and dead-lettered: it no longer holds the payment, so a new
// capture of it is claimed and succeeds.
func TestRejectedCaptureFreesThePayment(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.startWorker("w1", &rejectingProvider{Client: e.stripe})
	e.authorizedPay("m_1", "auth", 100)
	e.publish("m_1", opBody(payment.KindCapture, "m_1", "c-1", "auth", 0), "", nil)
	if d := e.deadLetterOf("c-1"); d.Reason != stream.ReasonProviderRejected {
		t.Fatalf("rejected capture: dead letter %+v", d)
	}
	// Recorded before its dead letter is published.
	if o, err := e.store.GetPaymentOp(e.ctx, "m_1", "c-1"); err != nil || o.Status != ledger.OpRefused || o.Reason != "parameter_invalid_integer" {
		t.Fatalf("rejected capture %+v %v, want refused parameter_invalid_integer", o, err)
	}
	e.publish("m_1", opBody(payment.KindCapture, "m_1", "c-2", "auth", 0), "", nil)
	if o := e.opDone("m_1", "c-2"); o.Status != ledger.OpSucceeded {
		t.Fatalf("capture after a rejected one %+v, want succeeded", o)
	}
	if pay, err := e.store.GetPayment(e.ctx, "m_1", "auth"); err != nil || pay.Status != ledger.PaymentSucceeded {
		t.Fatalf("payment %+v %v, want succeeded", pay, err)
	}
}
