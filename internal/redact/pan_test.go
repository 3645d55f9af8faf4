package redact

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
)

// refLuhn is the Luhn check as the standard states it, over digit values.
func refLuhn(d []int) bool {
	sum := 0
	for i := range d {
		n := d[len(d)-1-i]
		if i%2 == 1 {
			n *= 2
			if n > 9 {
				n -= 9
			}
		}
		sum += n
	}
	return sum%10 == 0
}

// refDigit is a digit's value found without unicode.Nd's ranges: its
// distance from the first of the consecutive digits it is among, modulo
// ten (every script's digits are ten consecutive code points, zero first).
func refDigit(r rune) (int, bool) {
	if !unicode.Is(unicode.Nd, r) {
		return 0, false
	}
	k := 0
	for unicode.Is(unicode.Nd, r-rune(k)-1) {
		k++
	}
	return k % 10, true
}

type refUnit struct {
	r          rune
	start, end int
}

// refBrands are the issuer ranges and lengths of the definition, as the
// card brands publish them: a prefix from lo to hi (as many digits as lo
// has) and the lengths allowed.
var refBrands = []struct {
	lo, hi   int
	min, max int
	only     []int
}{
	{4, 4, 0, 0, []int{13, 16, 19}}, // Visa
	{51, 55, 16, 16, nil},           // Mastercard
	{2221, 2720, 16, 16, nil},       // Mastercard 2-series
	{34, 34, 15, 15, nil},           // American Express
	{37, 37, 15, 15, nil},
	{6011, 6011, 16, 19, nil}, // Discover
	{644, 649, 16, 19, nil},
	{65, 65, 16, 19, nil},
	{3528, 3589, 16, 19, nil}, // JCB
	{300, 305, 14, 19, nil},   // Diners Club
	{3095, 3095, 14, 19, nil},
	{36, 36, 14, 19, nil},
	{38, 39, 14, 19, nil},
	{62, 62, 16, 19, nil}, // UnionPay
	{50, 50, 13, 19, nil}, // Maestro
	{56, 69, 13, 19, nil},
}

// refIssued reports whether digits d are a length some brand issues with
// their prefix.
func refIssued(d []int) bool {
	for _, b := range refBrands {
		width := len(strconv.Itoa(b.lo))
		p := 0
		for _, v := range d[:width] {
			p = p*10 + v
		}
		if p < b.lo || p > b.hi {
			continue
		}
		if slices.Contains(b.only, len(d)) || len(d) >= b.min && len(d) <= b.max && b.min > 0 {
			return true
		}
	}
	return false
}

// refMasked is the reference: it decodes every character first, splits
// the text into runs by the definition's rules, and marks the bytes of
// every window of 13 to 19 digits of a run that starts and ends at a
// group's edge, has an issuer's prefix and length and passes Luhn, by
// brute force.
func refMasked(s string) []bool {
	masked := make([]bool, len(s))
	var units []refUnit
	for i := 0; i < len(s); {
		r, n := decodeUnit(s, i)
		units = append(units, refUnit{r, i, i + n})
		i += n
	}
	var run []refUnit
	var vals []int
	flush := func() {
		// edge(k): no byte between digit k and the one before.
		edge := func(k int) bool { return k == 0 || k == len(run) || run[k].start != run[k-1].end }
		for from := range vals {
			for l := 13; l <= 19 && from+l <= len(vals); l++ {
				if edge(from) && edge(from+l) && refIssued(vals[from:from+l]) && refLuhn(vals[from:from+l]) {
					for b := run[from].start; b < run[from+l-1].end; b++ {
						masked[b] = true
					}
				}
			}
		}
		run, vals = run[:0], vals[:0]
	}
	asciiAlnum := func(r rune) bool { return r < 128 && (unicode.IsLetter(r) || unicode.IsDigit(r)) }
	gap := 0
	for k := 0; k < len(units); k++ {
		u := units[k]
		if u.r < 128 && unicode.IsLetter(u.r) { // an identifier
			flush()
			for k+1 < len(units) && asciiAlnum(units[k+1].r) {
				k++
			}
			continue
		}
		if d, ok := refDigit(u.r); ok {
			if k == 0 || !asciiAlnum(units[k-1].r) && !unicode.Is(unicode.Nd, units[k-1].r) {
				if end := shapeEnd(s, u.start); end > 0 {
					flush()
					for k+1 < len(units) && units[k+1].start < end {
						k++
					}
					continue
				}
			}
			if gap > 16 {
				flush()
			}
			run, vals, gap = append(run, u), append(vals, d), 0
			continue
		}
		if unicode.IsLetter(u.r) {
			flush()
			continue
		}
		gap++
	}
	flush()
	return masked
}

// refPANs replaces every stretch of masked bytes with PANMask.
func refPANs(s string) string {
	masked := refMasked(s)
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if !masked[i] {
			b.WriteByte(s[i])
			continue
		}
		if i == 0 || !masked[i-1] {
			b.WriteString(PANMask)
		}
	}
	return b.String()
}

func FuzzRedactPANs(f *testing.F) {
	for _, s := range []string{
		"4111111111111111 12/28", "order 12 4111111111111111", "4111111111111111 123", "378282246310005 1",
		"4111.1111.1111.1111", "4111_1111_1111_1111", "4111  1111\t1111 - 1111", "payments.requests.4111111111111111",
		"5555555555554444,4000056655665556", "2026-12-02T04:05:06Z", "amount 1999 usd", "99994111111111111111",
		"x4111111111111111y", "\x1b[2J4111\x001111\xff1111\u009b1111", `{"a":[4111,1111,1111,1111]}`,
		"４１１１ １１１１ １１１１ １１１１", "٤١١١-١١١١-١١١١-١١١١", "४१११ १११११११११११११", "𝟒𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏",
		`4111\t1111\u00a01111\\n1111`, `\u0034\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031`,
		`\ud835\udfd2111111111111111`, "&#52;111&nbsp;1111&#x20;1111 1111", "2026-12-07 12:34:56.123456782 +0000 UTC",
		"12345678-1234-1234-1234-123456789012", "pi_3Mt4111111111111111Pa", "m_4111111111111111", "4111111111111111exp",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := PANs(s)
		if want := refPANs(s); got != want {
			t.Fatalf("PANs(%q)\n = %q\nwant %q (the reference)", s, got, want)
		}
		// No card number window survives in clear: the output has none left.
		for i, m := range refMasked(got) {
			if m {
				t.Fatalf("PANs(%q) = %q still holds a card number at byte %d", s, got, i)
			}
		}
		if b := Body([]byte(s)); !bytes.Equal(b, []byte(got)) {
			t.Fatalf("Body(%q) = %q, PANs = %q", s, b, got)
		}
		start, end, ok := FindPAN(s)
		if ok != (got != s) || ok != ContainsPAN(s) {
			t.Fatalf("FindPAN(%q) ok=%v, ContainsPAN %v, but PANs changed it: %v", s, ok, ContainsPAN(s), got != s)
		}
		if ok && s[:start]+PANMask != got[:start+len(PANMask)] {
			t.Fatalf("FindPAN(%q) = [%d, %d), but PANs = %q", s, start, end, got)
		}
	})
}

// The work is bounded per byte: at most seven O(1) Luhn checks a digit,
// even when a 64 KiB body is one joined run of digits and separators (the
// worst case); the time a byte is logged as a figure.
func TestPANsIsLinear(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		strings.Repeat("4111 1111 1111 1111 12/28 ", 2560), // ~66 KiB, one joined run
		strings.Repeat("0", 64<<10),
		strings.Repeat("1234-5678 ", 6554),
		strings.Repeat("４１１１\\t", 6554),
	} {
		var sc scanner
		var out []byte
		cursor := 0
		start := time.Now()
		sc.scan(s, func(from, to int) bool {
			out = append(append(out, s[cursor:from]...), PANMask...)
			cursor = to
			return true
		})
		out = append(out, s[cursor:]...)
		took := time.Since(start)
		digits := len(refMasked(s)) // an upper bound on the digits
		if sc.checks > (maxPANDigits-minPANDigits+1)*digits {
			t.Fatalf("%d bytes: %d Luhn checks, want at most 7 a digit", len(s), sc.checks)
		}
		if string(out) != PANs(s) {
			t.Fatal("scan and PANs disagree")
		}
		t.Logf("%d bytes: %d checks, %v (%v a byte)", len(s), sc.checks, took, took/time.Duration(len(s)))
	}
}

// A JSON body's escapes do not hide a card number, whether or not the
// body is one JSON value; a body without one is kept byte for byte.
func TestBodyReadsJSONStrings(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{`{"b":"4111\t1111\t1111\t1111"}`, `{"b":"` + PANMask + `"}`},
		{`{"b":"\u0034111111111111111 x"}`, `{"b":"` + PANMask + ` x"}`},
		{`{"4111\n1111\n1111\n1111":1}`, `{"` + PANMask + `":1}`},
		{`{"x":[4111,1111,1111,1111]}`, `{"x":[` + PANMask + `]}`},
		{`{"a": "order 42",  "amount": 1999}`, `{"a": "order 42",  "amount": 1999}`},
		{"not json 4111 1111 1111 1111\xff", "not json " + PANMask + "\xff"},
		// Issue 54 item 2: bodies that are not one JSON value.
		{`{"description":"4111\t1111\t1111\t1111"} trailing`, `{"description":"` + PANMask + `"} trailing`},
		{`{"description":"4111\t1111\t1111\t1111","description":"ok"}`, `{"description":"` + PANMask + `","description":"ok"}`},
		{`{"description":"4111\t1111\t1111\t11`, `{"description":"4111\t1111\t1111\t11`}, // cut: 14 digits, none Luhn-valid
		{`{"description":"4111\t1111\t1111\t1111`, `{"description":"` + PANMask},
		{`{"d":"\u0034\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031"`, `{"d":"` + PANMask + `"`},
	} {
		if got := string(Body([]byte(c.in))); got != c.want {
			t.Errorf("Body(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
