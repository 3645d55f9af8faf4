package gateway_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/internal/testenv"
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
	w.waitStatus("m_a", key, dedup.StatusPending) // accepted, published, claimed, its charge held
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
