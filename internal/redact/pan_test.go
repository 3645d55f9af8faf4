package redact

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// refLuhn is the Luhn check as the standard states it.
func refLuhn(d []byte) bool {
	sum := 0
	for i := range d {
		n := int(d[len(d)-1-i] - '0')
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

// refMasked is the reference: for every joined digit run (digits with
// anything but ASCII letters between them), every Luhn-valid window of 13
// to 19 of its digits marks the bytes from its first digit to its last.
func refMasked(s string) []bool {
	masked := make([]bool, len(s))
	var pos []int
	var digits []byte
	flush := func() {
		for from := range digits {
			for l := 13; l <= 19 && from+l <= len(digits); l++ {
				if refLuhn(digits[from : from+l]) {
					for b := pos[from]; b <= pos[from+l-1]; b++ {
						masked[b] = true
					}
				}
			}
		}
		pos, digits = pos[:0], digits[:0]
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
			pos, digits = append(pos, i), append(digits, c)
		case c|0x20 >= 'a' && c|0x20 <= 'z':
			flush()
		}
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
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := PANs(s)
		if want := refPANs(s); got != want {
			t.Fatalf("PANs(%q)\n = %q\nwant %q (the reference)", s, got, want)
		}
		// No Luhn-valid window survives in clear: the output has none left.
		for i, m := range refMasked(strings.ReplaceAll(got, PANMask, "_x_")) {
			if m {
				t.Fatalf("PANs(%q) = %q still holds a card number at byte %d", s, got, i)
			}
		}
		if b := PANBytes([]byte(s)); !bytes.Equal(b, []byte(got)) {
			t.Fatalf("PANBytes(%q) = %q, PANs = %q", s, b, got)
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
	} {
		r := newPANRedactor(longestRun(s))
		start := time.Now()
		out := r.appendRedacted(nil, s)
		took := time.Since(start)
		digits := countDigits(s)
		if r.checks > (maxPANDigits-minPANDigits+1)*digits {
			t.Fatalf("%d bytes, %d digits: %d Luhn checks, want at most 7 a digit", len(s), digits, r.checks)
		}
		if string(out) != PANs(s) {
			t.Fatal("appendRedacted and PANs disagree")
		}
		t.Logf("%d bytes: %d checks for %d digits, %v (%v a byte)", len(s), r.checks, digits, took, took/time.Duration(len(s)))
	}
}

// A JSON body's escapes do not hide a card number; a body without one is
// kept byte for byte.
func TestBodyReadsJSONStrings(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{`{"b":"4111\t1111\t1111\t1111"}`, `{"b":"` + PANMask + `"}`},
		{`{"b":"\u0034111111111111111 x"}`, `{"b":"` + PANMask + ` x"}`},
		{`{"4111\n1111\n1111\n1111":1}`, `{"` + PANMask + `":1}`},
		{`{"x":[4111,1111,1111,1111]}`, `{"x":[` + PANMask + `]}`},
		{`{"a": "order 42",  "amount": 1999}`, `{"a": "order 42",  "amount": 1999}`},
		{"not json 4111 1111 1111 1111\xff", "not json " + PANMask + "\xff"},
	} {
		if got := string(Body([]byte(c.in))); got != c.want {
			t.Errorf("Body(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
