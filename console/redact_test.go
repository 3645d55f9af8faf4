package console_test

import (
	"strings"
	"testing"

	"github.com/paydedup/paydedup/console"
	"github.com/paydedup/paydedup/internal/redact"
)

// A card number beside other digits, joined by any separator, is still
// masked; the digits beside it stay readable when they are not part of a
// Luhn-valid window; ordinary text is left alone.
func TestRedactMasksCardNumbersJoinedToOtherDigits(t *testing.T) {
	t.Parallel()
	const m = "[card number redacted]"
	for _, c := range []struct{ in, want string }{
		// The bypasses: 1-3 digits beside a PAN, joined by a space or dash.
		// A window starts and ends at a group's edge and has a brand's
		// prefix and length, so the digits beside it stay.
		{"4111111111111111 12/28", m + " 12/28"},
		{"order 12 4111111111111111", "order 12 " + m},
		{"4111111111111111 123", m + " 123"},
		{"378282246310005 1", m + " 1"},
		{"exp 12-4111111111111111", "exp 12-" + m},
		{"ref 12 4111111111111111 exp 12/28", "ref 12 " + m + " exp 12/28"},
		{"4111111111111111, cvc 123", m + ", cvc 123"},
		// Separators the old code did not join.
		{"4111.1111.1111.1111", m},
		{"4111_1111_1111_1111", m},
		{"4111  1111  1111  1111", m},
		{"4111\t1111\t1111\t1111", m},
		{"4111 / 1111 / 1111 / 1111", m},
		{"(4111)1111-1111,1111.", "(" + m + "."},
		{"payments.requests.4111111111111111", "payments.requests." + m},
		{"5555555555554444,4000056655665556", m + "," + m},
		{"pan=4111111111111111&pan=5555555555554444", "pan=" + m + "&pan=" + m},
		// A Luhn-valid 15-digit window inside a group is no card number.
		{"4242 4242 4242 4241", "4242 4242 4242 4241"},
		// Ordinary text survives.
		{"pm_card_visa", "pm_card_visa"},
		{"order 123456789012", "order 123456789012"},
		{"2026-12-02T04:05:06Z", "2026-12-02T04:05:06Z"},
		{"2026-12-02 04:05:06", "2026-12-02 04:05:06"},
		{"order 1234, 2026-12-05, amount 1999 usd, 12/28", "order 1234, 2026-12-05, amount 1999 usd, 12/28"},
		{"x4111111111111111y", "x4111111111111111y"},     // an identifier, as a stream sequence after letters (issue 54, item 6)
		{"99994111111111111111", "99994111111111111111"}, // glued to other digits: an id
	} {
		if got := console.Redact(c.in); got != c.want {
			t.Errorf("Redact(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	// A card number in a JSON string with an escaped separator, and split
	// across JSON numbers, is masked in the shown body too.
	for _, body := range []string{
		`{"description":"card 4111<1111<1111<1111","metadata":{"n":"4111\t1111\t1111\t1111"}}`,
		`{"metadata":{"a":"4111111111111111 12/28"},"x":[4111,1111,1111,1111]}`,
	} {
		got := redact.ShownBody([]byte(body))
		if strings.Contains(got, "1111") {
			t.Errorf("ShownBody(%s) shows a card number:\n%s", body, got)
		}
	}
}
