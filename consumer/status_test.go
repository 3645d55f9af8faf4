package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider/stripe"
	"github.com/paydedup/paydedup/stream"
)

func publishWith(e *env, key, method string, amount int64) {
	e.t.Helper()
	b, _ := json.Marshal(cmdJSON{MerchantID: "m_1", IdempotencyKey: key, Amount: amount, Currency: "usd", PaymentMethod: method})
	e.publish("m_1", b, "", nil)
}

// TestProcessingSettlesTheKey: a bank debit the provider leaves processing
// completes the key (202, never charged again) and writes a `processing`
// ledger row; a duplicate is acked without a call.
func TestProcessingSettlesTheKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.startWorker("w1", nil)
	publishWith(e, "ach", "pm_usBankAccount_success", 700)
	e.eventually("processing recorded", func() bool {
		return e.count(`SELECT count(*) FROM payments WHERE status = 'processing' AND charge_id IS NOT NULL`) == 1
	})
	publishWith(e, "ach", "pm_usBankAccount_success", 700)
	e.quiescent()
	rec, err := e.store.Get(e.ctx, "m_1", "ach")
	if err != nil || rec.Status != ledger.StatusCompleted || rec.ResponseStatus != http.StatusAccepted || rec.Attempts != 1 {
		t.Fatalf("record %+v %v: want completed 202 after one attempt", rec, err)
	}
	p, err := e.store.GetPayment(e.ctx, "m_1", "ach")
	if err != nil || p.Status != ledger.PaymentProcessing || p.ChargeID != rec.ChargeID {
		t.Fatalf("ledger %+v %v", p, err)
	}
}

// TestOffSessionAuthenticationDeclined: a card that needs 3-D Secure,
// charged off-session, is declined with Stripe's authentication_required.
func TestOffSessionAuthenticationDeclined(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.startWorker("w1", nil)
	publishWith(e, "3ds", "pm_card_authenticationRequired", 900)
	e.eventually("decline recorded", func() bool {
		return e.count(`SELECT count(*) FROM payments WHERE status = 'declined'`) == 1
	})
	rec, err := e.store.Get(e.ctx, "m_1", "3ds")
	if err != nil || rec.ResponseStatus != http.StatusPaymentRequired || !strings.Contains(string(rec.Response), `"code":"authentication_required"`) {
		t.Fatalf("record %+v (%s) %v", rec, rec.Response, err)
	}
}

// TestRejectionDeadLetteredNotDeclined: a request the provider rejects (400
// invalid_request_error: here a payment method it does not have) is
// dead-lettered provider_rejected with Stripe's error; no decline is
// stored and the row is failed (not charged), so a replay after a fix
// re-acquires it.
func TestRejectionDeadLetteredNotDeclined(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.startWorker("w1", nil)
	publishWith(e, "rej", "card_not_a_pm", 900)
	e.eventually("dead letter", func() bool { return len(e.deadLetters()) == 1 })
	dl := e.deadLetters()[0]
	if r := dl.Header.Get(stream.HeaderDLQReason); r != stream.ReasonProviderRejected ||
		!strings.Contains(dl.Header.Get("Dlq-Error"), "resource_missing") {
		t.Fatalf("dead letter %v", dl.Header)
	}
	if n := e.count(`SELECT count(*) FROM payments`); n != 0 {
		t.Fatalf("%d ledger rows: a rejection is not a decline", n)
	}
	rec, err := e.store.Get(e.ctx, "m_1", "rej")
	if err != nil || rec.Status != ledger.StatusFailed {
		t.Fatalf("record %+v %v, want failed", rec, err)
	}
}

// TestUnauthorizedPausesTheWorker: a refused API key neither declines nor
// dead-letters: the row is failed (not charged), readiness fails, the worker
// stops fetching, and once the key works again the payment is charged.
func TestUnauthorizedPausesTheWorker(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var revoked atomic.Bool
	revoked.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if revoked.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":{"type":"invalid_request_error","message":"Invalid API Key provided: sk_test_****"}}`))
			return
		}
		e.sim.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s, err := stripe.New(stripe.Config{SecretKey: "sk_test_paydedup", APIBase: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.CloseIdleConnections)
	proc := consumer.NewProcessor(e.store, s, e.cfg, nil)
	cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: "auth", Amount: 300, Currency: "usd", PaymentMethod: "pm_card_visa"}
	claims, err := proc.Claim(e.ctx, []*payment.Command{cmd})
	if err != nil {
		t.Fatal(err)
	}
	res := proc.Handle(e.ctx, cmd, claims[0], nil)
	if res.Kind != consumer.Retry || res.Delay < consumer.AuthPauseFirst {
		t.Fatalf("result %+v, want a retry after the pause", res)
	}
	if err := proc.Paused(context.Background()); !errors.Is(err, consumer.ErrProviderUnauthorized) {
		t.Fatalf("readiness = %v, want ErrProviderUnauthorized", err)
	}
	rec, err := e.store.Get(e.ctx, "m_1", "auth")
	if err != nil || rec.Status != ledger.StatusFailed {
		t.Fatalf("record %+v %v, want failed (not charged)", rec, err)
	}
	revoked.Store(false)
	claims, err = proc.Claim(e.ctx, []*payment.Command{cmd})
	if err != nil {
		t.Fatal(err)
	}
	if res := proc.Handle(e.ctx, cmd, claims[0], nil); res.Kind != consumer.Completed {
		t.Fatalf("after the key is fixed: %+v", res)
	}
	if err := proc.Paused(context.Background()); err != nil {
		t.Fatalf("readiness after a charge: %v", err)
	}
	if e.charges("m_1", "auth") != 1 {
		t.Fatal("want one charge")
	}
}
