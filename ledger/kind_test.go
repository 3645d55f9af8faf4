package ledger_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
)

// TestProviderKeyForKinds: a charge's provider key is the one derived
// before kinds; an authorize's is another, whose kind reads back from it.
func TestProviderKeyForKinds(t *testing.T) {
	t.Parallel()
	charge := ledger.ProviderKeyFor(payment.KindCharge, "m_1", "k")
	if charge != ledger.ProviderKey("m_1", "k") || ledger.ProviderKeyFor("", "m_1", "k") != charge {
		t.Fatal("a charge's provider key changed")
	}
	auth := ledger.ProviderKeyFor(payment.KindAuthorize, "m_1", "k")
	if auth == charge || !strings.HasPrefix(auth, "pda_") || len(auth) != len(charge) || provider.CheckProviderKey(auth) != nil {
		t.Fatalf("authorize key %q", auth)
	}
	if ledger.KindOfProviderKey(auth) != payment.KindAuthorize || ledger.KindOfProviderKey(charge) != payment.KindCharge {
		t.Fatal("kind does not read back from the provider key")
	}
	if ledger.ProviderKeyFor(payment.KindAuthorize, "m_1", "2k") == ledger.ProviderKeyFor(payment.KindAuthorize, "m_12", "k") {
		t.Fatal("ambiguous across the merchant/key boundary")
	}
}

// TestCompletionForKinds: an intent held for capture is an authorize's
// authorization and a charge's processing (never charged); every other
// answer is CompletionOf's for both kinds.
func TestCompletionForKinds(t *testing.T) {
	t.Parallel()
	held := &provider.Outcome{ChargeID: "pi_1", Status: provider.StatusRequiresCapture, Authorized: true, AmountCapturable: 100, HTTPStatus: 200,
		Response: json.RawMessage(`{"id":"pi_1","status":"requires_capture"}`)}
	charged := &provider.Outcome{ChargeID: "pi_2", Status: "succeeded", HTTPStatus: 200, Response: json.RawMessage(`{}`)}
	for _, c := range []struct {
		kind         string
		out          *provider.Outcome
		status       string
		responseCode int
	}{
		{payment.KindAuthorize, held, ledger.PaymentAuthorized, http.StatusOK},
		{payment.KindCharge, held, ledger.PaymentProcessing, http.StatusAccepted},
		{payment.KindCharge, charged, ledger.PaymentSucceeded, http.StatusOK},
		{payment.KindAuthorize, charged, ledger.PaymentSucceeded, http.StatusOK},
	} {
		got := ledger.CompletionFor(c.kind, c.out, ledger.ProviderBodyOnly)
		if got.PaymentStatus() != c.status || got.ResponseStatus != c.responseCode || got.ChargeID != c.out.ChargeID {
			t.Errorf("%s of %s: %s %d, want %s %d", c.kind, c.out.Status, got.PaymentStatus(), got.ResponseStatus, c.status, c.responseCode)
		}
	}
}

// TestStateOfAuthorized: an authorize's completed record shows authorized
// with its capturable amount; a charge's record with the same answer, or
// an authorize the provider captured at once, does not; a purged record's
// ledger row shows authorized too.
func TestStateOfAuthorized(t *testing.T) {
	t.Parallel()
	rec := ledger.Record{IdempotencyKey: "k", Status: ledger.StatusCompleted, Amount: 500, ResponseStatus: 200,
		ProviderKey: ledger.ProviderKeyFor(payment.KindAuthorize, "m", "k"),
		Response:    json.RawMessage(`{"id":"pi_1","status":"requires_capture","amount_capturable":400}`)}
	if st := ledger.StateOf(nil, &rec, nil); st.Status != ledger.StateAuthorized || st.AmountCapturable != 400 || !st.Final() {
		t.Fatalf("authorize: %+v", st)
	}
	capt := rec
	capt.Response = json.RawMessage(`{"id":"pi_1","status":"succeeded"}`)
	if st := ledger.StateOf(nil, &capt, nil); st.Status != ledger.StateSucceeded || st.AmountCapturable != 0 {
		t.Fatalf("authorize captured at once: %+v", st)
	}
	charge := rec
	charge.ProviderKey = ledger.ProviderKey("m", "k")
	if st := ledger.StateOf(nil, &charge, nil); st.Status == ledger.StateAuthorized {
		t.Fatalf("charge: %+v", st)
	}
	pay := ledger.Payment{IdempotencyKey: "k", Status: ledger.PaymentAuthorized, Amount: 500, ChargeID: "pi_1"}
	if st := ledger.StateOf(nil, nil, &pay); st.Status != ledger.StateAuthorized || st.AmountCapturable != 500 {
		t.Fatalf("ledger row: %+v", st)
	}
}
