package payment_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/payment"
)

const good = `{"merchant_id":"m_123","idempotency_key":"550e8400-e29b-41d4-a716-446655440000",` +
	`"amount":1999,"currency":"usd","payment_method":"pm_card_visa","description":"order 42","metadata":{"order_id":"42"}}`

func TestDecodeGood(t *testing.T) {
	t.Parallel()
	c, err := payment.Decode([]byte(good), payment.Envelope{SubjectMerchant: "m_123"}, payment.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if c.MerchantID != "m_123" || c.Amount != 1999 || c.Metadata["order_id"] != "42" {
		t.Fatalf("decoded %+v", c)
	}
	// The key may come from the header alone.
	noKey := strings.Replace(good, `"idempotency_key":"550e8400-e29b-41d4-a716-446655440000",`, "", 1)
	c, err = payment.Decode([]byte(noKey), payment.Envelope{HeaderKey: "hdr-1", HeaderKeySet: true}, payment.Limits{})
	if err != nil || c.IdempotencyKey != "hdr-1" {
		t.Fatalf("header key: %+v %v", c, err)
	}
	// Header and body agreeing is fine.
	if _, err := payment.Decode([]byte(good), payment.Envelope{HeaderKey: "550e8400-e29b-41d4-a716-446655440000", HeaderKeySet: true}, payment.Limits{}); err != nil {
		t.Fatal(err)
	}
}

func TestDecodeRejects(t *testing.T) {
	t.Parallel()
	repl := func(old, new string) string {
		s := strings.Replace(good, old, new, 1)
		if s == good {
			t.Fatalf("replacement %q did not apply", old)
		}
		return s
	}
	longKey := strings.Repeat("k", 256)
	manyMeta := `{` + strings.TrimSuffix(strings.Repeat(`"k":"v",`, 1), ",")
	for i := range 51 {
		manyMeta += `,"k` + string(rune('a'+i%26)) + string(rune('a'+i/26)) + `":"v"`
	}
	manyMeta += `}`
	cases := []struct {
		name string
		body string
		env  payment.Envelope
		lim  payment.Limits
		want payment.Reason
	}{
		{"too large", good, payment.Envelope{}, payment.Limits{MaxBodyBytes: 50}, payment.ReasonBodyTooLarge},
		{"invalid utf-8", repl("order 42", "order \xff"), payment.Envelope{}, payment.Limits{}, payment.ReasonInvalidEncoding},
		{"not json", `{"merchant_id":`, payment.Envelope{}, payment.Limits{}, payment.ReasonMalformedJSON},
		{"array", `[1,2]`, payment.Envelope{}, payment.Limits{}, payment.ReasonMalformedJSON},
		{"trailing data", good + `{}`, payment.Envelope{}, payment.Limits{}, payment.ReasonMalformedJSON},
		{"deep nesting", repl(`"order_id":"42"`, `"x":{"y":{"z":1}}`), payment.Envelope{}, payment.Limits{}, payment.ReasonMalformedJSON},
		{"very deep nesting", strings.Repeat("[", 100000) + strings.Repeat("]", 100000), payment.Envelope{}, payment.Limits{MaxBodyBytes: 1 << 20}, payment.ReasonMalformedJSON},
		{"unknown field", repl(`"amount"`, `"amt":1,"amount"`), payment.Envelope{}, payment.Limits{}, payment.ReasonUnknownField},
		{"duplicate field", repl(`"amount":1999`, `"amount":1,"amount":1999`), payment.Envelope{}, payment.Limits{}, payment.ReasonDuplicateField},
		{"duplicate metadata key", repl(`"order_id":"42"`, `"a":"1","a":"2"`), payment.Envelope{}, payment.Limits{}, payment.ReasonDuplicateField},
		{"missing key", repl(`"idempotency_key":"550e8400-e29b-41d4-a716-446655440000",`, ""), payment.Envelope{}, payment.Limits{}, payment.ReasonMissingKey},
		{"empty key", repl(`"550e8400-e29b-41d4-a716-446655440000"`, `""`), payment.Envelope{}, payment.Limits{}, payment.ReasonMissingKey},
		{"long key", repl(`"550e8400-e29b-41d4-a716-446655440000"`, `"`+longKey+`"`), payment.Envelope{}, payment.Limits{}, payment.ReasonInvalidKey},
		{"NUL in key", repl(`"550e8400`, `"550e\u0000`), payment.Envelope{}, payment.Limits{}, payment.ReasonInvalidKey},
		{"non-ascii key", repl(`"550e8400`, `"550é`), payment.Envelope{}, payment.Limits{}, payment.ReasonInvalidKey},
		{"key as number", repl(`"550e8400-e29b-41d4-a716-446655440000"`, `12`), payment.Envelope{}, payment.Limits{}, payment.ReasonInvalidKey},
		{"header/body keys differ", good, payment.Envelope{HeaderKey: "other", HeaderKeySet: true}, payment.Limits{}, payment.ReasonKeyMismatch},
		{"empty merchant", repl(`"m_123"`, `""`), payment.Envelope{}, payment.Limits{}, payment.ReasonInvalidMerchant},
		{"merchant with dot", repl(`"m_123"`, `"m.123"`), payment.Envelope{}, payment.Limits{}, payment.ReasonInvalidMerchant},
		{"subject merchant differs", good, payment.Envelope{SubjectMerchant: "m_999"}, payment.Limits{}, payment.ReasonMerchantMismatch},
		{"zero amount", repl(`1999`, `0`), payment.Envelope{}, payment.Limits{}, payment.ReasonInvalidAmount},
		{"negative amount", repl(`1999`, `-5`), payment.Envelope{}, payment.Limits{}, payment.ReasonInvalidAmount},
		{"fractional amount", repl(`1999`, `19.99`), payment.Envelope{}, payment.Limits{}, payment.ReasonInvalidAmount},
		{"huge amount", repl(`1999`, `123456789012345678901234567890`), payment.Envelope{}, payment.Limits{}, payment.ReasonInvalidAmount},
		{"amount as string", repl(`1999`, `"1999"`), payment.Envelope{}, payment.Limits{}, payment.ReasonInvalidAmount},
		{"amount over limit", good, payment.Envelope{}, payment.Limits{MaxAmount: 1000}, payment.ReasonAmountOverLimit},
		{"upper-case currency", repl(`"usd"`, `"USD"`), payment.Envelope{}, payment.Limits{}, payment.ReasonInvalidCurrency},
		{"unknown currency", repl(`"usd"`, `"xyz"`), payment.Envelope{}, payment.Limits{}, payment.ReasonInvalidCurrency},
		{"missing payment method", repl(`"payment_method":"pm_card_visa",`, ""), payment.Envelope{}, payment.Limits{}, payment.ReasonInvalidMethod},
		{"control char in description", repl("order 42", `order\u0007`), payment.Envelope{}, payment.Limits{}, payment.ReasonInvalidDesc},
		{"too many metadata entries", repl(`{"order_id":"42"}`, manyMeta), payment.Envelope{}, payment.Limits{}, payment.ReasonInvalidMetadata},
		{"long metadata value", repl(`"42"`, `"`+strings.Repeat("v", 501)+`"`), payment.Envelope{}, payment.Limits{}, payment.ReasonInvalidMetadata},
		{"reserved metadata key", repl(`"order_id"`, `"idempotency_key"`), payment.Envelope{}, payment.Limits{}, payment.ReasonInvalidMetadata},
		{"metadata not strings", repl(`"42"`, `42`), payment.Envelope{}, payment.Limits{}, payment.ReasonInvalidMetadata},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := payment.Decode([]byte(tc.body), tc.env, tc.lim)
			var ve *payment.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error %v, want a ValidationError", err)
			}
			if ve.Reason != tc.want {
				t.Fatalf("reason %s (%v), want %s", ve.Reason, err, tc.want)
			}
			if !payment.IsInputReason(string(ve.Reason)) {
				t.Fatalf("reason %s is not listed in InputReasons", ve.Reason)
			}
		})
	}
}

func TestValidateRejectsInvalidUTF8(t *testing.T) {
	t.Parallel()
	base := payment.Command{MerchantID: "m_1", IdempotencyKey: "k", Amount: 1, Currency: "usd", PaymentMethod: "pm_card_visa"}
	cases := map[string]func(c *payment.Command){
		"description":    func(c *payment.Command) { c.Description = "bad \xff" },
		"metadata key":   func(c *payment.Command) { c.Metadata = map[string]string{"k\xfe": "v"} },
		"metadata value": func(c *payment.Command) { c.Metadata = map[string]string{"k": "v\xc3"} },
	}
	for name, mutate := range cases {
		c := base
		mutate(&c)
		if err := c.Validate(payment.Limits{}); err == nil {
			t.Errorf("%s with invalid UTF-8 accepted: a command built in Go would fingerprint differently after a JSON round trip", name)
		}
	}
}

// TestDecodeAsSent: a refused body is read as far as it decodes (an
// invalid amount or currency, a missing method: the fields as sent), and
// not at all when it is no command object (malformed, trailing garbage
// before the end, a wrong type, too large).
func TestDecodeAsSent(t *testing.T) {
	t.Parallel()
	lim := payment.Limits{MaxBodyBytes: 512}
	c := payment.DecodeAsSent([]byte(`{"merchant_id":"m_1","idempotency_key":"k1","amount":-5,"currency":"US Dollars"}`), lim)
	if c == nil || c.IdempotencyKey != "k1" || c.Amount != -5 || c.Currency != "US Dollars" || c.MerchantID != "m_1" {
		t.Fatalf("invalid command read as %+v, want its fields as sent", c)
	}
	for name, body := range map[string]string{
		"malformed":  `{"idempotency_key":"k1",`,
		"wrong type": `{"idempotency_key":"k1","amount":"5"}`,
		"an array":   `["k1"]`,
		"too large":  `{"idempotency_key":"` + strings.Repeat("k", 600) + `"}`,
	} {
		if c := payment.DecodeAsSent([]byte(body), lim); c != nil {
			t.Errorf("%s: read as %+v, want nothing", name, c)
		}
	}
}
