package payment_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/payment"
)

// cardCase is one command with card data somewhere a person types, and the
// field its card_data error must name.
type cardCase struct {
	name  string
	body  string
	env   payment.Envelope
	field string
	// newDetector marks a case today's detector (ASCII digits only) misses:
	// it passes once internal/redact has the detector of any digit script.
	newDetector bool
}

// Test card numbers: each passes the Luhn check.
const (
	panVisa   = "4111111111111111"
	panSpaced = "4111 1111 1111 1111"
	panDashed = "5555-5555-5555-4444"
	panAmex   = "378282246310005"
	// panFullwidth is panSpaced in fullwidth digits, what Japanese and
	// Chinese keyboards type by default.
	panFullwidth = "４１１１ １１１１ １１１１ １１１１"
)

func cardCases(pan string, newDetector bool) []cardCase {
	withKey := func(key string) string {
		return `{"merchant_id":"m_1","idempotency_key":"` + key + `","amount":1999,"currency":"usd","payment_method":"pm_card_visa"}`
	}
	ok := withKey("order-42")
	add := func(members string) string { return strings.TrimSuffix(ok, "}") + "," + members + "}" }
	noKey := `{"merchant_id":"m_1","amount":1999,"currency":"usd","payment_method":"pm_card_visa"}`
	cases := []cardCase{
		{name: "description", body: add(`"description":"card ` + pan + ` exp 12/29"`), field: "description"},
		{name: "metadata value", body: add(`"metadata":{"order":"42","note":"` + pan + `"}`), field: "metadata.note"},
		{name: "metadata key", body: add(`"metadata":{"` + pan + `":"x"}`), field: "metadata"},
		{name: "idempotency key", body: withKey(pan), field: "idempotency_key"},
		{name: "Idempotency-Key header", body: noKey, env: payment.Envelope{HeaderKey: pan, HeaderKeySet: true}, field: "Idempotency-Key"},
		{name: "header beside a body key", body: ok, env: payment.Envelope{HeaderKey: pan, HeaderKeySet: true}, field: "Idempotency-Key"},
		{name: "payment method", body: strings.Replace(ok, "pm_card_visa", pan, 1), field: "payment_method"},
		{name: "currency", body: strings.Replace(ok, `"usd"`, `"`+pan+`"`, 1), field: "currency"},
		{name: "merchant id", body: strings.Replace(ok, `"m_1"`, `"`+pan+`"`, 1), field: "merchant_id"},
		{name: "subject's merchant", body: ok, env: payment.Envelope{SubjectMerchant: pan}, field: "subject"},
		// Invalid besides: card_data first, so no other reason's error
		// quotes the number.
		{name: "invalid description too", body: add(`"description":"` + pan + `\u0007"`), field: "description"},
		{name: "unknown field", body: add(`"card":"` + pan + `"`), field: "body"},
		{name: "malformed", body: `{"description":"` + pan + `",`, field: "body"},
		{name: "trailing data", body: ok + ` "` + pan + `"`, field: "body"},
	}
	for i := range cases {
		cases[i].name += " " + pan
		cases[i].newDetector = newDetector
	}
	return cases
}

// checkCardData asserts that Decode refuses c as card_data naming its
// field, with the number nowhere in the error.
func checkCardData(t *testing.T, c cardCase, pan string) {
	t.Helper()
	got, err := payment.Decode([]byte(c.body), c.env, payment.Limits{})
	var ve *payment.ValidationError
	if !errors.As(err, &ve) || ve.Reason != payment.ReasonCardData {
		t.Fatalf("Decode = %+v, %v; want a %s error (new detector needed: %v)", got, err, payment.ReasonCardData, c.newDetector)
	}
	if ve.Field != c.field {
		t.Errorf("field %q, want %q", ve.Field, c.field)
	}
	for _, part := range strings.FieldsFunc(pan, func(r rune) bool { return r == ' ' || r == '-' }) {
		if strings.Contains(err.Error(), part) {
			t.Errorf("the error quotes the card number: %v", err)
		}
	}
	if !payment.IsInputReason(string(ve.Reason)) {
		t.Errorf("%s is not an input reason", ve.Reason)
	}
}

// A card number anywhere a person types is refused as card_data, before
// any other check, and the error names the field, never the number.
// Before the door, each of these decoded (or failed with another reason,
// quoting the number in its error).
func TestCardDataRefused(t *testing.T) {
	t.Parallel()
	for _, pan := range []string{panVisa, panSpaced, panDashed, panAmex} {
		for _, c := range cardCases(pan, false) {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				checkCardData(t, c, pan)
			})
		}
	}
}

// TestCardDataUnicodeDigits is TestCardDataRefused with card numbers in
// fullwidth digits. It needs internal/redact's detector of any Unicode
// digit script (the pan branch): with today's, which counts ASCII digits
// only, every case fails.
func TestCardDataUnicodeDigits(t *testing.T) {
	t.Parallel()
	for _, c := range cardCases(panFullwidth, true) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			checkCardData(t, c, panFullwidth)
		})
	}
}

// What is not a card number passes the door: digits no 13 to 19 of which
// pass the Luhn check, too few digits, a numeric merchant beside a numeric key, dates.
func TestCardDataNotRefused(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{"merchant_id":"1001","idempotency_key":"100000000042","amount":1999,"currency":"usd","payment_method":"pm_card_visa"}`,
		`{"merchant_id":"m_1","idempotency_key":"k","amount":1999,"currency":"usd","payment_method":"pm_card_visa","description":"9999 9999 9999 9999"}`,
		`{"merchant_id":"m_1","idempotency_key":"k","amount":1999,"currency":"usd","payment_method":"pm_card_visa","description":"order 123456789012 on 2026-12-07"}`,
		`{"merchant_id":"m_1","idempotency_key":"550e8400-e29b-41d4-a716-446655440000","amount":1999,"currency":"usd","payment_method":"pm_1MqLiJLkdIwHu7ixUEgbFdYF","metadata":{"order_id":"42"}}`,
	} {
		if _, err := payment.Decode([]byte(body), payment.Envelope{}, payment.Limits{}); err != nil {
			t.Errorf("Decode(%s): %v", body, err)
		}
	}
}
