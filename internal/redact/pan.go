package redact

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// PANMask is what a card number is replaced with: none of its digits
// stays (PCI DSS allows the first six and last four at most).
const PANMask = "[card number redacted]"

const (
	minPANDigits = 13
	maxPANDigits = 19
)

// PANs masks every card number in s: every window of 13 to 19 consecutive
// digits of a joined digit run that passes the Luhn check. A joined run is
// digits with any bytes but ASCII letters between them (spaces, dashes,
// dots, tabs, punctuation, line breaks, any run of them): "4111 1111.1111
// 1111", a card number with an expiry or order number beside it, or one in
// a NATS subject. A letter ends a run. Each masked stretch, from its first
// masked digit to its last, becomes PANMask; everything else is kept byte
// for byte, so dates, amounts and order numbers that are not part of a
// Luhn-valid window stay readable. The work is a constant per byte: seven
// window lengths per digit, each checked in O(1) with prefix sums.
func PANs(s string) string {
	longest := longestRun(s)
	if longest < minPANDigits {
		return s
	}
	r := newPANRedactor(longest)
	return string(r.appendRedacted(make([]byte, 0, len(s)), s))
}

// PANBytes is PANs for a body: invalid UTF-8 and every other byte outside a
// masked stretch are kept as they are.
func PANBytes(b []byte) []byte {
	longest := longestRun(string(b))
	if longest < minPANDigits {
		return b
	}
	r := newPANRedactor(longest)
	return r.appendRedacted(make([]byte, 0, len(b)), string(b))
}

func countDigits(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		if isDigit(s[i]) {
			n++
		}
	}
	return n
}

// panRedactor holds one joined run's digits: their byte offsets and the two
// Luhn prefix sums (p0 doubles the digits at even indexes, p1 at odd).
type panRedactor struct {
	pos    []int
	p0, p1 []int
	checks int // Luhn checks made, which the tests bound per digit
}

// newPANRedactor sizes the run buffers for the longest joined run, once.
func newPANRedactor(longest int) *panRedactor {
	return &panRedactor{pos: make([]int, 0, longest), p0: make([]int, 0, longest+1), p1: make([]int, 0, longest+1)}
}

// longestRun is the number of digits of the longest joined run of s.
func longestRun(s string) int {
	longest, run := 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case isDigit(c):
			run++
			longest = max(longest, run)
		case isLetter(c):
			run = 0
		}
	}
	return longest
}

func (r *panRedactor) appendRedacted(out []byte, s string) []byte {
	for i := 0; i < len(s); {
		if !isDigit(s[i]) {
			out = append(out, s[i])
			i++
			continue
		}
		end := r.scanRun(s, i)
		out = r.appendRun(out, s, i, end)
		i = end
	}
	return out
}

// scanRun reads the joined run that starts at the digit s[start] and
// returns the offset just past its last digit.
func (r *panRedactor) scanRun(s string, start int) int {
	r.pos, r.p0, r.p1 = r.pos[:0], append(r.p0[:0], 0), append(r.p1[:0], 0)
	end := start
	for j := start; j < len(s); j++ {
		c := s[j]
		if isLetter(c) {
			break
		}
		if !isDigit(c) {
			continue
		}
		d, k := int(c-'0'), len(r.pos)
		dd := 2 * d
		if dd > 9 {
			dd -= 9
		}
		a, b := d, dd // index k odd: p0 adds d, p1 adds 2d
		if k%2 == 0 {
			a, b = dd, d
		}
		r.pos = append(r.pos, j)
		r.p0 = append(r.p0, r.p0[k]+a)
		r.p1 = append(r.p1, r.p1[k]+b)
		end = j + 1
	}
	return end
}

// luhn reports whether digits [from, to) of the run pass the Luhn check:
// counted from the right, every second digit is doubled, which are the
// indexes of the same parity as to.
func (r *panRedactor) luhn(from, to int) bool {
	r.checks++
	p := r.p1
	if to%2 == 0 {
		p = r.p0
	}
	return (p[to]-p[from])%10 == 0
}

// appendRun writes s[start:end], one joined run, with every stretch of
// overlapping Luhn-valid windows replaced by PANMask.
func (r *panRedactor) appendRun(out []byte, s string, start, end int) []byte {
	n := len(r.pos)
	if n < minPANDigits {
		return append(out, s[start:end]...)
	}
	cursor := start // next byte of s to copy
	maskFrom, maskTo := -1, -1
	flush := func() {
		if maskFrom < 0 {
			return
		}
		out = append(out, s[cursor:r.pos[maskFrom]]...)
		out = append(out, PANMask...)
		cursor = r.pos[maskTo-1] + 1
	}
	for from := 0; from+minPANDigits <= n; from++ {
		to := -1
		for l := min(maxPANDigits, n-from); l >= minPANDigits; l-- {
			if r.luhn(from, from+l) {
				to = from + l
				break
			}
		}
		switch {
		case to < 0:
		case from < maskTo || from == maskTo && r.pos[from] == r.pos[from-1]+1:
			// Overlapping, or touching with no byte between: one stretch.
			maskTo = max(maskTo, to)
		default:
			flush()
			maskFrom, maskTo = from, to
		}
	}
	flush()
	return append(out, s[cursor:end]...)
}

func isDigit(c byte) bool  { return c >= '0' && c <= '9' }
func isLetter(c byte) bool { return c|0x20 >= 'a' && c|0x20 <= 'z' }

// Printable makes text from a message safe to print on a terminal or a
// page: an invalid UTF-8 byte becomes \xNN, a C0 control or DEL \xNN, a
// C1 control or other non-printing rune (bidi overrides) \uNNNN, so no
// escape sequence (clear screen, window title, OSC 52 clipboard write)
// reaches a terminal, nor one an operator copies from the console. Newlines
// and tabs are kept when multiline.
func Printable(s string, multiline bool) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case multiline && (r == '\n' || r == '\t'):
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r != ' ' && !unicode.IsPrint(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// Shown is what paydedup shows of text a publisher or a provider wrote:
// card numbers masked first (a control byte between digits joins them),
// then made printable.
func Shown(s string, multiline bool) string { return Printable(PANs(s), multiline) }
