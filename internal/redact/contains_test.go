package redact

import (
	"strings"
	"testing"
	"unicode"
)

// Issue 54, items 1, 2 and 6: what is and what is not a card number. Each
// "masked" case was shown in full before the definition read every digit
// script and every escape; each "kept" case was masked as a card number.
// The brand cases: a window is a card number only with an issuer's prefix
// and length and from a group's start to a group's end (a number glued to
// other digits, or a group longer than 19, is an id's digits).
func TestContainsPANDefinition(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, in string
		want     bool
	}{
		{"ascii", "4111 1111 1111 1111", true},
		{"fullwidth", "４１１１ １１１１ １１１１ １１１１", true},
		{"fullwidth ideographic space", "４１１１\u3000１１１１\u3000１１１１\u3000１１１１", true},
		{"arabic-indic", "٤١١١ ١١١١ ١١١١ ١١١١", true},
		{"extended arabic-indic", "۴۱۱۱-۱۱۱۱-۱۱۱۱-۱۱۱۱", true},
		{"devanagari", "४१११ ११११ ११११ ११११", true},
		{"bengali", "৪১১১১১১১১১১১১১১১", true},
		{"mathematical bold", "𝟒𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏", true},
		{"mathematical monospace", "𝟺𝟷𝟷𝟷 𝟷𝟷𝟷𝟷 𝟷𝟷𝟷𝟷 𝟷𝟷𝟷𝟷", true},
		{"mixed scripts", "4１١१ 1111 1111 1111", true},
		{"in japanese text", "カード番号４１１１１１１１１１１１１１１１です", true},
		{"nbsp", "4111\u00a01111\u00a01111\u00a01111", true},
		{"dots", "4111.1111.1111.1111", true},
		{"json tab escapes", `4111\t1111\t1111\t1111`, true},
		{"json newline escapes", `4111\n1111\n1111\n1111`, true},
		{"escaped twice", `4111\\t1111\\t1111\\t1111`, true},
		{"all unicode escapes", `\u0034\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031`, true},
		{"escaped fullwidth", `\uff14\uff11\uff11\uff11 1111 1111 1111`, true},
		{"escaped surrogate pairs", `\ud835\udfd2\ud835\udfcf\ud835\udfcf\ud835\udfcf111111111111`, true},
		{"go quoted", `"4111\x001111\u00a01111\U0001d7cf111"`, true},
		{"html references", "&#52;111&nbsp;1111&#x2d;1111 1111", true},
		{"references escaped again", `\u0026#52;111 1111 1111 &amp;#49;111`, true},
		{"reference digits stay one digit", `x\u0026#52;-\u0026#52; &amp;#52;-&#52; 9 9`, false},
		{"json numbers", `[4111, 1111, 1111, 1111]`, true},
		{"digit then letter", "4111111111111111exp1228", true},
		{"snake prefix", "order-4111111111111111", true},
		{"amex", "3782 822463 10005", true},
		{"16 separators", "4111" + strings.Repeat(" ", 16) + "1111 1111 1111", true},
		{"17 separators", "4111" + strings.Repeat(" ", 17) + "1111 1111 1111", false},
		{"not luhn", "4111 1111 1111 1113", false},
		{"12 digits", "4111 1111 1111", false},
		{"letter between", "4111 1111 x 1111 1111", false},
		{"cyrillic letter between", "4111 1111 ж 1111 1111", false},
		{"rfc3339 nano", "2026-12-07T14:41:56.123456788Z", false},
		{"date alone", "Order #4412 2024-01-15 12:00 $19.99", false},
		{"mastercard", "5555 5555 5555 4444", true},
		{"mastercard 2-series", "2223003122003222", true},
		{"discover", "6011111111111117", true},
		{"discover 19", "6011 1111 1111 1111 110", true},
		{"jcb", "3530111333300000", true},
		{"diners", "3056 930902 5904", true},
		{"unionpay", "6200000000000005", true},
		{"maestro 13", "6759 6498 2643 0", true},
		{"visa 13", "4222222222222", true},
		{"visa 15 is no visa", "411111111111116", false},
		{"amex 16 is no amex", "3782822463100052", false},
		{"uatp", "1354 1234 5678 911", false},
		{"no brand", "7992 7398 7130 0008", false},
		{"glued to other digits", "99994111111111111111", false},
		{"then other digits", "4111111111111111 1234", true},
		{"group longer than 19", "41111111111111111115", false},
		{"time.Time string", "2026-12-07 12:34:56.123456782 +0000 UTC", false},
		{"time of day", "at 12:34:56.123456782", false},
		{"json time", `{"time":"2026-12-07T12:34:56.123456783Z","seq":42}`, false},
		{"uuid", "41111111-1111-1111-1111-111111111111", false},
		{"stripe ids", "pi_3Mt4111111111111111Pa ch_3Mt4111111111111111Pa pm_1N4111111111111111Z", false},
		{"underscore prefix", "m_4111111111111111", true},
		{"sequence after letters", "seq4111111111111111", false},
		{"base64", "NDExMTExMTExMTExMTExMQ==", false},
		{"words", "four one one one ...", false},
	} {
		if got := ContainsPAN(c.in); got != c.want {
			t.Errorf("%s: ContainsPAN(%q) = %v, want %v (PANs: %q)", c.name, c.in, got, c.want, PANs(c.in))
		}
		if got := PANs(c.in) != c.in; got != c.want {
			t.Errorf("%s: PANs(%q) = %q", c.name, c.in, PANs(c.in))
		}
	}
}

// The kept cases hold Luhn-valid windows in the digits alone: they are
// kept because of their shape, not by luck.
func TestShapesHoldLuhnWindows(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"2026-12-07T14:41:56.123456788Z", "41111111-1111-1111-1111-111111111111", "pi_3Mt4111111111111111Pa"} {
		if !ContainsPAN(strings.Map(func(r rune) rune {
			if r >= '0' && r <= '9' {
				return r
			}
			return ' '
		}, s)) {
			t.Errorf("%q: its digits alone hold no card number; pick another example", s)
		}
	}
}

// FindPAN names where the number is without quoting it.
func TestFindPAN(t *testing.T) {
	t.Parallel()
	s := `{"description":"pay ４１１１ １１１１ １１１１ １１１１ now"}`
	start, end, ok := FindPAN(s)
	if !ok || s[start:end] != "４１１１ １１１１ １１１１ １１１１" {
		t.Fatalf("FindPAN(%q) = %d, %d, %v", s, start, end, ok)
	}
	if _, _, ok := FindPAN("order 42"); ok {
		t.Fatal("FindPAN found a card number in order 42")
	}
}

// digitValue relies on every range of unicode.Nd being whole scripts of
// ten digits, zero first: checked here for the Unicode version Go ships.
func TestDigitValueEveryScript(t *testing.T) {
	t.Parallel()
	n := 0
	check := func(lo, hi, stride uint32) {
		if stride != 1 || (hi-lo+1)%10 != 0 {
			t.Errorf("unicode.Nd range %U-%U (stride %d) is not whole scripts of ten", lo, hi, stride)
		}
		for r := lo; r <= hi; r++ {
			got, ok := digitValue(rune(r))
			want, _ := refDigit(rune(r))
			if !ok || got != want {
				t.Errorf("digitValue(%U) = %d, %v, want %d", r, got, ok, want)
			}
			n++
		}
	}
	for _, r := range unicode.Nd.R16 {
		check(uint32(r.Lo), uint32(r.Hi), uint32(r.Stride))
	}
	for _, r := range unicode.Nd.R32 {
		check(r.Lo, r.Hi, r.Stride)
	}
	for _, r := range []rune{'a', '²', '①', 'Ⅳ', 0x10ffff, -1} {
		if _, ok := digitValue(r); ok {
			t.Errorf("digitValue(%U) is a digit", r)
		}
	}
	t.Logf("%d decimal digits in %d scripts", n, n/10)
}

// Issue 54, item 3: a cut never leaves a card number's first 15 digits,
// nor any digits of a masked one.
func TestCutMasksBeforeCutting(t *testing.T) {
	t.Parallel()
	const pan = "4111111111111111"
	for _, c := range []struct {
		in   string
		n    int
		want string
		cut  bool
	}{
		{strings.Repeat("-", 49) + pan, 64, strings.Repeat("-", 49), true},                      // 15 digits fit: all go
		{strings.Repeat("-", 10) + pan + " tail", 30, strings.Repeat("-", 10), true},            // the cut falls inside the mask
		{"error: " + pan + " more", 100, "error: " + PANMask + " more", false},                  // no cut, masked
		{"x " + pan + strings.Repeat("y", 100), 2 + len(PANMask), "x " + PANMask, true},         // the whole mask fits
		{"id 41111111-1111-1111-1111-111111111111", 33, "id " + PANMask + "-1111-111111", true}, // a UUID cut is no UUID
		{"４１１１ １１１１ １１１１ １１１１ x", 20, "", true},
		{"short", 64, "short", false},
	} {
		got, cut := Cut(c.in, c.n)
		if got != c.want || cut != c.cut {
			t.Errorf("Cut(%q, %d) = %q, %v, want %q, %v", c.in, c.n, got, cut, c.want, c.cut)
		}
		if ContainsPAN(got) || strings.Contains(got, "41111111111") {
			t.Errorf("Cut(%q, %d) = %q keeps a card number's digits", c.in, c.n, got)
		}
	}
}

// BenchmarkContainsPAN measures the door's check on a typical command
// body (ASCII, a UUID key, an order number), on one with a Japanese
// description (the filter cannot reject non-ASCII text, so it is scanned),
// and on a body that holds a fullwidth card number.
func BenchmarkContainsPAN(b *testing.B) {
	for _, c := range []struct{ name, s string }{
		{"ascii", `{"merchant_id":"m_1","idempotency_key":"550e8400-e29b-41d4-a716-446655440000","amount":1999,"currency":"usd","payment_method":"pm_card_visa","description":"order 12345","metadata":{"order_id":"A-1001"}}`},
		{"japanese", `{"merchant_id":"m_1","idempotency_key":"550e8400-e29b-41d4-a716-446655440000","amount":1999,"currency":"jpy","payment_method":"pm_card_visa","description":"ご注文番号１２３４５、配送は２０２６年１２月７日です"}`},
		{"fullwidth-pan", `{"merchant_id":"m_1","idempotency_key":"k","amount":1999,"currency":"jpy","payment_method":"pm_card_visa","description":"カード４１１１ １１１１ １１１１ １１１１"}`},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.s)))
			b.ReportAllocs()
			for b.Loop() {
				ContainsPAN(c.s)
			}
		})
	}
}
