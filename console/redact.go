package console

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"
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
	redactedPAN     = "[card number redacted]"
	minPANDigits    = 13
	maxPANDigits    = 19
	maxShownBodyLen = 64 << 10
)

// cardKeys are the JSON members whose value is card data (Stripe's names)
// or personal data that comes with it.
var cardKeys = map[string]bool{
	"card": true, "card_number": true, "cvc": true, "cvv": true, "exp_month": true, "exp_year": true,
	"last4": true, "dynamic_last4": true, "fingerprint": true, "iin": true, "payment_method_details": true,
	"billing_details": true,
}

// RedactBody returns a body for display: JSON with card members replaced
// and indented, then Redact. A body that is not JSON is only Redact-ed.
func RedactBody(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if len(b) > maxShownBodyLen {
		b = b[:maxShownBodyLen]
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&v); err == nil && !dec.More() {
		if out, err := json.MarshalIndent(redactValue(v), "", "  "); err == nil {
			return Redact(string(out))
		}
	}
	return Redact(strings.ToValidUTF8(string(b), string(utf8.RuneError)))
}

func redactValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			switch {
			case cardKeys[strings.ToLower(k)]:
				x[k] = redacted
			case k == "payment_method":
				// A token stays; an expanded object shrinks to its id.
				if obj, ok := val.(map[string]any); ok {
					x[k] = obj["id"]
				}
			default:
				x[k] = redactValue(val)
			}
		}
		return x
	case []any:
		for i := range x {
			x[i] = redactValue(x[i])
		}
		return x
	}
	return v
}

// Redact masks every run of 13 to 19 digits (spaces or dashes between them
// allowed) that passes the Luhn check, as a card number would.
func Redact(s string) string {
	var out strings.Builder
	for i := 0; i < len(s); {
		if !isDigit(s[i]) {
			out.WriteByte(s[i])
			i++
			continue
		}
		// The longest run of digits and single separators from i.
		end, digits := i, []byte{}
		for j := i; j < len(s); j++ {
			switch {
			case isDigit(s[j]):
				digits = append(digits, s[j])
				end = j + 1
			case (s[j] == ' ' || s[j] == '-') && j+1 < len(s) && isDigit(s[j+1]) && j > i && isDigit(s[j-1]):
				continue
			default:
				j = len(s)
			}
		}
		run := s[i:end]
		if containsPAN(digits) {
			out.WriteString(redactedPAN)
		} else {
			out.WriteString(run)
		}
		i = end
	}
	return out.String()
}

// containsPAN reports whether digits may be a card number: 13..19 digits
// that pass Luhn, or a longer run with such a window (a card number glued
// to other digits).
func containsPAN(digits []byte) bool {
	switch {
	case len(digits) < minPANDigits:
		return false
	case len(digits) <= maxPANDigits:
		return luhn(digits)
	}
	for n := minPANDigits; n <= min(maxPANDigits, len(digits)); n++ {
		for start := 0; start+n <= len(digits); start++ {
			if luhn(digits[start : start+n]) {
				return true
			}
		}
	}
	return false
}

func luhn(d []byte) bool {
	sum := 0
	for i := len(d) - 1; i >= 0; i-- {
		n := int(d[i] - '0')
		if (len(d)-1-i)%2 == 1 {
			n *= 2
			if n > 9 {
				n -= 9
			}
		}
		sum += n
	}
	return sum%10 == 0
}

func isDigit(b byte) bool { return b >= '0' && b <= '9' }
