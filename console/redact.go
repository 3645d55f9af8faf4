package console

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/paydedup/paydedup/internal/redact"
)

// Card data never reaches a page. A payment command carries only a payment
// method token (payment_method: "pm_..."), but a dead letter is whatever a
// publisher sent (a card number in the metadata, in a malformed body), and
// a stored provider answer may hold a payment method object with a card's
// last four digits, expiry and fingerprint. So every text shown from a
// message or an answer goes through Redact, and every JSON body through
// RedactBody first.

const (
	redacted        = "[redacted]"
	maxShownBodyLen = 64 << 10
)

// cardKeys are the JSON members whose value is card data (Stripe's names)
// or personal data that comes with it.
var cardKeys = map[string]bool{
	"card": true, "card_number": true, "cvc": true, "cvv": true, "exp_month": true, "exp_year": true,
	"last4": true, "dynamic_last4": true, "fingerprint": true, "iin": true, "payment_method_details": true,
	"billing_details": true,
}

// RedactBody returns a body for display. Its raw bytes are masked first
// (redact.Body: escapes decoded, whether or not the body is one JSON
// value), then cut to maxShownBodyLen, never inside a card number; JSON
// then has its card members replaced and is indented without HTML escapes,
// and the result is masked again (indenting can bring a number's digits
// closer). A body that is not JSON is shown as text. Control bytes and
// invalid UTF-8 come out escaped (\x1b, \xff), as dlq show prints them.
func RedactBody(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	b = redact.Body(b)
	if len(b) > maxShownBodyLen {
		s, _ := redact.Cut(string(b), maxShownBodyLen)
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
		if err := enc.Encode(redactValue(v)); err == nil {
			return redact.Shown(strings.TrimSuffix(out.String(), "\n"), true)
		}
	}
	return redact.Shown(string(b), true)
}

func redactValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, val := range x {
			switch {
			case cardKeys[strings.ToLower(k)]:
				val = redacted
			case k == "payment_method":
				// A token stays; an expanded object shrinks to its id.
				if obj, ok := val.(map[string]any); ok {
					val = redactValue(obj["id"])
				} else {
					val = redactValue(val)
				}
			default:
				val = redactValue(val)
			}
			out[Redact(k)] = val
		}
		return out
	case string:
		return Redact(x)
	case []any:
		for i := range x {
			x[i] = redactValue(x[i])
		}
		return x
	}
	return v
}

// Redact masks every card number in s (redact.PANs): every window of 13
// to 19 digits of a run of digits joined by anything but letters, from a
// group's start to a group's end, with a card brand's prefix and length
// and passing Luhn.
func Redact(s string) string { return redact.PANs(s) }

// shown is a one-line field from a message or an answer as a page shows
// it: card numbers masked, control bytes escaped as dlq show does.
func shown(s string) string { return redact.Shown(s, false) }
