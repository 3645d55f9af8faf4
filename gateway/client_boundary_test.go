package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
)

// TestAnswerLostRetrySameBodyChargedOnce: the client→gateway boundary. A
// POST reaches the gateway, is accepted and its charge is under way, and
// the client's connection is cut before any answer (a load balancer
// dropping it, a client timeout): for the client the outcome is unknown.
// It does what the client contract says: the same key and the same body
// again. That retry answers the one charge's outcome; a corrected body
// under the key is 422; the provider is charged once.
func TestAnswerLostRetrySameBodyChargedOnce(t *testing.T) {
	t.Parallel()
	w := setup(t, gateway.Config{})
	w.startWorker()
	const key = "answer-lost"
	body := payBody(4200, "pm_card_visa")
	w.gate.hold(key)
	px := testenv.NewFrontProxy(t, strings.TrimPrefix(w.base, "http://"))

	errc := make(chan error, 1)
	go func() {
		r, err := http.NewRequestWithContext(w.ctx, http.MethodPost, px.URL()+"/v1/payments", strings.NewReader(body))
		if err != nil {
			errc <- err
			return
		}
		r.Header.Set("Authorization", "Bearer "+w.keyA)
		r.Header.Set("Idempotency-Key", key)
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Prefer", "wait=20")
		client := &http.Client{Transport: &http.Transport{}}
		resp, err := client.Do(r)
		if err == nil {
			_ = resp.Body.Close()
		}
		errc <- err
	}()
	w.waitStatus("m_a", key, ledger.StatusPending) // accepted, published, claimed, its charge held
	if n := px.CutClients(); n != 1 {
		t.Fatalf("cut %d client connections, want 1", n)
	}
	if err := <-errc; err == nil {
		t.Fatal("the first POST got an answer; want its connection cut before one")
	}
	w.gate.release(key)

	r := w.post(key, body, "Prefer", "wait=20")
	wantStatus(t, r, http.StatusCreated)
	if p := r.payment(t); p.Status != gateway.StateSucceeded {
		t.Fatalf("retry: %+v, want succeeded", p)
	}
	wantStatus(t, w.post(key, payBody(9900, "pm_card_visa")), http.StatusUnprocessableEntity)
	if n := w.charges("m_a", key); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
	if n := w.keyMsgs(key); n != 1 {
		t.Fatalf("%d copies of the command in the stream, want 1", n)
	}
}

// settleAnswerLost settles the first payment it is given and then reports
// a failure, as when PostgreSQL committed and its answer was lost.
type settleAnswerLost struct {
	gateway.Ledger
	once sync.Once
}

func (l *settleAnswerLost) SettlePayment(ctx context.Context, p ledger.Payment, status string, responseStatus int, response json.RawMessage) error {
	if err := l.Ledger.SettlePayment(ctx, p, status, responseStatus, response); err != nil {
		return err
	}
	lost := false
	l.once.Do(func() { lost = true })
	if lost {
		return fmt.Errorf("settle payment: %w: connection reset after the commit", ledger.ErrUnavailable)
	}
	return nil
}

// TestWebhookSettleAnswerLostRedeliveryAgrees: the webhook→PostgreSQL
// boundary. The event's settle commits and its answer is lost: the
// gateway cannot say it was applied, so it answers 503 and Stripe sends
// the event again; the redelivery finds the payment settled and agrees.
// One charge, the ledger settled once.
func TestWebhookSettleAnswerLostRedeliveryAgrees(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, options{webhookSecret: webhookSecret, processingDelay: 300 * time.Millisecond,
		ledger: func(l gateway.Ledger) gateway.Ledger { return &settleAnswerLost{Ledger: l} }})
	w.startWorker()
	wantStatus(t, w.post("ach-lost", payBody(1500, "pm_usBankAccount_success"), "Prefer", "wait=10"), http.StatusCreated)
	w.eventually("the webhook's settle committed", func() bool {
		p, err := w.store.GetPayment(w.ctx, "m_a", "ach-lost")
		return err == nil && p.Status == ledger.PaymentSucceeded
	})
	w.eventually("the webhook answered", func() bool { return len(w.hooks.deliveries()) == 1 })
	got := w.hooks.deliveries()[0]
	if got.status != http.StatusServiceUnavailable {
		t.Fatalf("first delivery answered %d, want 503 (its outcome was not known)", got.status)
	}
	settled := w.payment("m_a", "ach-lost")
	if code, res := w.webhook(got.body, got.signature); code != http.StatusOK || res != gateway.WebhookAgrees {
		t.Fatalf("redelivery: %d %q, want 200 %q", code, res, gateway.WebhookAgrees)
	}
	if again := w.payment("m_a", "ach-lost"); again != settled {
		t.Fatalf("the redelivery changed the ledger: %+v, was %+v", again, settled)
	}
	if n := w.charges("m_a", "ach-lost"); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}
