package redact

import (
	"bytes"
	"encoding/json"
	"strings"
)

// Body masks the card numbers of a message body. It reads the raw bytes
// with escapes decoded (PANs), not a parsed value, so a body that is not
// one JSON value (trailing data, a cut body, a member given twice, whose
// first copy a decoder drops) is masked as well as a valid one: an escaped
// separator ("4111\t1111..."), escaped digits ("\u0034111...") and a number
// split across JSON numbers are all read as one card number. Each masked
// stretch becomes PANMask, which holds no quote or backslash, so a JSON
// string stays a JSON string; a body without a card number comes back
// byte for byte, and so do invalid UTF-8 and every other byte outside a
// masked stretch.
func Body(b []byte) []byte {
	s := string(b)
	if !mayHoldPAN(s) {
		return b
	}
	if m := PANs(s); m != s {
		return []byte(m)
	}
	return b
}

// Redacted replaces the value of a card member in a shown body.
const Redacted = "[redacted]"

// MaxShownBody is how much of a body ShownBody shows.
const MaxShownBody = 64 << 10

// cardMembers are the JSON members whose value is card data (Stripe's
// names) or personal data that comes with it.
var cardMembers = map[string]bool{
	"card": true, "card_number": true, "cvc": true, "cvv": true, "exp_month": true, "exp_year": true,
	"last4": true, "dynamic_last4": true, "fingerprint": true, "iin": true, "payment_method_details": true,
	"billing_details": true,
}

// ShownBody is a body (a dead letter's, a stored provider answer) as every
// output of paydedup shows it to a person: the one policy for card data in
// a body. A payment command carries only a payment method token, but a
// dead letter is whatever a publisher sent and a provider's answer may hold
// a payment method object with a card's last four digits, expiry and
// fingerprint. Its raw bytes are masked first (Body), then cut to
// MaxShownBody, never inside a card number; JSON then has its card members
// (cardMembers, any case) replaced by Redacted and an expanded
// payment_method object shrunk to its id, and is indented without HTML
// escapes; the result is masked again (indenting can bring a number's
// digits closer) and made printable (Shown). A body that is not JSON is
// shown as text.
func ShownBody(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	b = Body(b)
	if len(b) > MaxShownBody {
		s, _ := Cut(string(b), MaxShownBody)
		b = []byte(s)
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&v); err == nil && !dec.More() {
		var out bytes.Buffer
		enc := json.NewEncoder(&out)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		if err := enc.Encode(maskJSON(v)); err == nil {
			return Shown(strings.TrimSuffix(out.String(), "\n"), true)
		}
	}
	return Shown(string(b), true)
}

// maskJSON is v with its card members replaced and every string (member
// names included) masked.
func maskJSON(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, val := range x {
			switch {
			case cardMembers[strings.ToLower(k)]:
				val = Redacted
			case k == "payment_method":
				// A token stays; an expanded object shrinks to its id.
				if obj, ok := val.(map[string]any); ok {
					val = maskJSON(obj["id"])
				} else {
					val = maskJSON(val)
				}
			default:
				val = maskJSON(val)
			}
			out[PANs(k)] = val
		}
		return out
	case string:
		return PANs(x)
	case []any:
		for i := range x {
			x[i] = maskJSON(x[i])
		}
		return x
	}
	return v
}
