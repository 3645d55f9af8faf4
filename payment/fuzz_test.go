package payment_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/paydedup/paydedup/payment"
)

// maxErrLen bounds a validation error's text: it goes into logs and the
// dead letter's Dlq-Error header, and hostile input must not inflate it.
const maxErrLen = 512

// FuzzDecode feeds Decode arbitrary bodies and envelopes. Properties:
//   - it never panics, and every rejection is a *ValidationError whose
//     reason is a listed input reason, with a short, valid UTF-8 message;
//   - an accepted command passes Validate, agrees with its envelope, and
//     survives a re-encode: decode → json.Marshal → decode gives the same
//     canonical bytes (so the same fingerprint).
//
// Seeds: testdata/fuzz/FuzzDecode plus the cases below.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(good), "", false, "m_123")
	f.Add([]byte(good), "550e8400-e29b-41d4-a716-446655440000", true, "")
	f.Add([]byte(`{"merchant_id":"m","amount":1,"currency":"usd","payment_method":"pm"}`), "hdr", true, "m")
	f.Add([]byte(`{"merchant_id":"m","idempotency_key":"k","amount":1e2,"currency":"usd","payment_method":"pm"}`), "", false, "")
	f.Add([]byte(`{"merchant_id":"m","idempotency_key":"k","amount":1,"amount":2}`), "", false, "")
	f.Add([]byte(`{"metadata":{"a":{"b":[1]}}}`), "", false, "")
	f.Add([]byte("{\"merchant_id\":\"m\",\"idempotency_key\":\"k\\u0000\",\"amount\":1,\"currency\":\"usd\",\"payment_method\":\"pm\"}"), "k\x00", true, "m")
	f.Add([]byte(`{"amount":123456789012345678901234567890}`), "", false, "")
	f.Add([]byte("\xff\xfe"), "", false, "")
	f.Add([]byte(`[[[[[[[[[[]]]]]]]]]]`), "", false, "")
	f.Add([]byte(`{"merchant_id":"m","idempotency_key":"k","amount":1,"AMOUNT":99999,"currency":"usd","payment_method":"pm"}`), "", false, "")
	f.Add([]byte(`{"merchant_id":"m","idempotency_\u212aey":"k","amount":1,"currency":"usd","payment_method":"pm"}`), "", false, "")
	f.Add([]byte(`{"merchant_id":"m","idempotency_key":"k","amount":1,"currency":"usd","payment_method":"pm","description":"\u00e9\ud83d\ude00","metadata":{"\u00e9":"\u2028"}}`), "", false, "m")
	f.Fuzz(func(t *testing.T, body []byte, headerKey string, headerSet bool, subject string) {
		env := payment.Envelope{SubjectMerchant: subject, HeaderKey: headerKey, HeaderKeySet: headerSet}
		c, err := payment.Decode(body, env, payment.Limits{})
		if err != nil {
			var ve *payment.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error %T %v is not a *ValidationError", err, err)
			}
			if !payment.IsInputReason(string(ve.Reason)) {
				t.Fatalf("reason %q is not an input reason", ve.Reason)
			}
			if msg := err.Error(); !utf8.ValidString(msg) || len(msg) > maxErrLen {
				t.Fatalf("error message is %d bytes (valid UTF-8: %v): %.200q", len(msg), utf8.ValidString(msg), msg)
			}
			return
		}
		if c == nil {
			t.Fatal("nil command without an error")
		}
		if err := c.Validate(payment.Limits{}); err != nil {
			t.Fatalf("accepted command fails Validate: %v", err)
		}
		// Every top-level name is exactly a field's name: a case-folded
		// "AMOUNT" would mean another amount to a case-sensitive parser.
		var top map[string]json.RawMessage
		if err := json.Unmarshal(body, &top); err != nil {
			t.Fatalf("accepted a body that is not one object: %v", err)
		}
		for k := range top {
			if !slices.Contains([]string{"merchant_id", "idempotency_key", "amount", "currency", "payment_method", "description", "metadata"}, k) {
				t.Fatalf("accepted the field name %q", k)
			}
		}
		if subject != "" && subject != c.MerchantID {
			t.Fatalf("accepted merchant %q on subject merchant %q", c.MerchantID, subject)
		}
		if headerSet && headerKey != c.IdempotencyKey {
			t.Fatalf("accepted key %q with header key %q", c.IdempotencyKey, headerKey)
		}
		again, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		c2, err := payment.Decode(again, payment.Envelope{SubjectMerchant: c.MerchantID}, payment.Limits{MaxBodyBytes: 1 << 20})
		if err != nil {
			t.Fatalf("re-encoded command %s rejected: %v", again, err)
		}
		if !bytes.Equal(c.AppendCanonical(nil), c2.AppendCanonical(nil)) {
			t.Fatalf("canonical bytes changed across a re-encode:\n%q\n%q", c.AppendCanonical(nil), c2.AppendCanonical(nil))
		}
	})
}

// FuzzDecodeMetadata builds commands whose metadata and description come
// from the fuzzer (any keys and values, any count) and checks that Decode
// either rejects them with a metadata or description reason or accepts
// exactly what was sent.
func FuzzDecodeMetadata(f *testing.F) {
	f.Add("order_id", "42", 1, "desc")
	f.Add("", "v", 1, "")
	f.Add(strings.Repeat("k", 41), "v", 1, "")
	f.Add("k", strings.Repeat("v", 501), 1, "")
	f.Add("k", "v", 51, "")
	f.Add("a[b]", "v", 1, "")
	f.Add("k\x00", "v\x07", 1, "\x1b[31m")
	f.Add("merchant_id", "x", 1, "")
	f.Fuzz(func(t *testing.T, key, value string, n int, desc string) {
		if n < 0 || n > 80 {
			return
		}
		meta := map[string]string{}
		for i := range n {
			k := key
			if i > 0 {
				k = key + strings.Repeat("_", i)
			}
			meta[k] = value
		}
		in := payment.Command{MerchantID: "m_1", IdempotencyKey: "k-1", Amount: 100, Currency: "usd",
			PaymentMethod: "pm_card_visa", Description: desc, Metadata: meta}
		body, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		c, err := payment.Decode(body, payment.Envelope{}, payment.Limits{MaxBodyBytes: 1 << 20})
		if err != nil {
			var ve *payment.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error %v is not a *ValidationError", err)
			}
			// json.Marshal replaces invalid UTF-8 with U+FFFD, so only the
			// metadata and description can be at fault, or their size.
			if ve.Reason != payment.ReasonInvalidMetadata && ve.Reason != payment.ReasonInvalidDesc &&
				ve.Reason != payment.ReasonBodyTooLarge {
				t.Fatalf("reason %s (%v) for metadata/description input", ve.Reason, err)
			}
			return
		}
		want := in
		want.Description = viaJSON(t, desc)
		want.Metadata = map[string]string{}
		for k, v := range meta {
			want.Metadata[viaJSON(t, k)] = viaJSON(t, v)
		}
		if !bytes.Equal(c.AppendCanonical(nil), want.AppendCanonical(nil)) {
			t.Fatalf("decoded %+v, sent %+v", c, want)
		}
		if len(c.Metadata) > payment.MaxMetadataEntries {
			t.Fatalf("accepted %d metadata entries", len(c.Metadata))
		}
	})
}

// viaJSON is s as it comes back from a JSON round trip: encoding/json
// replaces each invalid UTF-8 byte with U+FFFD.
func viaJSON(t *testing.T, s string) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var out string
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}
