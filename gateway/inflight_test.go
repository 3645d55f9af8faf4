package gateway_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/ledger"
)

// TestInFlightRetryHonoursPreferWait: a retried POST for a key a worker
// is charging waits, with Prefer: wait=N, for the outcome as a new key's
// POST does, and answers it (201) once the charge completes; without a
// wait, or when N runs out, its 409's Retry-After is a few seconds, not
// the worker's lease.
func TestInFlightRetryHonoursPreferWait(t *testing.T) {
	t.Parallel()
	w := setup(t, gateway.Config{})
	w.startWorker()
	body := payBody(700, "pm_card_visa")
	w.gate.hold("slow")
	defer w.gate.release("slow")
	wantStatus(t, w.post("slow", body), http.StatusAccepted)
	w.waitStatus("m_a", "slow", ledger.StatusPending)

	for _, hdr := range [][]string{nil, {"Prefer", "wait=1"}} {
		r := w.post("slow", body, hdr...)
		wantStatus(t, r, http.StatusConflict)
		if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 || ra > 3 {
			t.Fatalf("409 %v: Retry-After %q, want a few seconds, not the lease", hdr, r.header.Get("Retry-After"))
		}
	}

	answered := make(chan response, 1)
	start := time.Now()
	go func() {
		r, err := w.req(w.ctx, http.MethodPost, "/v1/payments", w.keyA, body,
			map[string]string{"Idempotency-Key": "slow", "Prefer": "wait=10"})
		if err != nil {
			t.Error(err)
		}
		answered <- r
	}()
	select {
	case r := <-answered:
		t.Fatalf("the retry with Prefer: wait answered while the charge ran, after %v: %d %s", time.Since(start), r.status, r.body)
	case <-time.After(500 * time.Millisecond): // still waiting, as it should
	}
	w.gate.release("slow")
	var r response
	select {
	case r = <-answered:
	case <-time.After(15 * time.Second):
		t.Fatal("the retry with Prefer: wait did not answer after the charge completed")
	}
	wantStatus(t, r, http.StatusCreated)
	if r.header.Get("Preference-Applied") != "wait=10" {
		t.Fatalf("headers %v", r.header)
	}
	if p := r.payment(t); p.Status != gateway.StateSucceeded || p.Amount != 700 {
		t.Fatalf("payment %+v", p)
	}
	if c := w.charges("m_a", "slow"); c != 1 {
		t.Fatalf("%d charges", c)
	}
}
