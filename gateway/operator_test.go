package gateway_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/ledger"
	stripeadapter "github.com/paydedup/paydedup/provider/stripe"
	"github.com/paydedup/paydedup/stream"
)

// rejectingProvider puts the Stripe adapter of the world's worker in front
// of a server that answers every charge 400 invalid_request_error (a
// request the provider refuses as it is: dead-lettered
// provider_rejected) while rejecting is set, and passes to the world's
// simulator otherwise (the provider "fixed").
func rejectingProvider(w *world) *atomic.Bool {
	w.t.Helper()
	var rejecting atomic.Bool
	rejecting.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if rejecting.Load() {
			rw.Header().Set("Content-Type", "application/json")
			rw.WriteHeader(http.StatusBadRequest)
			_, _ = rw.Write([]byte(`{"error":{"type":"invalid_request_error","code":"parameter_invalid_empty","message":"Missing required param: account."}}`))
			return
		}
		w.sim.ServeHTTP(rw, r)
	}))
	w.t.Cleanup(srv.Close)
	adapter, err := stripeadapter.New(stripeadapter.Config{SecretKey: "sk_test_paydedup", APIBase: srv.URL, Timeout: 4 * time.Second})
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(adapter.CloseIdleConnections)
	w.gate.next = adapter
	return &rejecting
}

// TestOperatorLetterWaitsForOperator: a payment the worker dead-letters
// for an operator (provider_rejected: the provider refused the request)
// is not final (a replay may still charge it) and is not "retrying"
// either (nothing retries it): GET and every retried POST read
// waiting_for_operator with the letter's reason, 202 and
// never a final 4xx, and nothing is published again. Once the provider
// is fixed and the letter replayed, the payment shows its record's state
// again and ends succeeded, charged once.
func TestOperatorLetterWaitsForOperator(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{PublishLease: time.Second, RepublishAfter: time.Second}, options{})
	rejecting := rejectingProvider(w)
	w.startWorker()
	body := payBody(700, "pm_card_visa")
	wantStatus(t, w.post("rej", body), http.StatusAccepted)

	var last response
	w.eventually("GET answers waiting_for_operator", func() bool {
		last = w.do(http.MethodGet, "/v1/payments/rej", w.keyA, "", nil)
		if last.status != http.StatusOK {
			t.Fatalf("GET of a payment waiting for an operator: status %d %s", last.status, last.body)
		}
		return last.payment(t).Status == gateway.StateWaitingForOperator
	})
	if p := last.payment(t); p.Reason != stream.ReasonProviderRejected || p.CompletedAt != nil || p.Amount != 700 {
		t.Fatalf("GET payment %+v, want waiting_for_operator with reason %s", p, stream.ReasonProviderRejected)
	}
	// Asked to wait, GET answers at once: nothing moves until an
	// operator replays it. The answers match openapi.yaml.
	c := newOpenAPIChecker(t, w)
	start := time.Now()
	g := c.exchange(true, http.MethodGet, "/v1/payments/rej", w.keyA, "", map[string]string{"Prefer": "wait=10"})
	wantStatus(t, g, http.StatusOK)
	if p := g.payment(t); p.Status != gateway.StateWaitingForOperator || time.Since(start) > 5*time.Second {
		t.Fatalf("GET with Prefer: wait: %+v after %v", p, time.Since(start))
	}

	first := w.intake("rej")
	w.eventually("past the republish hold", func() bool { return time.Now().After(first.LockedUntil.Add(100 * time.Millisecond)) })
	for _, hdr := range []map[string]string{{}, {}, {"Prefer": "wait=5"}} {
		hdr["Idempotency-Key"] = "rej"
		r := c.exchange(true, http.MethodPost, "/v1/payments", w.keyA, body, hdr)
		wantStatus(t, r, http.StatusAccepted)
		if p := r.payment(t); p.Status != gateway.StateWaitingForOperator || p.Reason != stream.ReasonProviderRejected {
			t.Fatalf("retried POST %v: payment %+v, want waiting_for_operator (%s)", hdr, p, stream.ReasonProviderRejected)
		}
	}
	if n := w.streamMsgs(); n != 1 {
		t.Fatalf("%d messages in the stream, want 1: a payment waiting for an operator was published again", n)
	}
	if c := w.charges("m_a", "rej"); c != 0 {
		t.Fatalf("%d charges before the replay", c)
	}

	rejecting.Store(false)
	rep, err := dlq.Replay(w.ctx, w.js, w.cfg.Stream, dlq.ReplayOptions{All: true, Reason: stream.ReasonProviderRejected})
	if err != nil || rep.Replayed != 1 {
		t.Fatalf("replay: %+v %v", rep, err)
	}
	w.waitStatus("m_a", "rej", ledger.StatusCompleted)
	g = w.do(http.MethodGet, "/v1/payments/rej", w.keyA, "", nil)
	wantStatus(t, g, http.StatusOK)
	if p := g.payment(t); p.Status != gateway.StateSucceeded || p.Reason != "" {
		t.Fatalf("GET after the replay: %+v, want succeeded", p)
	}
	r := w.post("rej", body)
	wantStatus(t, r, http.StatusCreated)
	if p := r.payment(t); p.Status != gateway.StateSucceeded {
		t.Fatalf("POST after the replay: %+v", p)
	}
	if c := w.charges("m_a", "rej"); c != 1 {
		t.Fatalf("%d charges, want 1", c)
	}
}
