package dedup_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/lab/storetest"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
)

// authorizeReq is the claim of an authorize command.
func authorizeReq(merchant, key string, amount int64) ledger.ClaimRequest {
	c := storetest.Command(merchant, key, amount)
	c.Kind = payment.KindAuthorize
	return ledger.NewClaimRequest(c)
}

// authorized is the completion of an intent left requires_capture.
func authorized(id string, amount int64) ledger.Completion {
	return ledger.Completion{ChargeID: id, Authorized: true, ResponseStatus: 200,
		Response: json.RawMessage(`{"id":"` + id + `","status":"requires_capture","amount":1000,"amount_capturable":1000}`)}
}

// TestAuthorizeIsStoredAuthorized: an authorize's claim stores a provider
// key of its own kind, and its completion writes the ledger row
// `authorized` and an outcome event of kind authorized in the same
// statement; the client's state is authorized with the capturable amount.
// Without migration 00023 the ledger's CHECK refuses the row.
func TestAuthorizeIsStoredAuthorized(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.claim(t, "w", authorizeReq("m_1", "auth-1", 1000))
	if res.Outcome != ledger.Claimed || !strings.HasPrefix(res.Lease.ProviderKey, "pda_") ||
		ledger.KindOfProviderKey(res.Lease.ProviderKey) != payment.KindAuthorize {
		t.Fatalf("claim %v with provider key %q, want claimed with an authorize's key", res.Outcome, res.Lease.ProviderKey)
	}
	if err := b.store.Complete(b.ctx, *res.Lease, authorized("pi_a1", 1000)); err != nil {
		t.Fatalf("complete authorize: %v", err)
	}
	pay, err := b.store.GetPayment(b.ctx, "m_1", "auth-1")
	if err != nil || pay.Status != ledger.PaymentAuthorized || pay.ChargeID != "pi_a1" {
		t.Fatalf("ledger row %+v %v, want authorized pi_a1", pay, err)
	}
	evs := b.events(t)
	if len(evs) != 1 || evs[0].Kind != ledger.OutcomeAuthorized || evs[0].Status != ledger.PaymentAuthorized ||
		evs[0].EventID != "m_1:auth-1:authorized" {
		t.Fatalf("outcome events %+v, want one authorized", evs)
	}
	rec, err := b.store.Get(b.ctx, "m_1", "auth-1")
	if err != nil {
		t.Fatal(err)
	}
	if st := ledger.StateOf(nil, &rec, &pay); st.Status != ledger.StateAuthorized || st.AmountCapturable != 1000 || !st.Final() {
		t.Fatalf("state %+v, want authorized with 1000 capturable", st)
	}
	// A charge of the same amount under the key is another payment.
	if again := b.claim(t, "w", req("m_1", "auth-1", 1000)); again.Outcome != ledger.Mismatch {
		t.Fatalf("charge under an authorize's key: %v, want mismatch", again.Outcome)
	}
	if again := b.claim(t, "w", authorizeReq("m_1", "auth-1", 1000)); again.Outcome != ledger.Duplicate {
		t.Fatalf("authorize again: %v, want duplicate", again.Outcome)
	}
}

// TestAuthorizedChargeIsNotCharged: a charge's intent the provider left
// requires_capture, recorded as ledger.CompletionFor says (through the
// group commit, as the worker does), is processing, never succeeded: the
// money did not move.
func TestAuthorizedChargeIsNotCharged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := b.claim(t, "w", req("m_1", "charge-held", 1000)).Lease
	out := &provider.Outcome{ChargeID: "pi_h1", Status: provider.StatusRequiresCapture, Authorized: true, AmountCapturable: 1000,
		HTTPStatus: 200, Response: json.RawMessage(`{"id":"pi_h1","status":"requires_capture","amount":1000}`)}
	comp := ledger.CompletionFor(ledger.KindOfProviderKey(l.ProviderKey), out, ledger.SummaryIfNoBody)
	errs, err := b.store.CompleteBatch(b.ctx, []ledger.CompleteItem{{Lease: *l, Completion: comp}})
	if err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}
	pay, err := b.store.GetPayment(b.ctx, "m_1", "charge-held")
	if err != nil || pay.Status != ledger.PaymentProcessing {
		t.Fatalf("ledger row %+v %v, want processing", pay, err)
	}
	rec, err := b.store.Get(b.ctx, "m_1", "charge-held")
	if err != nil {
		t.Fatal(err)
	}
	if st := ledger.StateOf(nil, &rec, &pay); st.Status != ledger.StateProcessing {
		t.Fatalf("state %+v, want processing", st)
	}
}
