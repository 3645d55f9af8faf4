package dedup_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// TestCaptureOfCanceledIntentCancelsPayment: a capture recorded refused
// intent_canceled (its lookup found the intent canceled by the provider,
// the worker's or the reconciler's completion alike) moves the payment
// from authorized to canceled in the same transaction, with one canceled
// event under the payment's key; the provider's cancel told again
// (the webhook) changes nothing. A capture refused for another reason
// leaves the payment authorized.
func TestCaptureOfCanceledIntentCancelsPayment(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.authorizedPayment(t, "m_1", "auth", 100)
	c := b.claimOp(t, "w", opReq(payment.KindCapture, "m_1", "c-1", "auth", 0))
	if c.Outcome != ledger.Claimed {
		t.Fatalf("capture: %+v", c)
	}
	gone := ledger.PaymentOpCompletion{Status: ledger.OpRefused, Reason: ledger.OpIntentCanceled, ResponseStatus: 200,
		Response: json.RawMessage(`{"id":"pi_auth","status":"canceled"}`)}
	if err := b.store.CompletePaymentOp(b.ctx, *c.Lease, gone); err != nil {
		t.Fatal(err)
	}
	if pay, err := b.store.GetPayment(b.ctx, "m_1", "auth"); err != nil || pay.Status != ledger.PaymentCanceled || pay.SettledAt.IsZero() {
		t.Fatalf("payment after its intent was found canceled: %+v %v, want canceled", pay, err)
	}
	events := `SELECT count(*) FROM outcome_events WHERE event_id = 'm_1:auth:canceled' AND seq = 2 AND kind = 'canceled' AND status = 'canceled'`
	if n := b.count(t, events); n != 1 {
		t.Fatalf("%d canceled events of the payment, want 1", n)
	}
	if ok, status, err := b.store.CancelAuthorizedPayment(b.ctx, "m_1", "auth", "pi_auth", "canceled by the provider"); ok || err != nil || status != ledger.PaymentCanceled {
		t.Fatalf("cancel told again: %v %q %v, want nothing changed", ok, status, err)
	}
	if n := b.count(t, events); n != 1 {
		t.Fatalf("%d canceled events after the cancel told again, want 1", n)
	}

	b.authorizedPayment(t, "m_1", "auth2", 100)
	c = b.claimOp(t, "w", opReq(payment.KindCapture, "m_1", "c-2", "auth2", 0))
	no := ledger.PaymentOpCompletion{Status: ledger.OpRefused, Reason: "charge_expired_for_capture", ResponseStatus: 400,
		Response: json.RawMessage(`{"error":{"code":"charge_expired_for_capture"}}`)}
	if err := b.store.CompletePaymentOp(b.ctx, *c.Lease, no); err != nil {
		t.Fatal(err)
	}
	if pay, err := b.store.GetPayment(b.ctx, "m_1", "auth2"); err != nil || pay.Status != ledger.PaymentAuthorized {
		t.Fatalf("payment after a refused capture: %+v %v, want authorized", pay, err)
	}
}

// TestRolesRecheckAndCancel: the gateway's role stamps a refund, or an
// authorization an event said the provider canceled, for a recheck,
// through their functions only, and never cancels the authorization
// itself (00034); the worker's role (the reconciler, after its lookup)
// reverses a stamped refund, a stale succeeded answer never moving it
// back, and records the stamped authorization canceled.
func TestRolesRecheckAndCancel(t *testing.T) {
	t.Parallel()
	ownerURL := testenv.PostgresURL(t)
	worker, err := dedup.New(asWorker(t, ownerURL), dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	gwPool := testenv.AsRole(t, ownerURL, "paydedup_gateway")
	gateway, err := dedup.New(gwPool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{store: worker, ctx: t.Context()}
	b.chargedPayment(t, "m_1", "pay", 100)
	b.processingRefund(t, "r-1", "pay", 60, "re_1")
	if ok, _, err := worker.SettleRefund(b.ctx, "m_1", "r-1", refunded("re_1")); !ok || err != nil {
		t.Fatalf("settle: %v %v", ok, err)
	}
	if ok, status, err := gateway.RequestRefundRecheck(b.ctx, "m_1", "r-1", "re_1"); !ok || status != ledger.RefundSucceeded || err != nil {
		t.Fatalf("stamp as the gateway: %v %q %v", ok, status, err)
	}
	if _, _, err := gateway.RecheckRefund(b.ctx, "m_1", "r-1", refundFailed("re_1")); err == nil {
		t.Fatal("the gateway reversed a refund itself")
	}
	if rs, err := worker.RefundsToRecheck(b.ctx, 10); err != nil || len(rs) != 1 {
		t.Fatalf("refunds to recheck as the worker: %+v %v", rs, err)
	}
	if ok, status, err := worker.RecheckRefund(b.ctx, "m_1", "r-1", refundFailed("re_1")); !ok || status != ledger.RefundFailed || err != nil {
		t.Fatalf("reverse as the worker: %v %q %v", ok, status, err)
	}
	if ok, status, err := worker.RecheckRefund(b.ctx, "m_1", "r-1", refunded("re_1")); ok || status != ledger.RefundFailed || err != nil {
		t.Fatalf("a stale succeeded answer: %v %q %v, want the refund left failed", ok, status, err)
	}

	b.authorizedPayment(t, "m_1", "auth", 100)
	if _, _, err := gateway.CancelAuthorizedPayment(b.ctx, "m_1", "auth", "pi_auth", "canceled at the provider"); err == nil {
		t.Fatal("the gateway canceled an authorization on an event's word")
	}
	if ok, status, err := gateway.RequestCancelRecheck(b.ctx, "m_1", "auth", "pi_auth"); !ok || status != ledger.PaymentAuthorized || err != nil {
		t.Fatalf("stamp a cancel as the gateway: %v %q %v", ok, status, err)
	}
	if _, _, err := gateway.RecheckCancel(b.ctx, "m_1", "auth", "pi_auth", time.Now(), "canceled", "canceled at the provider"); err == nil {
		t.Fatal("the gateway recorded a cancel's recheck itself")
	}
	if _, err := gateway.PostponeCancelRecheck(b.ctx, "m_1", "auth", time.Now(), time.Second); err == nil {
		t.Fatal("the gateway pushed a cancel's recheck back itself")
	}
	if _, _, err := worker.CancelAuthorizedPayment(b.ctx, "m_1", "auth", "pi_auth", "canceled at the provider"); err == nil {
		t.Fatal("the worker canceled an authorization without its lookup")
	}
	ps, err := worker.CancelsToRecheck(b.ctx, 10)
	if err != nil || len(ps) != 1 || ps[0].ChargeID != "pi_auth" {
		t.Fatalf("cancels to recheck as the worker: %+v %v", ps, err)
	}
	if n, err := worker.PostponeCancelRecheck(b.ctx, "m_1", "auth", ps[0].RequestedAt, 0); n != 1 || err != nil {
		t.Fatalf("push a cancel's recheck back as the worker: %d %v", n, err)
	}
	if ok, status, err := worker.RecheckCancel(b.ctx, "m_1", "auth", "pi_auth", ps[0].RequestedAt, "canceled", "canceled at the provider"); !ok || status != ledger.PaymentCanceled || err != nil {
		t.Fatalf("cancel as the worker after its lookup: %v %q %v", ok, status, err)
	}
	if _, err := gwPool.Exec(b.ctx, `INSERT INTO payment_cancel_rechecks VALUES ('m_1', 'x', 'pi_x', now())`); err == nil {
		t.Fatal("the gateway wrote a cancel recheck itself")
	}
	if _, err := gwPool.Exec(b.ctx, `UPDATE refunds SET recheck_requested_at = now()`); err == nil {
		t.Fatal("the gateway updated refunds itself")
	}
}

// TestCancelConfirmedDuringCaptureIsKept: a cancel the provider confirmed
// (the reconciler's retrieve) while a capture of the payment is pending
// moves nothing, and its stamp is kept: the capture then refused
// payment_intent_unexpected_state (not intent_canceled: no trigger
// cancels the payment) leaves the payment authorized, and the next
// recheck moves it to canceled with one canceled event. A capture refused
// payment_intent_unexpected_state stamps an authorized payment that had
// no stamp.
func TestCancelConfirmedDuringCaptureIsKept(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.authorizedPayment(t, "m_1", "auth", 100)
	if ok, _, err := b.store.RequestCancelRecheck(b.ctx, "m_1", "auth", "pi_auth"); !ok || err != nil {
		t.Fatalf("stamp: %v %v", ok, err)
	}
	c := b.claimOp(t, "w", opReq(payment.KindCapture, "m_1", "c-1", "auth", 0))
	if c.Outcome != ledger.Claimed {
		t.Fatalf("capture: %+v", c)
	}
	ps, err := b.store.CancelsToRecheck(b.ctx, 10)
	if err != nil || len(ps) != 1 {
		t.Fatalf("cancels to recheck: %+v %v", ps, err)
	}
	if ok, status, err := b.store.RecheckCancel(b.ctx, "m_1", "auth", "pi_auth", ps[0].RequestedAt, "canceled", "canceled at the provider"); ok || status != ledger.PaymentAuthorized || err != nil {
		t.Fatalf("recheck with the capture pending: %v %q %v, want nothing moved", ok, status, err)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_cancel_rechecks`); n != 1 {
		t.Fatalf("%d stamps after a confirmed cancel that moved nothing, want 1 (kept)", n)
	}
	unexpected := ledger.PaymentOpCompletion{Status: ledger.OpRefused, Reason: "payment_intent_unexpected_state", ResponseStatus: 400,
		Response: json.RawMessage(`{"error":{"code":"payment_intent_unexpected_state"}}`)}
	if err := b.store.CompletePaymentOp(b.ctx, *c.Lease, unexpected); err != nil {
		t.Fatal(err)
	}
	if pay, err := b.store.GetPayment(b.ctx, "m_1", "auth"); err != nil || pay.Status != ledger.PaymentAuthorized {
		t.Fatalf("payment after its capture was refused: %+v %v, want authorized", pay, err)
	}
	if ps, err = b.store.CancelsToRecheck(b.ctx, 10); err != nil || len(ps) != 1 {
		t.Fatalf("cancels to recheck after the capture settled: %+v %v", ps, err)
	}
	if ok, status, err := b.store.RecheckCancel(b.ctx, "m_1", "auth", "pi_auth", ps[0].RequestedAt, "canceled", "canceled at the provider"); !ok || status != ledger.PaymentCanceled || err != nil {
		t.Fatalf("next recheck: %v %q %v, want canceled", ok, status, err)
	}
	if n := b.count(t, `SELECT count(*) FROM outcome_events WHERE event_id = 'm_1:auth:canceled' AND kind = 'canceled'`); n != 1 {
		t.Fatalf("%d canceled events, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_cancel_rechecks`); n != 0 {
		t.Fatalf("%d stamps after the cancel, want 0", n)
	}

	b.authorizedPayment(t, "m_1", "auth2", 100)
	c = b.claimOp(t, "w", opReq(payment.KindCancel, "m_1", "v-2", "auth2", 0))
	if err := b.store.CompletePaymentOp(b.ctx, *c.Lease, unexpected); err != nil {
		t.Fatal(err)
	}
	if ps, err = b.store.CancelsToRecheck(b.ctx, 10); err != nil || len(ps) != 1 || ps[0].IdempotencyKey != "auth2" {
		t.Fatalf("cancels to recheck after a cancel refused payment_intent_unexpected_state: %+v %v, want auth2 stamped", ps, err)
	}
}

// TestStaleCancelRecheckKeepsNewerStamp: a stamp asked again while its
// retrieve is under way takes the later time, and the recheck of the
// older listing (its retrieve may predate the new event) leaves it; the
// recheck of the newer listing clears it.
func TestStaleCancelRecheckKeepsNewerStamp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.authorizedPayment(t, "m_1", "auth", 100)
	if ok, _, err := b.store.RequestCancelRecheck(b.ctx, "m_1", "auth", "pi_auth"); !ok || err != nil {
		t.Fatalf("stamp: %v %v", ok, err)
	}
	old, err := b.store.CancelsToRecheck(b.ctx, 10)
	if err != nil || len(old) != 1 {
		t.Fatalf("cancels to recheck: %+v %v", old, err)
	}
	b.clock.Advance(time.Second)
	if ok, _, err := b.store.RequestCancelRecheck(b.ctx, "m_1", "auth", "pi_auth"); !ok || err != nil {
		t.Fatalf("stamp again: %v %v", ok, err)
	}
	if _, _, err := b.store.RecheckCancel(b.ctx, "m_1", "auth", "pi_auth", old[0].RequestedAt, "requires_capture", ""); err != nil {
		t.Fatal(err)
	}
	now, err := b.store.CancelsToRecheck(b.ctx, 10)
	if err != nil || len(now) != 1 || !now[0].RequestedAt.After(old[0].RequestedAt) {
		t.Fatalf("cancels to recheck after a stale recheck: %+v %v, want the newer stamp kept", now, err)
	}
	if _, _, err := b.store.RecheckCancel(b.ctx, "m_1", "auth", "pi_auth", now[0].RequestedAt, "requires_capture", ""); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_cancel_rechecks`); n != 0 {
		t.Fatalf("%d stamps after the newer recheck, want 0", n)
	}
}

// TestPostponedCancelRecheckLetsNewerThrough: a stamp pushed back (its
// retrieve failed) is listed after newer ones until it is due again,
// counting its attempts; asked again by a new event, it is due at once.
func TestPostponedCancelRecheckLetsNewerThrough(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.authorizedPayment(t, "m_1", "stuck", 100)
	b.authorizedPayment(t, "m_1", "next", 100)
	for _, k := range []string{"stuck", "next"} {
		if ok, _, err := b.store.RequestCancelRecheck(b.ctx, "m_1", k, "pi_"+k); !ok || err != nil {
			t.Fatalf("stamp %s: %v %v", k, ok, err)
		}
		b.clock.Advance(time.Second)
	}
	ps, err := b.store.CancelsToRecheck(b.ctx, 1)
	if err != nil || len(ps) != 1 || ps[0].IdempotencyKey != "stuck" || ps[0].Attempts != 0 {
		t.Fatalf("first listing: %+v %v, want stuck", ps, err)
	}
	for i := 1; i <= 2; i++ {
		if n, err := b.store.PostponeCancelRecheck(b.ctx, "m_1", "stuck", ps[0].RequestedAt, time.Hour); n != i || err != nil {
			t.Fatalf("push back %d: %d %v", i, n, err)
		}
	}
	if ps, err = b.store.CancelsToRecheck(b.ctx, 1); err != nil || len(ps) != 1 || ps[0].IdempotencyKey != "next" {
		t.Fatalf("listing after the push back: %+v %v, want next", ps, err)
	}
	if ps, err = b.store.CancelsToRecheck(b.ctx, 10); err != nil || len(ps) != 1 {
		t.Fatalf("due stamps: %+v %v, want next only", ps, err)
	}
	if ok, _, err := b.store.RequestCancelRecheck(b.ctx, "m_1", "stuck", "pi_stuck"); !ok || err != nil {
		t.Fatalf("stamp stuck again: %v %v", ok, err)
	}
	if ps, err = b.store.CancelsToRecheck(b.ctx, 10); err != nil || len(ps) != 2 || ps[1].IdempotencyKey != "stuck" || ps[1].Attempts != 2 {
		t.Fatalf("due stamps after a new event: %+v %v, want stuck (2 attempts) due again, after next", ps, err)
	}
}

// TestCancelHintsDownRefusesStamps: 00034's down is refused while a
// payment waits for a recheck of its cancel (its event was answered 2xx:
// the provider will not send it again), and proceeds once the stamps are
// gone.
func TestCancelHintsDownRefusesStamps(t *testing.T) {
	t.Parallel()
	owner, m := migrator(t, testenv.PostgresURL(t))
	// The test is of 00034's down: a later migration is rolled back first
	// (its schema is new and empty), never skipped.
	downTo(t, m, 34)
	if v := appliedVersion(t, m); v != 34 {
		t.Fatalf("at %05d, want 00034", v)
	}
	store, err := dedup.New(owner, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{store: store, ctx: t.Context()}
	b.authorizedPayment(t, "m_1", "auth", 100)
	if ok, _, err := store.RequestCancelRecheck(b.ctx, "m_1", "auth", "pi_auth"); !ok || err != nil {
		t.Fatalf("stamp: %v %v", ok, err)
	}
	refuses(t, m, "00034", "recheck of their cancel")
	if _, err := owner.Exec(b.ctx, `DELETE FROM payment_cancel_rechecks`); err != nil {
		t.Fatal(err)
	}
	downTo(t, m, 33)
}
