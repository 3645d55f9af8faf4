package gateway_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/lab/storetest"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	stripeadapter "github.com/paydedup/paydedup/provider/stripe"
	"github.com/paydedup/paydedup/reconciler"
)

// authorizedPayment records, as the worker does, an authorize of amount
// under key left requires_capture as intent id.
func (w *world) authorizedPayment(key, id string, amount int64) {
	w.t.Helper()
	cmd := storetest.Command("m_a", key, amount)
	cmd.Kind = payment.KindAuthorize
	c, err := w.store.Claim(w.ctx, "w", time.Minute, ledger.NewClaimRequest(cmd))
	if err != nil || c.Lease == nil {
		w.t.Fatalf("claim %s: %+v %v", key, c, err)
	}
	if err := w.store.Complete(w.ctx, *c.Lease, ledger.Completion{ChargeID: id, Authorized: true, ResponseStatus: 200,
		Response: json.RawMessage(`{"id":"` + id + `","status":"requires_capture"}`)}); err != nil {
		w.t.Fatal(err)
	}
}

// authorizedAtProvider authorizes amount under key at the simulator (the
// intent left requires_capture) and records it, as the worker does; it
// returns the world's Stripe adapter and the intent's id.
func (w *world) authorizedAtProvider(key string, amount int64) (*stripeadapter.Client, string) {
	w.t.Helper()
	st, ok := w.gate.next.(*stripeadapter.Client)
	if !ok {
		w.t.Fatalf("the world's provider is a %T", w.gate.next)
	}
	cmd := storetest.Command("m_a", key, amount)
	cmd.Kind = payment.KindAuthorize
	c, err := w.store.Claim(w.ctx, "w", time.Minute, ledger.NewClaimRequest(cmd))
	if err != nil || c.Lease == nil {
		w.t.Fatalf("claim %s: %+v %v", key, c, err)
	}
	out, err := st.Charge(w.ctx, provider.ChargeRequest{ProviderKey: c.Lease.ProviderKey, MerchantID: "m_a", IdempotencyKey: key,
		Amount: amount, Currency: cmd.Currency, PaymentMethod: cmd.PaymentMethod, ManualCapture: true})
	if err != nil || !out.Authorized {
		w.t.Fatalf("authorize %s: %+v %v", key, out, err)
	}
	if err := w.store.Complete(w.ctx, *c.Lease, ledger.CompletionFor(payment.KindAuthorize, out, ledger.ProviderBodyOnly)); err != nil {
		w.t.Fatal(err)
	}
	return st, out.ChargeID
}

// reconcile runs one reconciler pass over the world's ledger, looking up
// through st.
func (w *world) reconcile(st *stripeadapter.Client) reconciler.RunResult {
	w.t.Helper()
	r, err := reconciler.New(w.store, st, reconciler.Config{Holder: "rec"})
	if err != nil {
		w.t.Fatal(err)
	}
	res, err := r.RunOnce(w.ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	return res
}

// payment_intent.canceled is a hint, as a refund's failure is (00033,
// 00034): a signed event (a leaked secret, a replay) saying canceled an
// authorization the provider still holds requires_capture stamps it for
// the reconciler and moves nothing; the reconciler's retrieve of the
// intent finds it requires_capture and leaves the payment authorized. A
// cancel made at the provider is recorded canceled once its event's
// recheck is looked up, with one canceled event however often the event
// is delivered; amount_capturable_updated of an authorized payment agrees
// with it and changes nothing.
func TestWebhookCancelIsConfirmedByLookup(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, options{webhookSecret: webhookSecret})
	st, id := w.authorizedAtProvider("auth", 1000)
	w.authorizedPayment("auth-2", "pi_auth2", 1000)
	post := func(body []byte, want string) {
		t.Helper()
		if code, res := w.webhook(body, signHMAC(body, webhookSecret, time.Now())); code != http.StatusOK || res != want {
			t.Fatalf("%s: %d %q, want 200 %q", body, code, res, want)
		}
	}
	canceledEvents := func() int {
		return w.count(`SELECT count(*) FROM outcome_events WHERE event_id = 'm_a:auth:canceled' AND kind = 'canceled'`)
	}
	meta := map[string]string{"merchant_id": "m_a", "idempotency_key": "auth"}
	forged := intentEvent("evt_1", "payment_intent.canceled", id, "canceled", 1000, meta)
	post(forged, gateway.WebhookRecheckRequested)
	if p := w.payment("m_a", "auth"); p.Status != ledger.PaymentAuthorized || canceledEvents() != 0 {
		t.Fatalf("an authorization the provider still holds, after an event saying canceled: %+v, %d canceled events; want authorized, none", p, canceledEvents())
	}
	w.reconcile(st)
	if p := w.payment("m_a", "auth"); p.Status != ledger.PaymentAuthorized || canceledEvents() != 0 {
		t.Fatalf("after the reconciler's lookup found it requires_capture: %+v, %d canceled events; want authorized, none", p, canceledEvents())
	}
	if n := w.count(`SELECT count(*) FROM payment_cancel_rechecks`); n != 0 {
		t.Fatalf("%d cancel rechecks left after the lookup, want 0", n)
	}

	if _, err := st.Cancel(w.ctx, provider.CancelRequest{ProviderKey: "void-auth", ChargeID: id, MerchantID: "m_a"}); err != nil {
		t.Fatal(err)
	}
	post(forged, gateway.WebhookRecheckRequested)
	if p := w.payment("m_a", "auth"); p.Status != ledger.PaymentAuthorized {
		t.Fatalf("canceled on the event's word: %+v", p)
	}
	w.reconcile(st)
	if p := w.payment("m_a", "auth"); p.Status != ledger.PaymentCanceled {
		t.Fatalf("payment after the lookup confirmed its intent canceled: %+v", p)
	}
	post(forged, gateway.WebhookAgrees)
	if n := canceledEvents(); n != 1 {
		t.Fatalf("%d canceled events, want 1", n)
	}
	meta2 := map[string]string{"merchant_id": "m_a", "idempotency_key": "auth-2"}
	post(intentEvent("evt_2", "payment_intent.amount_capturable_updated", "pi_auth2", "requires_capture", 1000, meta2), gateway.WebhookAgrees)
	if p := w.payment("m_a", "auth-2"); p.Status != ledger.PaymentAuthorized {
		t.Fatalf("payment after amount_capturable_updated: %+v", p)
	}
}

// An authorization whose capture window runs out at the simulator is
// stamped for a recheck by the payment_intent.canceled it posts, and
// recorded canceled by the reconciler's retrieve of the intent; the event
// delivered again changes nothing.
func TestWebhookCancelsExpiredAuthorization(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, options{webhookSecret: webhookSecret, captureWindow: 300 * time.Millisecond})
	st, _ := w.authorizedAtProvider("auth", 1000)
	// The simulator notes a delivery once its answer is back, after the
	// gateway's write: wait for both.
	w.eventually("the webhook stamps the authorization for a recheck", func() bool {
		return w.count(`SELECT count(*) FROM payment_cancel_rechecks WHERE idempotency_key = 'auth'`) == 1 && len(w.hooks.deliveries()) > 0
	})
	got := w.hooks.deliveries()
	if len(got) != 1 || got[0].status != http.StatusOK || !strings.Contains(string(got[0].body), `"payment_intent.canceled"`) {
		t.Fatalf("deliveries %+v, want one payment_intent.canceled answered 200", got)
	}
	if p := w.payment("m_a", "auth"); p.Status != ledger.PaymentAuthorized {
		t.Fatalf("canceled on the event's word: %+v", p)
	}
	if res := w.reconcile(st); res.CancelsConfirmed != 1 {
		t.Fatalf("reconciler pass %+v, want 1 cancel confirmed", res)
	}
	if p := w.payment("m_a", "auth"); p.Status != ledger.PaymentCanceled {
		t.Fatalf("payment after the lookup: %+v, want canceled", p)
	}
	if code, res := w.webhook(got[0].body, got[0].signature); code != http.StatusOK || res != gateway.WebhookAgrees {
		t.Fatalf("replay: %d %q, want 200 %q", code, res, gateway.WebhookAgrees)
	}
	if n := w.count(`SELECT count(*) FROM outcome_events WHERE event_id = 'm_a:auth:canceled'`); n != 1 {
		t.Fatalf("%d canceled events, want 1", n)
	}
}
