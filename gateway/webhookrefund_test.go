package gateway_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/lab/storetest"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// refundObject is a refund as Stripe renders it in an event (the fields
// the adapter reads).
func refundObject(id, intentID, status string, amount int64, key string) map[string]any {
	re := map[string]any{"id": id, "object": "refund", "status": status, "amount": amount, "currency": "usd",
		"payment_intent": intentID, "metadata": map[string]string{"merchant_id": "m_a", "idempotency_key": key},
		"created": time.Now().Unix()}
	if status == "failed" {
		re["failure_reason"] = "expired_or_canceled_card"
	}
	return re
}

// event is a Stripe event of type typ about object.
func event(id, typ string, object any) []byte {
	b, _ := json.Marshal(map[string]any{"id": id, "object": "event", "api_version": "2025-08-27.basil",
		"created": time.Now().Unix(), "type": typ, "data": map[string]any{"object": object}})
	return b
}

// processingRefund records, as the worker does, a refund of amount of the
// payment under pay that the provider answered pending under id.
func (w *world) processingRefund(key, pay string, amount int64, id string) {
	w.t.Helper()
	c, err := w.store.ClaimRefund(w.ctx, "w", time.Minute, ledger.NewRefundRequest(&payment.Command{MerchantID: "m_a",
		IdempotencyKey: key, PaymentKey: pay, Amount: amount, Kind: payment.KindRefund}))
	if err != nil || c.Outcome != ledger.Claimed {
		w.t.Fatalf("claim refund %s: %+v %v", key, c, err)
	}
	if err := w.store.CompleteRefund(w.ctx, *c.Lease, ledger.RefundCompletion{Status: ledger.RefundProcessing, RefundID: id,
		ResponseStatus: 200, Response: json.RawMessage(`{"id":"` + id + `","status":"pending"}`)}); err != nil {
		w.t.Fatal(err)
	}
}

// Refunds the provider held pending settle through refund.updated,
// charge.refund.updated and charge.refunded: a failed one frees its
// amount; each writes one event however often its event is delivered, or
// when the reconciler settled it first; a contradicting event changes
// nothing.
func TestWebhookSettlesPendingRefunds(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, options{webhookSecret: webhookSecret})
	c, err := w.store.Claim(w.ctx, "w", time.Minute, storetest.Req("m_a", "pay", 1000))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.store.Complete(w.ctx, *c.Lease, storetest.Charged("pi_pay")); err != nil {
		t.Fatal(err)
	}
	w.processingRefund("r-1", "pay", 600, "re_1")
	w.processingRefund("r-2", "pay", 400, "re_2")
	refund := func(key string) ledger.Refund {
		t.Helper()
		r, err := w.store.GetRefund(w.ctx, "m_a", key)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	events := func(key string) int {
		return w.count(`SELECT count(*) FROM outcome_events WHERE merchant_id = 'm_a' AND idempotency_key = $1`, key)
	}
	post := func(body []byte, want string) {
		t.Helper()
		if code, res := w.webhook(body, signHMAC(body, webhookSecret, time.Now())); code != http.StatusOK || res != want {
			t.Fatalf("%s: %d %q, want 200 %q", body, code, res, want)
		}
	}

	failed := event("evt_1", "refund.updated", refundObject("re_1", "pi_pay", "failed", 600, "r-1"))
	post(failed, gateway.WebhookSettled)
	if r := refund("r-1"); r.Status != ledger.RefundFailed || r.Reason != "expired_or_canceled_card" {
		t.Fatalf("refund after its failure: %+v", r)
	}
	post(failed, gateway.WebhookAgrees) // delivered again
	if n := events("r-1"); n != 1 {
		t.Fatalf("%d events of the failed refund, want 1", n)
	}
	// Its amount is free again.
	if got, err := w.store.ClaimRefund(w.ctx, "w", time.Minute, ledger.NewRefundRequest(&payment.Command{MerchantID: "m_a",
		IdempotencyKey: "r-4", PaymentKey: "pay", Amount: 600, Kind: payment.KindRefund})); err != nil || got.Outcome != ledger.Claimed {
		t.Fatalf("a refund of the failed refund's amount: %+v %v, want claimed", got, err)
	}

	// The reconciler settles r-2 first; the event then agrees.
	if ok, _, err := w.store.SettleRefund(w.ctx, "m_a", "r-2", ledger.RefundCompletion{Status: ledger.RefundSucceeded, RefundID: "re_2",
		ResponseStatus: 200, Response: json.RawMessage(`{"id":"re_2","status":"succeeded"}`)}); !ok || err != nil {
		t.Fatalf("settle by lookup: %v %v", ok, err)
	}
	post(event("evt_2", "charge.refund.updated", refundObject("re_2", "pi_pay", "succeeded", 400, "r-2")), gateway.WebhookAgrees)
	if n := events("r-2"); n != 1 {
		t.Fatalf("%d events of the succeeded refund, want 1", n)
	}
	// A contradicting event changes nothing.
	post(event("evt_3", "refund.updated", refundObject("re_2", "pi_pay", "failed", 400, "r-2")), gateway.WebhookDisagrees)
	if r := refund("r-2"); r.Status != ledger.RefundSucceeded {
		t.Fatalf("a contradicting event changed the refund: %+v", r)
	}
	// A pending refund stays so; one not ours, or not in the ledger, is
	// acknowledged and ignored.
	post(event("evt_4", "refund.updated", refundObject("re_9", "pi_pay", "pending", 1, "r-9")), gateway.WebhookStillProcessing)
	post(event("evt_5", "refund.updated", refundObject("re_9", "pi_pay", "succeeded", 1, "r-9")), gateway.WebhookNoPayment)
	post(event("evt_6", "refund.updated", map[string]any{"id": "re_x", "object": "refund", "status": "succeeded", "amount": 1}),
		gateway.WebhookNotOurs)
	// charge.refunded lists the charge's refunds: each already settled.
	post(event("evt_7", "charge.refunded", map[string]any{"id": "ch_pay", "object": "charge", "payment_intent": "pi_pay",
		"amount": 1000, "refunds": map[string]any{"object": "list", "data": []any{
			refundObject("re_1", "pi_pay", "failed", 600, "r-1"), refundObject("re_2", "pi_pay", "succeeded", 400, "r-2")}}}),
		gateway.WebhookAgrees)
	if n := events("r-1") + events("r-2"); n != 2 {
		t.Fatalf("%d refund events after every delivery, want 2", n)
	}
}
