package redact

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// PANMask is what a card number is replaced with: none of its digits
// stays (PCI DSS allows the first six and last four at most). Every output
// of paydedup masks with it.
const PANMask = "[card number redacted]"

const (
	minPANDigits = 13
	maxPANDigits = 19
	// maxSepRun bounds the separators between two digits of one card
	// number: "4111 - 1111", a JSON array's ", " or a pretty-printed one's
	// line break and indentation fit many times over; two numbers further
	// apart than that are read as two.
	maxSepRun = 16
)

// PANs masks every card number in s. What looks like a card number is one
// definition, shared by the door (ContainsPAN) and every mask:
//
//   - a digit is any Unicode decimal digit (category Nd): ASCII, fullwidth
//     "４", Arabic-Indic "٤", Devanagari "४", mathematical "𝟒", ... with its
//     value in its script, scripts mixed freely;
//   - escapes are decoded first, wherever they are, since text may be JSON
//     or quoted in an error: a backslash run then t n r b f v a " / ',
//     uXXXX (a surrogate pair as one character), UXXXXXXXX or xNN, and an
//     HTML character reference (&#52; &#x34; &nbsp;) are one character each;
//   - digits joined by anything but letters, at most maxSepRun separators
//     between two of them (spaces, dashes, dots, tabs, NBSP, punctuation,
//     line breaks, invalid bytes), make a run; a letter of any script ends
//     it;
//   - a group is a maximal run of digits with nothing between them (a
//     digit's escape counts as the digit); a card number is a window of a
//     run that starts at the start of a group and ends at the end of a
//     group (never inside one, so a group longer than 19 digits, a long
//     id, is never a card number), whose digits have a payment card
//     brand's issuer prefix and length (issuerLengths) and pass the Luhn
//     check.
//
// Text with its own shape is not a card number and ends a run: an
// identifier (an ASCII letter and the ASCII letters and digits after it:
// the body of "pi_3Mt4111111111111111Pa", "seq4111...", a hex digest's
// tail; not "m_4111111111111111", whose number follows an underscore), a UUID, and an RFC 3339
// or time.Time timestamp ("2026-12-07T12:34:56.123456782Z", "2026-12-07
// 12:34:56 +0000"), a date alone ("2024-01-15") or a time of day with up
// to nine fraction digits, each starting where no digit or ASCII letter is
// just before it.
//
// Each masked stretch, from the first byte of its first digit (or of the
// escape spelling it) to the last byte of its last, becomes PANMask;
// everything else is kept byte for byte, so dates, amounts and order
// numbers that are not part of a card number's window stay readable. The
// work is a constant per byte: at most seven window lengths per group
// start, each checked in O(1) with prefix sums.
func PANs(s string) string {
	if !mayHoldPAN(s) {
		return s
	}
	out, cursor := []byte(nil), 0
	var sc scanner
	sc.scan(s, func(from, to int) bool {
		if out == nil {
			out = make([]byte, 0, len(s))
		}
		out = append(append(out, s[cursor:from]...), PANMask...)
		cursor = to
		return true
	})
	if out == nil {
		return s
	}
	return string(append(out, s[cursor:]...))
}

// mayHoldPAN is a cheap filter that never says no to a card number: ASCII
// text without an escape needs 13 digits with no ASCII letter between
// them, none in an identifier (every run of the definition lies inside one
// such stretch); other text needs 13 bytes that could start a digit (an
// ASCII digit, a UTF-8 lead byte, a backslash or an ampersand).
func mayHoldPAN(s string) bool {
	if len(s) < minPANDigits { // every digit takes a byte at least
		return false
	}
	run, ident := 0, false
	for i := 0; i < len(s); i++ {
		switch byteClass[s[i]] {
		case classDigit:
			if ident {
				continue
			}
			if run++; run >= minPANDigits {
				return true
			}
		case classLetter:
			run, ident = 0, true
		case classOther:
			ident = false
		default:
			return countDigitLike(s) >= minPANDigits
		}
	}
	return false
}

// The classes of a byte for mayHoldPAN: classSpecial is a UTF-8 byte, a
// backslash or an ampersand, which may start a digit of another script or
// an escape.
const (
	classOther = iota
	classDigit
	classLetter
	classSpecial
)

var byteClass = func() (t [256]uint8) {
	for c := range t {
		switch b := byte(c); {
		case isDigit(b):
			t[c] = classDigit
		case isLetter(b):
			t[c] = classLetter
		case b >= utf8.RuneSelf || b == '\\' || b == '&':
			t[c] = classSpecial
		}
	}
	return t
}()

func countDigitLike(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		if c := s[i]; isDigit(c) || c >= 0xc0 || c == '\\' || c == '&' {
			n++
		}
	}
	return n
}

// scanner holds one joined run's digits: the byte span of each in the raw
// text (a digit starts a group when a byte lies between it and the one
// before), its value, and the two Luhn prefix sums (p0 doubles the digits
// at even indexes, p1 at odd).
type scanner struct {
	starts, ends []int
	vals         []int
	p0, p1       []int
	checks       int // Luhn checks made, which the tests bound per digit
}

func (sc *scanner) reset() {
	if sc.p0 == nil {
		// One allocation for the five, enough for most runs.
		const n = 2 * maxPANDigits
		b := make([]int, 5*n)
		sc.starts, sc.ends, sc.vals = b[:0:n], b[n:n:2*n], b[4*n:4*n:5*n]
		sc.p0, sc.p1 = b[2*n:2*n:3*n], b[3*n:3*n:4*n]
	}
	sc.starts, sc.ends, sc.vals = sc.starts[:0], sc.ends[:0], sc.vals[:0]
	sc.p0, sc.p1 = append(sc.p0[:0], 0), append(sc.p1[:0], 0)
}

// push adds a digit of value d spelt by s[start:end] to the run.
func (sc *scanner) push(d, start, end int) {
	k := len(sc.starts)
	dd := 2 * d
	if dd > 9 {
		dd -= 9
	}
	a, b := d, dd // index k odd: p0 adds d, p1 adds 2d
	if k%2 == 0 {
		a, b = dd, d
	}
	sc.starts, sc.ends = append(sc.starts, start), append(sc.ends, end)
	sc.vals = append(sc.vals, d)
	sc.p0 = append(sc.p0, sc.p0[k]+a)
	sc.p1 = append(sc.p1, sc.p1[k]+b)
}

// scan calls emit with the byte span of every stretch of s to mask, in
// order, until emit returns false; it reports whether emit always said go
// on.
func (sc *scanner) scan(s string, emit func(start, end int) bool) bool {
	sc.reset()
	gap := 0
	ident := false    // inside an identifier
	prevWord := false // the previous character is an ASCII letter or a digit
	for i := 0; i < len(s); {
		r, n := decodeUnit(s, i)
		alnum := r < utf8.RuneSelf && (isDigit(byte(r)) || isLetter(byte(r)))
		d, digit := digitValue(r)
		switch {
		case ident && alnum:
			// An identifier's digits are its own.
		case alnum && !digit:
			if !sc.flush(emit) {
				return false
			}
			ident = true
		case digit:
			ident = false
			if !prevWord {
				if end := shapeEnd(s, i); end > 0 {
					if !sc.flush(emit) {
						return false
					}
					i, prevWord = end, true
					continue
				}
			}
			if gap > maxSepRun && !sc.flush(emit) {
				return false
			}
			sc.push(d, i, i+n)
			gap = 0
		case unicode.IsLetter(r):
			ident = false
			if !sc.flush(emit) {
				return false
			}
		default:
			ident = false
			gap++
		}
		prevWord = alnum || digit
		i += n
	}
	return sc.flush(emit)
}

// luhn reports whether digits [from, to) of the run pass the Luhn check:
// counted from the right, every second digit is doubled, which are the
// indexes of the same parity as to.
func (sc *scanner) luhn(from, to int) bool {
	sc.checks++
	p := sc.p1
	if to%2 == 0 {
		p = sc.p0
	}
	return (p[to]-p[from])%10 == 0
}

// flush emits the run's stretches of overlapping card number windows and
// starts a new run. A window starts at a group's start and ends at a
// group's end (groupEdge), so a number glued to other digits, or a long
// id, is none; its length must be one its issuer prefix allows.
func (sc *scanner) flush(emit func(start, end int) bool) bool {
	n, ok := len(sc.starts), true
	maskFrom, maskTo := -1, -1
	for from := 0; ok && from+minPANDigits <= n; from++ {
		if !sc.groupEdge(from) {
			continue
		}
		v := sc.vals[from : from+4]
		lengths := issuerLengths(v[0]*1000 + v[1]*100 + v[2]*10 + v[3])
		to := -1
		for l := min(maxPANDigits, n-from); l >= minPANDigits; l-- {
			if lengths&(1<<l) != 0 && sc.groupEdge(from+l) && sc.luhn(from, from+l) {
				to = from + l
				break
			}
		}
		switch {
		case to < 0:
		case from < maskTo:
			maskTo = max(maskTo, to)
		default:
			if maskFrom >= 0 {
				ok = emit(sc.starts[maskFrom], sc.ends[maskTo-1])
			}
			maskFrom, maskTo = from, to
		}
	}
	if ok && maskFrom >= 0 {
		ok = emit(sc.starts[maskFrom], sc.ends[maskTo-1])
	}
	sc.reset()
	return ok
}

// groupEdge reports whether a group starts at digit k of the run (and one
// ends just before it): k is the first or the last digit's end, or a byte
// lies between digit k and the one before.
func (sc *scanner) groupEdge(k int) bool {
	return k == 0 || k == len(sc.starts) || sc.starts[k] != sc.ends[k-1]
}

// Lengths in the bitmask issuerLengths returns.
const (
	len13to19 = 1<<20 - 1<<13
	len14to19 = 1<<20 - 1<<14
	len16to19 = 1<<20 - 1<<16
)

// issuerLengths returns the lengths (bit l set for l digits) a card number
// whose first four digits are p may have, by the issuer ranges (IIN) of
// the brands paydedup knows, or 0 for a prefix no brand issues: Visa 4
// (13, 16, 19), Mastercard 51-55 and 2221-2720 (16), American Express 34
// and 37 (15), JCB 3528-3589 (16-19), Diners Club 300-305, 3095, 36 and
// 38-39 (14-19), Maestro 50 and 56-69 (12-19, 13-19 here), which holds
// Discover (6011, 644-649, 65: 16-19) and UnionPay (62: 16-19). Private
// label cards, UATP (1) and other brands are not card numbers here.
func issuerLengths(p int) uint32 {
	switch {
	case p >= 4000 && p <= 4999:
		return 1<<13 | 1<<16 | 1<<19
	case p >= 5100 && p <= 5599, p >= 2221 && p <= 2720:
		return 1 << 16
	case p >= 3400 && p <= 3499, p >= 3700 && p <= 3799:
		return 1 << 15
	case p >= 3528 && p <= 3589:
		return len16to19
	case p >= 3000 && p <= 3059, p == 3095, p >= 3600 && p <= 3699, p >= 3800 && p <= 3999:
		return len14to19
	case p >= 5000 && p <= 5099, p >= 5600 && p <= 6999:
		return len13to19
	}
	return 0
}

// sepRune stands for a decoded escape that is neither a digit nor a letter.
const sepRune = ' '

// decodeUnit returns the character at s[i] and its length in bytes, with
// escapes and character references decoded; an invalid byte is
// utf8.RuneError, a separator.
func decodeUnit(s string, i int) (rune, int) {
	switch c := s[i]; {
	case c == '\\':
		r, n := decodeEscape(s, i)
		if r == '&' { // an escaped ampersand may start a reference: "\u0026#52;"
			if r2, end := referenceAfter(s, i+n); end > 0 {
				return r2, end - i
			}
		}
		return r, n
	case c == '&':
		return decodeReference(s, i)
	case c < utf8.RuneSelf:
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// decodeEscape decodes the escape at s[i] == '\\'. A run of backslashes
// is one: an escape escaped again ("\\\\t" in JSON holding JSON) still
// separates.
func decodeEscape(s string, i int) (rune, int) {
	j := i
	for j < len(s) && s[j] == '\\' {
		j++
	}
	if j == len(s) {
		return '\\', j - i
	}
	switch s[j] {
	case 'u':
		cp, ok := hexAt(s, j+1, 4)
		if !ok {
			break
		}
		end := j + 5
		if cp >= 0xd800 && cp < 0xdc00 { // a high surrogate: the low one follows
			k := end
			for k < len(s) && s[k] == '\\' {
				k++
			}
			if k > end && k < len(s) && s[k] == 'u' {
				if lo, ok := hexAt(s, k+1, 4); ok && lo >= 0xdc00 && lo < 0xe000 {
					return utf16.DecodeRune(cp, lo), k + 5 - i
				}
			}
		}
		return cp, end - i
	case 'U':
		if cp, ok := hexAt(s, j+1, 8); ok {
			return cp, j + 9 - i
		}
	case 'x':
		if cp, ok := hexAt(s, j+1, 2); ok {
			if cp >= utf8.RuneSelf {
				cp = utf8.RuneError // a byte, not a character
			}
			return cp, j + 3 - i
		}
	case 't', 'n', 'r', 'b', 'f', 'v', 'a', '"', '/', '\'':
		return sepRune, j + 1 - i
	}
	return '\\', j - i
}

// decodeReference decodes the HTML character reference at s[i] == '&':
// numeric ones to their character, named ones (&nbsp; &amp;) to a
// separator, as none names a digit; "&amp;" before a reference is read as
// the ampersand it escapes ("&amp;#52;" is a reference escaped again).
func decodeReference(s string, i int) (rune, int) {
	if r, end := referenceAfter(s, i+1); end > 0 {
		if r == '&' && strings.HasPrefix(s[i:end], "&amp;") {
			if r2, end2 := referenceAfter(s, end); end2 > 0 {
				return r2, end2 - i
			}
		}
		return r, end - i
	}
	return '&', 1
}

// referenceAfter decodes the body of a character reference starting at
// s[j], just after its ampersand, and returns its end, or 0 if there is
// none. "amp" reads as '&'.
func referenceAfter(s string, j int) (rune, int) {
	if j < len(s) && s[j] == '#' {
		j++
		base := rune(10)
		if j < len(s) && s[j]|0x20 == 'x' {
			base, j = 16, j+1
		}
		cp, k := rune(0), j
		for ; k < len(s) && k-j < 7; k++ {
			v := hexValue(s[k])
			if v < 0 || v >= base {
				break
			}
			cp = cp*base + v
		}
		if k > j && k < len(s) && s[k] == ';' {
			return cp, k + 1
		}
		return 0, 0
	}
	k := j
	for k < len(s) && k-j < 10 && (isLetter(s[k]) || isDigit(s[k])) {
		k++
	}
	if k-j >= 2 && k < len(s) && s[k] == ';' && isLetter(s[j]) {
		if s[j:k] == "amp" {
			return '&', k + 1
		}
		return sepRune, k + 1
	}
	return 0, 0
}

func hexValue(c byte) rune {
	switch {
	case isDigit(c):
		return rune(c - '0')
	case c|0x20 >= 'a' && c|0x20 <= 'f':
		return rune(c|0x20-'a') + 10
	}
	return -1
}

// hexAt reads n hex digits at s[i:].
func hexAt(s string, i, n int) (rune, bool) {
	if i+n > len(s) {
		return 0, false
	}
	cp := rune(0)
	for k := i; k < i+n; k++ {
		v := hexValue(s[k])
		if v < 0 {
			return 0, false
		}
		cp = cp<<4 | v
	}
	return cp, true
}

// digitValue is r's value if r is a decimal digit of any script. Unicode
// keeps every script's digits as ten consecutive code points, zero first,
// so a digit's value is its distance from the start of its range of
// unicode.Nd, modulo ten (TestDigitValueEveryScript checks the table).
func digitValue(r rune) (int, bool) {
	if r < utf8.RuneSelf {
		return int(r - '0'), r >= '0' && r <= '9'
	}
	if r <= 0xffff {
		t := unicode.Nd.R16
		k, _ := slices.BinarySearchFunc(t, uint16(r), func(e unicode.Range16, r uint16) int { return cmp.Compare(e.Hi, r) })
		if k < len(t) && t[k].Lo <= uint16(r) {
			return int(uint16(r)-t[k].Lo) % 10, true
		}
		return 0, false
	}
	t := unicode.Nd.R32
	k, _ := slices.BinarySearchFunc(t, uint32(r), func(e unicode.Range32, r uint32) int { return cmp.Compare(e.Hi, r) })
	if k < len(t) && t[k].Lo <= uint32(r) && uint32(r) <= t[k].Hi {
		return int(uint32(r)-t[k].Lo) % 10, true
	}
	return 0, false
}

// shapeEnd returns the end of the UUID or timestamp that starts at s[i],
// or 0: their digits are not a card number's.
func shapeEnd(s string, i int) int {
	t := s[i:]
	if end := uuidEnd(t); end > 0 {
		return i + end
	}
	if end := dateTimeEnd(t); end > 0 {
		return i + end
	}
	if end := timeEnd(t); end > 0 {
		return i + end
	}
	return 0
}

// uuidEnd matches 8-4-4-4-12 hex digits not followed by a letter or digit.
func uuidEnd(t string) int {
	if len(t) < 36 || len(t) > 36 && (isDigit(t[36]) || isLetter(t[36])) {
		return 0
	}
	for k := 0; k < 36; k++ {
		if k == 8 || k == 13 || k == 18 || k == 23 {
			if t[k] != '-' {
				return 0
			}
		} else if hexValue(t[k]) < 0 {
			return 0
		}
	}
	return 36
}

// dateTimeEnd matches YYYY-MM-DD, with a year from 1900 to 2199, then T
// or a space and a time of day, or the date alone when no digit follows
// it ("Order #4412 2024-01-15 12:00": a card number is never grouped
// 4-2-2).
func dateTimeEnd(t string) int {
	if len(t) < 10 || !(t[:2] == "19" || t[:2] == "20" || t[:2] == "21") ||
		!isDigit(t[2]) || !isDigit(t[3]) || t[4] != '-' || !inRange(t[5:7], 1, 12) || t[7] != '-' ||
		!inRange(t[8:10], 1, 31) {
		return 0
	}
	if len(t) > 11 && (t[10] == 'T' || t[10] == ' ') {
		if end := timeEnd(t[11:]); end > 0 {
			return 11 + end
		}
	}
	if len(t) > 10 && isDigit(t[10]) {
		return 0
	}
	return 10
}

// timeEnd matches HH:MM:SS with up to nine fraction digits, not followed
// by another digit.
func timeEnd(t string) int {
	if len(t) < 8 || !inRange(t[0:2], 0, 23) || t[2] != ':' || !inRange(t[3:5], 0, 59) || t[5] != ':' || !inRange(t[6:8], 0, 60) {
		return 0
	}
	end := 8
	if end+1 < len(t) && t[end] == '.' && isDigit(t[end+1]) {
		end++
		for k := 0; k < 9 && end < len(t) && isDigit(t[end]); k++ {
			end++
		}
	}
	if end < len(t) && isDigit(t[end]) {
		return 0
	}
	return end
}

// inRange reports whether the two ASCII digits of t are a number in
// [lo, hi].
func inRange(t string, lo, hi int) bool {
	if !isDigit(t[0]) || !isDigit(t[1]) {
		return false
	}
	v := int(t[0]-'0')*10 + int(t[1]-'0')
	return v >= lo && v <= hi
}

func isDigit(c byte) bool  { return c >= '0' && c <= '9' }
func isLetter(c byte) bool { return c|0x20 >= 'a' && c|0x20 <= 'z' }

// Printable makes text from a message safe to print on a terminal or a
// page: an invalid UTF-8 byte becomes \xNN, a C0 control or DEL \xNN, a
// C1 control or other non-printing rune (bidi overrides) \uNNNN, or
// \UNNNNNNNN beyond the first plane, each read back as the one character
// it stands for (the card number definition reads escapes), so no
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
		case r != ' ' && !unicode.IsPrint(r) && r > 0xffff:
			fmt.Fprintf(&b, `\U%08x`, r) // \u takes four digits: \u1030fc would read as U+1030 and "fc"
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
