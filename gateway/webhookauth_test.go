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

// An authorized payment the provider canceled (its capture window ran
// out) is recorded canceled by payment_intent.canceled, with one canceled
// event however often the event is delivered; amount_capturable_updated
// of an authorized payment agrees with it and changes nothing.
func TestWebhookCancelsAuthorizedPayment(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, options{webhookSecret: webhookSecret})
	w.authorizedPayment("auth", "pi_auth", 1000)
	w.authorizedPayment("auth-2", "pi_auth2", 1000)
	post := func(body []byte, want string) {
		t.Helper()
		if code, res := w.webhook(body, signHMAC(body, webhookSecret, time.Now())); code != http.StatusOK || res != want {
			t.Fatalf("%s: %d %q, want 200 %q", body, code, res, want)
		}
	}
	meta := map[string]string{"merchant_id": "m_a", "idempotency_key": "auth"}
	canceled := intentEvent("evt_1", "payment_intent.canceled", "pi_auth", "canceled", 1000, meta)
	post(canceled, gateway.WebhookSettled)
	if p := w.payment("m_a", "auth"); p.Status != ledger.PaymentCanceled {
		t.Fatalf("payment after its intent was canceled: %+v", p)
	}
	post(canceled, gateway.WebhookAgrees)
	if n := w.count(`SELECT count(*) FROM outcome_events WHERE event_id = 'm_a:auth:canceled' AND kind = 'canceled'`); n != 1 {
		t.Fatalf("%d canceled events, want 1", n)
	}
	meta2 := map[string]string{"merchant_id": "m_a", "idempotency_key": "auth-2"}
	post(intentEvent("evt_2", "payment_intent.amount_capturable_updated", "pi_auth2", "requires_capture", 1000, meta2), gateway.WebhookAgrees)
	if p := w.payment("m_a", "auth-2"); p.Status != ledger.PaymentAuthorized {
		t.Fatalf("payment after amount_capturable_updated: %+v", p)
	}
}

// An authorization whose capture window runs out at the simulator is
// recorded canceled through the payment_intent.canceled it posts, with no
// reconciler running; the event delivered again changes nothing.
func TestWebhookCancelsExpiredAuthorization(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, options{webhookSecret: webhookSecret, captureWindow: 300 * time.Millisecond})
	st, ok := w.gate.next.(*stripeadapter.Client)
	if !ok {
		t.Fatalf("the world's provider is a %T", w.gate.next)
	}
	cmd := storetest.Command("m_a", "auth", 1000)
	cmd.Kind = payment.KindAuthorize
	c, err := w.store.Claim(w.ctx, "w", time.Minute, ledger.NewClaimRequest(cmd))
	if err != nil || c.Lease == nil {
		t.Fatalf("claim: %+v %v", c, err)
	}
	out, err := st.Charge(w.ctx, provider.ChargeRequest{ProviderKey: c.Lease.ProviderKey, MerchantID: "m_a", IdempotencyKey: "auth",
		Amount: 1000, Currency: cmd.Currency, PaymentMethod: cmd.PaymentMethod, ManualCapture: true})
	if err != nil || !out.Authorized {
		t.Fatalf("authorize: %+v %v", out, err)
	}
	if err := w.store.Complete(w.ctx, *c.Lease, ledger.CompletionFor(payment.KindAuthorize, out, ledger.ProviderBodyOnly)); err != nil {
		t.Fatal(err)
	}
	// The simulator notes a delivery once its answer is back, after the
	// gateway's write: wait for both.
	w.eventually("the webhook records the authorization canceled", func() bool {
		p, err := w.store.GetPayment(w.ctx, "m_a", "auth")
		return err == nil && p.Status == ledger.PaymentCanceled && len(w.hooks.deliveries()) > 0
	})
	got := w.hooks.deliveries()
	if len(got) != 1 || got[0].status != http.StatusOK || !strings.Contains(string(got[0].body), `"payment_intent.canceled"`) {
		t.Fatalf("deliveries %+v, want one payment_intent.canceled answered 200", got)
	}
	if code, res := w.webhook(got[0].body, got[0].signature); code != http.StatusOK || res != gateway.WebhookAgrees {
		t.Fatalf("replay: %d %q, want 200 %q", code, res, gateway.WebhookAgrees)
	}
	if n := w.count(`SELECT count(*) FROM outcome_events WHERE event_id = 'm_a:auth:canceled'`); n != 1 {
		t.Fatalf("%d canceled events, want 1", n)
	}
}
