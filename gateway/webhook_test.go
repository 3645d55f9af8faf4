package gateway_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/ledger"
)

const webhookSecret = "whsec_paydedup_test"

// delivery is one webhook event as the simulator posted it.
type delivery struct {
	body      []byte
	signature string
	status    int
}

// hookRecorder passes the simulator's webhook deliveries on to the gateway
// and keeps them, so that a test can replay one.
type hookRecorder struct {
	target string
	mu     sync.Mutex
	got    []delivery
}

func (h *hookRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	req, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, h.target, bytes.NewReader(body))
	req.Header.Set(gateway.HeaderStripeSignature, r.Header.Get(gateway.HeaderStripeSignature))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	h.mu.Lock()
	h.got = append(h.got, delivery{body: body, signature: r.Header.Get(gateway.HeaderStripeSignature), status: resp.StatusCode})
	h.mu.Unlock()
	w.WriteHeader(resp.StatusCode)
}

func (h *hookRecorder) deliveries() []delivery {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]delivery(nil), h.got...)
}

// webhook posts an event to the gateway and returns the status and the
// result it reports.
func (w *world) webhook(body []byte, signature string) (int, string) {
	w.t.Helper()
	r := w.do(http.MethodPost, gateway.PathStripeWebhooks, "", string(body), map[string]string{gateway.HeaderStripeSignature: signature})
	var reply struct {
		Result string `json:"result"`
	}
	_ = json.Unmarshal(r.body, &reply)
	return r.status, reply.Result
}

func (w *world) payment(merchant, key string) ledger.Payment {
	w.t.Helper()
	p, err := w.store.GetPayment(w.ctx, merchant, key)
	if err != nil {
		w.t.Fatal(err)
	}
	return p
}

// intentEvent is a Stripe event of type typ about an intent as Stripe
// renders it (the fields the adapter reads).
func intentEvent(id, typ, intentID, status string, amount int64, metadata map[string]string) []byte {
	pi := map[string]any{"id": intentID, "object": "payment_intent", "status": status, "amount": amount,
		"currency": "usd", "metadata": metadata, "created": time.Now().Unix()}
	if status == "requires_payment_method" {
		pi["last_payment_error"] = map[string]any{"type": "card_error", "code": "payment_intent_payment_attempt_failed", "decline_code": "account_closed"}
	}
	b, _ := json.Marshal(map[string]any{"id": id, "object": "event", "api_version": stripesim.WebhookAPIVersion,
		"created": time.Now().Unix(), "type": typ, "data": map[string]any{"object": pi}})
	return b
}

// A bank debit left processing by the worker settles through the
// simulator's webhook, with no reconciler running; the event delivered
// again changes nothing.
func TestWebhookSettlesProcessingPayment(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, options{webhookSecret: webhookSecret, processingDelay: 300 * time.Millisecond})
	w.startWorker()
	r := w.post("ach-1", payBody(1500, "pm_usBankAccount_success"), "Prefer", "wait=10")
	wantStatus(t, r, http.StatusCreated)
	w.eventually("the webhook settles the payment", func() bool {
		p, err := w.store.GetPayment(w.ctx, "m_a", "ach-1")
		return err == nil && p.Status == ledger.PaymentSucceeded
	})
	settled := w.payment("m_a", "ach-1")
	if settled.SettledAt.IsZero() {
		t.Fatal("settled_at not set")
	}
	if rec, _ := w.record("m_a", "ach-1"); rec.ResponseStatus != http.StatusOK {
		t.Fatalf("key answers %d after settling, want 200", rec.ResponseStatus)
	}
	got := w.hooks.deliveries()
	if len(got) != 1 || got[0].status != http.StatusOK || !strings.Contains(string(got[0].body), `"payment_intent.succeeded"`) {
		t.Fatalf("deliveries %+v, want one payment_intent.succeeded answered 200", got)
	}

	// Redelivered (Stripe delivers at least once): agrees, nothing changes.
	if code, res := w.webhook(got[0].body, got[0].signature); code != http.StatusOK || res != gateway.WebhookAgrees {
		t.Fatalf("replay: %d %q, want 200 %q", code, res, gateway.WebhookAgrees)
	}
	if again := w.payment("m_a", "ach-1"); again != settled {
		t.Fatalf("replay changed the ledger: %+v, was %+v", again, settled)
	}
	if charges := w.charges("m_a", "ach-1"); charges != 1 {
		t.Fatalf("%d charges, want 1", charges)
	}
}

// A bank debit that fails at the bank settles as failed.
func TestWebhookSettlesFailedBankDebit(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, options{webhookSecret: webhookSecret, processingDelay: 300 * time.Millisecond})
	w.startWorker()
	wantStatus(t, w.post("ach-2", payBody(700, "pm_usBankAccount_accountClosed"), "Prefer", "wait=10"), http.StatusCreated)
	w.eventually("the webhook fails the payment", func() bool {
		p, err := w.store.GetPayment(w.ctx, "m_a", "ach-2")
		return err == nil && p.Status == ledger.PaymentFailed
	})
	if rec, _ := w.record("m_a", "ach-2"); rec.ResponseStatus != http.StatusPaymentRequired {
		t.Fatalf("key answers %d after failing, want 402", rec.ResponseStatus)
	}
}

// Events that are not Stripe's, or are too old, are 400 and change
// nothing; an event contradicting a final row is counted and changes
// nothing; an intent without our metadata is acknowledged and ignored.
func TestWebhookRefusesAndChecks(t *testing.T) {
	t.Parallel()
	// The simulator never settles during the test: only the test's events
	// move the row.
	w := setupWith(t, gateway.Config{}, options{webhookSecret: webhookSecret, processingDelay: time.Hour})
	w.startWorker()
	wantStatus(t, w.post("ach-3", payBody(900, "pm_usBankAccount_success"), "Prefer", "wait=10"), http.StatusCreated)
	w.eventually("the payment is processing", func() bool {
		p, err := w.store.GetPayment(w.ctx, "m_a", "ach-3")
		return err == nil && p.Status == ledger.PaymentProcessing
	})
	before := w.payment("m_a", "ach-3")
	meta := map[string]string{"merchant_id": "m_a", "idempotency_key": "ach-3"}
	succeeded := intentEvent("evt_1", "payment_intent.succeeded", before.ChargeID, "succeeded", 900, meta)

	refused := []struct {
		name, signature string
	}{
		{"unsigned", ""},
		{"wrong secret", stripesim.SignWebhook(succeeded, "whsec_other", time.Now())},
		{"too old", stripesim.SignWebhook(succeeded, webhookSecret, time.Now().Add(-10*time.Minute))},
		{"too old, signed by hand", signHMAC(succeeded, webhookSecret, time.Now().Add(-10*time.Minute))},
		// stripe-go checks only the past side; a signature from the
		// future is as untrustworthy as an old one.
		{"an hour ahead", signHMAC(succeeded, webhookSecret, time.Now().Add(time.Hour))},
		{"six minutes ahead", signHMAC(succeeded, webhookSecret, time.Now().Add(6*time.Minute))},
		{"another body", stripesim.SignWebhook(append([]byte(" "), succeeded...), webhookSecret, time.Now())},
	}
	for _, c := range refused {
		if code, _ := w.webhook(succeeded, c.signature); code != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", c.name, code)
		}
	}
	if p := w.payment("m_a", "ach-3"); p != before {
		t.Fatalf("a refused event changed the ledger: %+v, was %+v", p, before)
	}

	// Another amount under our key: not the ledger's intent.
	foreign := intentEvent("evt_2", "payment_intent.succeeded", before.ChargeID, "succeeded", 901, meta)
	if code, res := w.webhook(foreign, stripesim.SignWebhook(foreign, webhookSecret, time.Now())); code != http.StatusOK || res != gateway.WebhookForeignIntent {
		t.Fatalf("foreign intent: %d %q", code, res)
	}
	if p := w.payment("m_a", "ach-3"); p != before {
		t.Fatalf("a foreign intent changed the ledger: %+v", p)
	}

	if code, res := w.webhook(succeeded, stripesim.SignWebhook(succeeded, webhookSecret, time.Now())); code != http.StatusOK || res != gateway.WebhookSettled {
		t.Fatalf("signed event: %d %q, want 200 %q", code, res, gateway.WebhookSettled)
	}
	settled := w.payment("m_a", "ach-3")
	if settled.Status != ledger.PaymentSucceeded {
		t.Fatalf("status %s, want succeeded", settled.Status)
	}

	// The bank says failed after all: counted, the ledger unchanged.
	failed := intentEvent("evt_3", "payment_intent.payment_failed", before.ChargeID, "requires_payment_method", 900, meta)
	if code, res := w.webhook(failed, stripesim.SignWebhook(failed, webhookSecret, time.Now())); code != http.StatusOK || res != gateway.WebhookDisagrees {
		t.Fatalf("disagreeing event: %d %q, want 200 %q", code, res, gateway.WebhookDisagrees)
	}
	if p := w.payment("m_a", "ach-3"); p != settled {
		t.Fatalf("a disagreeing event changed the ledger: %+v, was %+v", p, settled)
	}
	if n := w.webhookResults(gateway.WebhookDisagrees); n != 1 {
		t.Fatalf("disagreements counted %v, want 1", n)
	}

	// Not ours, and not a payment outcome: acknowledged, ignored.
	notOurs := intentEvent("evt_4", "payment_intent.succeeded", "pi_elsewhere", "succeeded", 900, map[string]string{"order": "7"})
	if code, res := w.webhook(notOurs, stripesim.SignWebhook(notOurs, webhookSecret, time.Now())); code != http.StatusOK || res != gateway.WebhookNotOurs {
		t.Fatalf("intent without our metadata: %d %q", code, res)
	}
	other := intentEvent("evt_5", "payment_intent.created", before.ChargeID, "processing", 900, meta)
	if code, res := w.webhook(other, stripesim.SignWebhook(other, webhookSecret, time.Now())); code != http.StatusOK || res != gateway.WebhookIgnoredType {
		t.Fatalf("payment_intent.created: %d %q", code, res)
	}
	if p := w.payment("m_a", "ach-3"); p != settled {
		t.Fatalf("ignored events changed the ledger: %+v", p)
	}
}

// signHMAC signs body as Stripe does (Stripe-Signature "t=<unix>,v1=<hex
// HMAC-SHA256 of "t.body">"), with crypto/hmac rather than any helper of the
// code under test.
func signHMAC(body []byte, secret string, at time.Time) string {
	mac := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(mac, "%d.", at.Unix())
	mac.Write(body)
	return fmt.Sprintf("t=%d,v1=%s", at.Unix(), hex.EncodeToString(mac.Sum(nil)))
}

// Without a signing secret the route is not served.
func TestWebhookOffWithoutSecret(t *testing.T) {
	t.Parallel()
	w := setup(t, gateway.Config{})
	body := intentEvent("evt_1", "payment_intent.succeeded", "pi_x", "succeeded", 1, nil)
	if code, _ := w.webhook(body, stripesim.SignWebhook(body, webhookSecret, time.Now())); code != http.StatusNotFound {
		t.Fatalf("%d, want 404", code)
	}
}

// webhookResults is paydedup_gateway_webhook_events_total{result}.
func (w *world) webhookResults(result string) float64 {
	w.t.Helper()
	fams, err := w.reg.Gather()
	if err != nil {
		w.t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "paydedup_gateway_webhook_events_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
