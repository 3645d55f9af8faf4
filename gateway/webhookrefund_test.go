package gateway_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/lab/storetest"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	stripeadapter "github.com/paydedup/paydedup/provider/stripe"
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

// Refunds the provider held pending settle succeeded through
// refund.updated, charge.refund.updated and charge.refunded; a failed
// report is only a hint, the reconciler's lookup fails the refund and
// frees its amount; each writes one event however often its event is
// delivered, or when the reconciler settled it first; a contradicting
// event changes nothing.
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
	post(failed, gateway.WebhookRecheckRequested)
	if r := refund("r-1"); r.Status != ledger.RefundProcessing {
		t.Fatalf("refund after a failed report: %+v, want processing", r)
	}
	// The reconciler's lookup confirms it.
	if ok, _, err := w.store.SettleRefund(w.ctx, "m_a", "r-1", ledger.RefundCompletion{Status: ledger.RefundFailed, RefundID: "re_1",
		Reason: "expired_or_canceled_card", ResponseStatus: 200, Response: json.RawMessage(`{"id":"re_1","status":"failed"}`)}); !ok || err != nil {
		t.Fatalf("settle by lookup: %v %v", ok, err)
	}
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
	// A contradicting event changes nothing: it asks the reconciler to
	// look the refund up again.
	post(event("evt_3", "refund.updated", refundObject("re_2", "pi_pay", "failed", 400, "r-2")), gateway.WebhookRecheckRequested)
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

// A refund the provider answers pending and fails later is reported by
// the refund.updated the simulator posts: a hint only, the refund stays
// processing until a lookup (the reconciler's) confirms; then its amount
// is free again, one refund_failed event is written, and the event
// delivered again agrees.
func TestWebhookSettlesRefundFailedAtTheProvider(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, options{webhookSecret: webhookSecret, processingDelay: 300 * time.Millisecond})
	st, ok := w.gate.next.(*stripeadapter.Client)
	if !ok {
		t.Fatalf("the world's provider is a %T", w.gate.next)
	}
	c, err := w.store.Claim(w.ctx, "w", time.Minute, storetest.Req("m_a", "pay", 1000))
	if err != nil {
		t.Fatal(err)
	}
	cmd := storetest.Command("m_a", "pay", 1000)
	out, err := st.Charge(w.ctx, provider.ChargeRequest{ProviderKey: c.Lease.ProviderKey, MerchantID: "m_a", IdempotencyKey: "pay",
		Amount: 1000, Currency: cmd.Currency, PaymentMethod: cmd.PaymentMethod})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.store.Complete(w.ctx, *c.Lease, ledger.CompletionOf(out, ledger.ProviderBodyOnly)); err != nil {
		t.Fatal(err)
	}
	if err := w.sim.SetFaults(stripesim.Faults{RateRefundFail: 1}); err != nil {
		t.Fatal(err)
	}
	rc, err := w.store.ClaimRefund(w.ctx, "w", time.Minute, ledger.NewRefundRequest(&payment.Command{MerchantID: "m_a",
		IdempotencyKey: "r-1", PaymentKey: "pay", Amount: 1000, Kind: payment.KindRefund}))
	if err != nil || rc.Outcome != ledger.Claimed {
		t.Fatalf("claim refund: %+v %v", rc, err)
	}
	re, err := st.Refund(w.ctx, provider.RefundRequest{ProviderKey: rc.Lease.ProviderKey, ChargeID: out.ChargeID, Amount: 1000,
		MerchantID: "m_a", IdempotencyKey: "r-1"})
	if err != nil || re.Status != provider.RefundPending {
		t.Fatalf("refund: %+v %v, want pending", re, err)
	}
	if err := w.store.CompleteRefund(w.ctx, *rc.Lease, ledger.RefundCompletionOf(re)); err != nil {
		t.Fatal(err)
	}
	w.eventually("the provider reports the refund failed", func() bool { return len(w.hooks.deliveries()) > 0 })
	got := w.hooks.deliveries()
	if len(got) != 1 || got[0].status != http.StatusOK || !strings.Contains(string(got[0].body), `"refund.updated"`) {
		t.Fatalf("deliveries %+v, want one refund.updated answered 200", got)
	}
	if r, err := w.store.GetRefund(w.ctx, "m_a", "r-1"); err != nil || r.Status != ledger.RefundProcessing {
		t.Fatalf("refund after the provider's report: %+v %v, want processing", r, err)
	}
	found, err := st.LookupRefund(w.ctx, provider.RefundLookupRequest{ChargeID: out.ChargeID, MerchantID: "m_a",
		IdempotencyKey: "r-1", Amount: 1000})
	if err != nil || !found.Found {
		t.Fatalf("lookup: %+v %v", found, err)
	}
	if ok, _, err := w.store.SettleRefund(w.ctx, "m_a", "r-1", ledger.RefundCompletionOf(found.Outcome)); !ok || err != nil {
		t.Fatalf("settle by lookup: %v %v", ok, err)
	}
	if code, res := w.webhook(got[0].body, got[0].signature); code != http.StatusOK || res != gateway.WebhookAgrees {
		t.Fatalf("replay: %d %q, want 200 %q", code, res, gateway.WebhookAgrees)
	}
	if n := w.count(`SELECT count(*) FROM outcome_events WHERE merchant_id = 'm_a' AND idempotency_key = 'r-1' AND kind = 'refund_failed'`); n != 1 {
		t.Fatalf("%d refund_failed events, want 1", n)
	}
	if again, err := w.store.ClaimRefund(w.ctx, "w", time.Minute, ledger.NewRefundRequest(&payment.Command{MerchantID: "m_a",
		IdempotencyKey: "r-2", PaymentKey: "pay", Amount: 1000, Kind: payment.KindRefund})); err != nil || again.Outcome != ledger.Claimed {
		t.Fatalf("a refund of the failed refund's amount: %+v %v, want claimed", again, err)
	}
}

// A refund event that says the provider failed a refund the ledger holds
// succeeded only stamps the refund for the reconciler's lookup: the
// refund stays succeeded, no event is written, and delivered again it
// asks again; an old succeeded event for a refund failed since changes
// nothing.
func TestWebhookAsksRecheckOfSucceededRefundReportedFailed(t *testing.T) {
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
	post := func(body []byte, want string) {
		t.Helper()
		if code, res := w.webhook(body, signHMAC(body, webhookSecret, time.Now())); code != http.StatusOK || res != want {
			t.Fatalf("%s: %d %q, want 200 %q", body, code, res, want)
		}
	}
	post(event("evt_1", "refund.updated", refundObject("re_1", "pi_pay", "succeeded", 600, "r-1")), gateway.WebhookSettled)
	stamped := `SELECT count(*) FROM refunds WHERE idempotency_key = 'r-1' AND status = 'succeeded' AND recheck_requested_at IS NOT NULL`
	for _, id := range []string{"evt_2", "evt_3"} {
		post(event(id, "refund.failed", refundObject("re_1", "pi_pay", "failed", 600, "r-1")), gateway.WebhookRecheckRequested)
		if n := w.count(stamped); n != 1 {
			t.Fatalf("%d refunds stamped for a recheck, want r-1 succeeded and stamped", n)
		}
	}
	if n := w.count(`SELECT count(*) FROM outcome_events WHERE idempotency_key = 'r-1'`); n != 1 {
		t.Fatalf("%d events of r-1, want its refunded one only", n)
	}
	post(event("evt_4", "refund.updated", refundObject("re_2", "pi_pay", "failed", 400, "r-2")), gateway.WebhookRecheckRequested)
	if ok, _, err := w.store.SettleRefund(w.ctx, "m_a", "r-2", ledger.RefundCompletion{Status: ledger.RefundFailed, RefundID: "re_2",
		ResponseStatus: 200, Response: json.RawMessage(`{"id":"re_2","status":"failed"}`)}); !ok || err != nil {
		t.Fatalf("settle by lookup: %v %v", ok, err)
	}
	post(event("evt_5", "refund.updated", refundObject("re_2", "pi_pay", "succeeded", 400, "r-2")), gateway.WebhookDisagrees)
	if r, err := w.store.GetRefund(w.ctx, "m_a", "r-2"); err != nil || r.Status != ledger.RefundFailed {
		t.Fatalf("a stale succeeded event moved a failed refund: %+v %v", r, err)
	}
}

// A refund event that arrives before the worker recorded the provider's
// refund id is answered 503, so that the provider sends it again; once
// recorded, the event settles it.
func TestWebhookRetriesRefundNotRecordedYet(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, options{webhookSecret: webhookSecret})
	c, err := w.store.Claim(w.ctx, "w", time.Minute, storetest.Req("m_a", "pay", 1000))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.store.Complete(w.ctx, *c.Lease, storetest.Charged("pi_pay")); err != nil {
		t.Fatal(err)
	}
	rc, err := w.store.ClaimRefund(w.ctx, "w", time.Minute, ledger.NewRefundRequest(&payment.Command{MerchantID: "m_a",
		IdempotencyKey: "r-1", PaymentKey: "pay", Amount: 600, Kind: payment.KindRefund}))
	if err != nil || rc.Outcome != ledger.Claimed {
		t.Fatalf("claim refund: %+v %v", rc, err)
	}
	body := event("evt_1", "refund.updated", refundObject("re_1", "pi_pay", "succeeded", 600, "r-1"))
	if code, _ := w.webhook(body, signHMAC(body, webhookSecret, time.Now())); code != http.StatusServiceUnavailable {
		t.Fatalf("event before the refund id is recorded: %d, want 503", code)
	}
	if err := w.store.CompleteRefund(w.ctx, *rc.Lease, ledger.RefundCompletion{Status: ledger.RefundProcessing, RefundID: "re_1",
		ResponseStatus: 200, Response: json.RawMessage(`{"id":"re_1","status":"pending"}`)}); err != nil {
		t.Fatal(err)
	}
	if code, res := w.webhook(body, signHMAC(body, webhookSecret, time.Now())); code != http.StatusOK || res != gateway.WebhookSettled {
		t.Fatalf("event sent again: %d %q, want 200 %q", code, res, gateway.WebhookSettled)
	}
}

// A refund event that says the provider failed (or canceled) a refund the
// ledger holds processing never frees its amount: the event may be forged
// or stale, and the refund may still succeed at the provider. The refund
// stays processing, so a second refund of its amount is refused
// over_refundable, until the reconciler's lookup settles it failed.
func TestWebhookFailedReportOfPendingRefundIsOnlyAHint(t *testing.T) {
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
	for _, id := range []string{"evt_1", "evt_2"} {
		body := event(id, "refund.updated", refundObject("re_1", "pi_pay", "failed", 600, "r-1"))
		if code, res := w.webhook(body, signHMAC(body, webhookSecret, time.Now())); code != http.StatusOK || res != gateway.WebhookRecheckRequested {
			t.Fatalf("failed report of a pending refund: %d %q, want 200 %q", code, res, gateway.WebhookRecheckRequested)
		}
	}
	if r, err := w.store.GetRefund(w.ctx, "m_a", "r-1"); err != nil || r.Status != ledger.RefundProcessing {
		t.Fatalf("refund after a failed report: %+v %v, want processing", r, err)
	}
	if n := w.count(`SELECT count(*) FROM outcome_events WHERE idempotency_key = 'r-1'`); n != 0 {
		t.Fatalf("%d events of r-1, want none", n)
	}
	again := func(key string) ledger.RefundClaim {
		t.Helper()
		got, err := w.store.ClaimRefund(w.ctx, "w", time.Minute, ledger.NewRefundRequest(&payment.Command{MerchantID: "m_a",
			IdempotencyKey: key, PaymentKey: "pay", Amount: 600, Kind: payment.KindRefund}))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := again("r-2"); got.Outcome != ledger.Refused || got.Reason != ledger.RefuseOverRefundable {
		t.Fatalf("a second refund of the reported amount: %+v, want refused %s", got, ledger.RefuseOverRefundable)
	}
	// The reconciler's lookup confirms: the refund fails, its amount is free.
	if ok, _, err := w.store.SettleRefund(w.ctx, "m_a", "r-1", ledger.RefundCompletion{Status: ledger.RefundFailed, RefundID: "re_1",
		ResponseStatus: 200, Response: json.RawMessage(`{"id":"re_1","status":"failed"}`)}); !ok || err != nil {
		t.Fatalf("settle by lookup: %v %v", ok, err)
	}
	if got := again("r-3"); got.Outcome != ledger.Claimed {
		t.Fatalf("a refund after the lookup confirmed the failure: %+v, want claimed", got)
	}
}
