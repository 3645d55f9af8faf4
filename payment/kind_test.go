package payment_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/payment"
)

// TestDecodeKinds: kind is optional (a charge), charge and authorize are
// accepted, capture and cancel (which name a payment, payment_key) too,
// and any other value, or a kind that is not a string, is invalid_kind.
func TestDecodeKinds(t *testing.T) {
	t.Parallel()
	with := func(kind string) []byte {
		return []byte(strings.Replace(good, `"amount"`, `"kind":`+kind+`,"amount"`, 1))
	}
	for _, c := range []struct {
		name string
		body []byte
		want string // the decoded kind, or "!" for invalid_kind
	}{
		{"omitted", []byte(good), ""},
		{"null", with(`null`), ""},
		{"charge", with(`"charge"`), payment.KindCharge},
		{"authorize", with(`"authorize"`), payment.KindAuthorize},
		{"capture", []byte(`{"merchant_id":"m_1","idempotency_key":"c-1","kind":"capture","payment_key":"p","amount":50}`), payment.KindCapture},
		{"cancel", []byte(`{"merchant_id":"m_1","idempotency_key":"v-1","kind":"cancel","payment_key":"p"}`), payment.KindCancel},
		{"unknown", with(`"payout"`), "!"},
		{"case", with(`"Authorize"`), "!"},
		{"empty", with(`""`), ""},
		{"number", with(`1`), "!"},
	} {
		cmd, err := payment.Decode(c.body, payment.Envelope{}, payment.Limits{})
		if c.want == "!" {
			var ve *payment.ValidationError
			if !errors.As(err, &ve) || ve.Reason != payment.ReasonInvalidKind || ve.Field != "kind" {
				t.Errorf("%s: %v, want invalid_kind on kind", c.name, err)
			}
			continue
		}
		if err != nil || cmd.Kind != c.want {
			t.Errorf("%s: kind %q (%v), want %q", c.name, cmd.Kind, err, c.want)
		}
	}
	// A refund names its payment, may leave its amount and currency out,
	// and names no payment method.
	refund := `{"merchant_id":"m_1","idempotency_key":"r-1","kind":"refund","payment_key":"order-42","metadata":{"why":"returned"}}`
	cmd, err := payment.Decode([]byte(refund), payment.Envelope{}, payment.Limits{})
	if err != nil || cmd.Kind != payment.KindRefund || cmd.PaymentKey != "order-42" || cmd.Amount != 0 {
		t.Fatalf("refund: %+v %v", cmd, err)
	}
	for _, c := range []struct{ body, field string }{
		{`{"merchant_id":"m_1","idempotency_key":"r-1","kind":"refund"}`, "payment_key"},
		{`{"merchant_id":"m_1","idempotency_key":"r-1","kind":"refund","payment_key":"p","amount":-1}`, "amount"},
		{`{"merchant_id":"m_1","idempotency_key":"r-1","kind":"refund","payment_key":"p","payment_method":"pm_card_visa"}`, "payment_method"},
		{`{"merchant_id":"m_1","idempotency_key":"r-1","kind":"refund","payment_key":"p","currency":"USD"}`, "currency"},
		{strings.Replace(good, `"amount"`, `"payment_key":"p","amount"`, 1), "payment_key"},
		{`{"merchant_id":"m_1","idempotency_key":"c-1","kind":"capture"}`, "payment_key"},
		{`{"merchant_id":"m_1","idempotency_key":"c-1","kind":"capture","payment_key":"p","payment_method":"pm_card_visa"}`, "payment_method"},
		{`{"merchant_id":"m_1","idempotency_key":"v-1","kind":"cancel","payment_key":"p","amount":10}`, "amount"},
	} {
		var ve *payment.ValidationError
		if _, err := payment.Decode([]byte(c.body), payment.Envelope{}, payment.Limits{}); !errors.As(err, &ve) || ve.Field != c.field {
			t.Errorf("%s: %v, want an error on %s", c.body, err, c.field)
		}
	}
	if !payment.IsInputReason(string(payment.ReasonInvalidKind)) {
		t.Fatal("invalid_kind is not an input reason")
	}
}

// TestCanonicalKinds: a charge's encoding is the same with its kind
// omitted or named, and has no trace of the kind (the fingerprints stored
// before kinds still match); an authorize's differs from the charge's.
func TestCanonicalKinds(t *testing.T) {
	t.Parallel()
	base := payment.Command{MerchantID: "m_1", IdempotencyKey: "k", Amount: 100, Currency: "usd", PaymentMethod: "pm_card_visa"}
	charge := base
	charge.Kind = payment.KindCharge
	auth := base
	auth.Kind = payment.KindAuthorize
	plain := base.AppendCanonical(nil)
	if !bytes.Equal(plain, charge.AppendCanonical(nil)) {
		t.Fatal("an explicit charge encodes differently from an omitted kind")
	}
	if bytes.Contains(plain, []byte("charge")) {
		t.Fatal("a charge's encoding names its kind")
	}
	if a := auth.AppendCanonical(nil); bytes.Equal(a, plain) || !bytes.HasPrefix(a, plain) {
		t.Fatal("an authorize must encode as the charge's fields followed by its kind")
	}
	if base.KindOf() != payment.KindCharge || auth.KindOf() != payment.KindAuthorize {
		t.Fatal("KindOf")
	}
}
