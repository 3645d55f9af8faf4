package gateway_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/paydedup/paydedup/gateway"
)

// authorized posts an authorization (capture_method manual) and waits
// for it.
func (w *world) authorized(key string, amount int64) {
	w.t.Helper()
	r := w.post(key, `{"amount":`+strconv.FormatInt(amount, 10)+`,"currency":"usd","payment_method":"pm_card_visa","capture_method":"manual"}`, "Prefer", "wait=20")
	wantStatus(w.t, r, http.StatusCreated)
	if p := r.payment(w.t); p.Status != gateway.StateAuthorized {
		w.t.Fatalf("authorization %+v", p)
	}
}

// opFinal waits for GET path to show a final operation.
func (w *world) opFinal(path string) gateway.Operation {
	w.t.Helper()
	var op gateway.Operation
	w.eventually(path+" final", func() bool {
		r := w.do(http.MethodGet, path, w.keyA, "", nil)
		if r.status != http.StatusOK {
			return false
		}
		op = r.operation(w.t)
		return op.Status == gateway.OpSucceeded || op.Status == gateway.OpRefused
	})
	return op
}

// TestCaptureThroughTheDoor: an authorization captured at the door is
// captured once by the worker; the capture's GET shows it succeeded
// (from the worker's row: payment_ops), a retry replays it (never a new
// publish), the payment's GET shows it succeeded with what was received,
// and the capture's key is shown on its own route only.
func TestCaptureThroughTheDoor(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, refunder())
	w.startWorker()
	w.authorized("pay-c", 800)

	r := w.postOp("pay-c", "capture", "cap-1", `{"amount":600}`)
	wantStatus(t, r, http.StatusAccepted)
	if op := w.opFinal("/v1/captures/cap-1"); op.Status != gateway.OpSucceeded || op.Amount != 600 || op.PaymentKey != "pay-c" {
		t.Fatalf("GET capture %+v", op)
	}
	again := w.postOp("pay-c", "capture", "cap-1", `{"amount":600}`)
	wantStatus(t, again, http.StatusOK)
	if again.header.Get(gateway.HeaderIdempotentReplay) != "true" || again.operation(t).Status != gateway.OpSucceeded {
		t.Fatalf("replay %s %v", again.body, again.header)
	}
	if r := w.postOp("pay-c", "capture", "cap-1", `{"amount":700}`); r.status != http.StatusUnprocessableEntity || r.problem(t).Type != gateway.ProblemKeyReused {
		t.Fatalf("another amount under the capture's key: %d %s", r.status, r.body)
	}
	p := w.do(http.MethodGet, "/v1/payments/pay-c", w.keyA, "", nil).payment(t)
	if p.Status != gateway.StateSucceeded || p.AmountReceived == nil || *p.AmountReceived != 600 || p.AmountCapturable != nil {
		t.Fatalf("GET captured payment %+v", p)
	}
	for _, path := range []string{"/v1/refunds/cap-1", "/v1/cancels/cap-1", "/v1/payments/cap-1"} {
		wantStatus(t, w.do(http.MethodGet, path, w.keyA, "", nil), http.StatusNotFound)
	}
	if n := w.keyMsgs("cap-1"); n != 1 {
		t.Fatalf("%d copies of cap-1 in the stream, want 1", n)
	}
	captured := 0
	for _, c := range w.sim.Charges() {
		if c.IdempotencyKey == "pay-c" {
			captured++
			if c.Amount != 600 {
				t.Fatalf("captured %d at the provider, want 600", c.Amount)
			}
		}
	}
	if captured != 1 {
		t.Fatalf("%d captures at the provider, want 1", captured)
	}
	// A refund of it gives back from what was received.
	wantStatus(t, w.postOp("pay-c", "refunds", "ref-c", `{"amount":100}`), http.StatusAccepted)
	if ref := w.refundFinal("ref-c"); ref.Amount != 100 {
		t.Fatalf("refund %+v", ref)
	}
	p = w.do(http.MethodGet, "/v1/payments/pay-c", w.keyA, "", nil).payment(t)
	if p.Status != gateway.StatePartiallyRefunded || *p.AmountRefunded != 100 || *p.AmountReceived != 600 || len(p.Refunds) != 1 {
		t.Fatalf("GET captured payment after a refund %+v", p)
	}
}

// TestCancelThroughTheDoor: an authorization canceled at the door is
// canceled once; its GET and the payment's say so, a retry replays it,
// and a capture after it is refused by the ledger's rules.
func TestCancelThroughTheDoor(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, refunder())
	w.startWorker()
	w.authorized("pay-v", 500)

	wantStatus(t, w.postOp("pay-v", "cancel", "can-1", ``), http.StatusAccepted)
	if op := w.opFinal("/v1/cancels/can-1"); op.Status != gateway.OpSucceeded {
		t.Fatalf("GET cancel %+v", op)
	}
	again := w.postOp("pay-v", "cancel", "can-1", ``)
	wantStatus(t, again, http.StatusOK)
	if again.header.Get(gateway.HeaderIdempotentReplay) != "true" {
		t.Fatalf("replay %s %v", again.body, again.header)
	}
	p := w.do(http.MethodGet, "/v1/payments/pay-v", w.keyA, "", nil).payment(t)
	if p.Status != gateway.StateCanceled || p.AmountCapturable != nil {
		t.Fatalf("GET canceled payment %+v", p)
	}
	wantStatus(t, w.do(http.MethodGet, "/v1/captures/can-1", w.keyA, "", nil), http.StatusNotFound)
	wantStatus(t, w.postOp("pay-v", "capture", "cap-v", ``), http.StatusAccepted)
	if op := w.opFinal("/v1/captures/cap-v"); op.Status != gateway.OpRefused || op.Reason == "" {
		t.Fatalf("GET capture of a canceled payment %+v", op)
	}
	if n := w.keyMsgs("can-1"); n != 1 {
		t.Fatalf("%d copies of can-1 in the stream, want 1", n)
	}
}

// TestQueuedOperationShownOnItsOwnRouteOnly: before any worker claims it,
// an operation is shown from the door's guard row, and on its own kind's
// route only: a capture's key is 404 as a refund or a cancel.
func TestQueuedOperationShownOnItsOwnRouteOnly(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, refunder()) // no worker runs
	wantStatus(t, w.post("pay-q", `{"amount":800,"currency":"usd","payment_method":"pm_card_visa","capture_method":"manual"}`), http.StatusAccepted)
	wantStatus(t, w.postOp("pay-q", "capture", "cap-q", `{"amount":500}`), http.StatusAccepted)
	wantStatus(t, w.postOp("pay-q", "refunds", "ref-q", ``), http.StatusAccepted)
	if op := w.do(http.MethodGet, "/v1/captures/cap-q", w.keyA, "", nil).operation(t); op.Status != gateway.StateQueued || op.Object != gateway.ObjectCapture {
		t.Fatalf("GET capture %+v", op)
	}
	for _, path := range []string{"/v1/refunds/cap-q", "/v1/cancels/cap-q", "/v1/captures/ref-q", "/v1/cancels/ref-q"} {
		if r := w.do(http.MethodGet, path, w.keyA, "", nil); r.status != http.StatusNotFound {
			t.Errorf("GET %s: %d %s, want 404", path, r.status, r.body)
		}
	}
	wantStatus(t, w.do(http.MethodGet, "/v1/refunds/ref-q", w.keyA, "", nil), http.StatusOK)
}
