package gateway_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/ledger"
)

// TestCaptureMethodManualAuthorizes: a POST with Stripe's
// capture_method=manual publishes an authorize: the payment ends
// authorized, nothing charged, and GET shows its amount_capturable. The
// same key and body replays; the same key without capture_method is
// another payment (422). A bad capture_method is a 400 naming the field.
func TestCaptureMethodManualAuthorizes(t *testing.T) {
	t.Parallel()
	w := setup(t, gateway.Config{})
	good := payBody(1500, "pm_card_visa")
	manual := strings.Replace(good, `{`, `{"capture_method":"manual",`, 1)

	for _, c := range []struct{ body, reason string }{
		{strings.Replace(good, `{`, `{"capture_method":"later",`, 1), "invalid_kind"},
		{strings.Replace(good, `{`, `{"capture_method":1,`, 1), "invalid_kind"},
		{strings.Replace(good, `{`, `{"capture_method":"manual","capture_method":"manual",`, 1), "duplicate_field"},
		{strings.Replace(good, `{`, `{"capture_method":"manual","kind":"charge",`, 1), "invalid_kind"},
		{strings.Replace(good, `{`, `{"capture_method":"manual","colour":"red",`, 1), "unknown_field"},
		{`{"kind":"refund","payment_key":"k1"}`, "invalid_kind"},  // a refund is not taken at this door
		{`{"kind":"capture","payment_key":"k1"}`, "invalid_kind"}, // nor a capture
		{`{"kind":"cancel","payment_key":"k1"}`, "invalid_kind"},  // nor a cancel
	} {
		r := w.post("bad-method", c.body)
		wantStatus(t, r, http.StatusBadRequest)
		if p := r.problem(t); p.Reason != c.reason {
			t.Errorf("%s: reason %q, want %q", c.body, p.Reason, c.reason)
		}
	}

	w.startWorker()
	r := w.post("auth-1", manual, "Prefer", "wait=20")
	wantStatus(t, r, http.StatusCreated)
	p := r.payment(t)
	if p.Status != gateway.StateAuthorized || p.AmountCapturable == nil || *p.AmountCapturable != 1500 || p.ChargeID == "" {
		t.Fatalf("payment %+v, want authorized with 1500 capturable", p)
	}
	r = w.do(http.MethodGet, "/v1/payments/auth-1", w.keyA, "", nil)
	wantStatus(t, r, http.StatusOK)
	if g := r.payment(t); g.Status != gateway.StateAuthorized || g.AmountCapturable == nil || *g.AmountCapturable != 1500 {
		t.Fatalf("GET %+v", g)
	}
	if !strings.Contains(string(r.body), `"amount_capturable":1500`) {
		t.Fatalf("GET body %s has no amount_capturable", r.body)
	}
	if rec, ok := w.record("m_a", "auth-1"); !ok || ledger.KindOfProviderKey(rec.ProviderKey) != "authorize" {
		t.Fatalf("record %+v, want an authorize's", rec)
	}
	if n := w.charges("m_a", "auth-1"); n != 0 {
		t.Fatalf("%d charges, want none: an authorization moves no money", n)
	}
	r = w.post("auth-1", manual)
	wantStatus(t, r, http.StatusCreated)
	if r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry not replayed: %v", r.header)
	}
	wantStatus(t, w.post("auth-1", good), http.StatusUnprocessableEntity)

	// capture_method=automatic is the charge the body without it is.
	auto := strings.Replace(good, `{`, `{"capture_method":"automatic",`, 1)
	r = w.post("auto-1", auto, "Prefer", "wait=20")
	wantStatus(t, r, http.StatusCreated)
	if p := r.payment(t); p.Status != gateway.StateSucceeded || p.AmountCapturable != nil {
		t.Fatalf("automatic: %+v", p)
	}
	r = w.post("auto-1", good)
	wantStatus(t, r, http.StatusCreated)
}
