// Package pantest builds card numbers (PANs) as a hostile or careless
// publisher could write them, for fuzz targets that check an output
// surface shows none: a real brand's issuer prefix and length (13 to 19
// digits), Luhn-valid, in any decimal digit script, with any separator
// between its groups and any escape for its digits and separators.
package pantest

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
)

// Separators are what may join a card number's groups: typed (space,
// dash, dot, slash, NBSP, ideographic space, em dash, comma), a JSON
// array's or two strings' punctuation, and escaped (JSON, Go, HTML).
var Separators = []string{
	" ", "-", ".", "/", "\t", "\n", "\u00a0", "\u3000", "\u2014", ",", ", ", "  -  ", "_", "\x00", "\xff",
	`\t`, `\n`, `\r\n`, `\u00a0`, `\\t`, `\/`, `\"`, `", "`, "&nbsp;", "&#32;", "&#x2d;",
}

// Zeros are the zero of every decimal digit script Unicode has (unicode.Nd).
var Zeros = func() []rune {
	var z []rune
	for _, r := range unicode.Nd.R16 {
		for c := rune(r.Lo); c <= rune(r.Hi); c += 10 {
			z = append(z, c)
		}
	}
	for _, r := range unicode.Nd.R32 {
		for c := rune(r.Lo); c <= rune(r.Hi); c += 10 {
			z = append(z, c)
		}
	}
	return z
}()

// Encodings of one digit.
const (
	Raw   = iota // the character itself
	JSON         // \uXXXX, a surrogate pair outside the BMP
	HTML         // &#NNNN;
	Mixed        // Raw, JSON and HTML in turn
	nEncodings
)

// Brands are the issuer prefixes (from Lo to Hi, as many digits as Lo
// has) and lengths of the card brands the definition knows
// (redact.PANs), one row per range.
var Brands = []struct {
	Name    string
	Lo, Hi  int
	Lengths []int
}{
	{"visa", 4, 4, []int{13, 16, 19}},
	{"mastercard", 51, 55, []int{16}},
	{"mastercard 2-series", 2221, 2720, []int{16}},
	{"amex", 34, 34, []int{15}},
	{"amex", 37, 37, []int{15}},
	{"discover", 6011, 6011, []int{16, 17, 18, 19}},
	{"discover", 644, 649, []int{16, 17, 18, 19}},
	{"discover", 65, 65, []int{16, 17, 18, 19}},
	{"jcb", 3528, 3589, []int{16, 17, 18, 19}},
	{"diners", 300, 305, []int{14, 15, 16, 17, 18, 19}},
	{"diners", 3095, 3095, []int{14, 15, 16, 17, 18, 19}},
	{"diners", 36, 36, []int{14, 15, 16, 17, 18, 19}},
	{"diners", 38, 39, []int{14, 15, 16, 17, 18, 19}},
	{"unionpay", 62, 62, []int{16, 17, 18, 19}},
	{"maestro", 50, 50, []int{13, 14, 15, 16, 17, 18, 19}},
	{"maestro", 56, 69, []int{13, 14, 15, 16, 17, 18, 19}},
}

// PAN is a Luhn-valid card number of a real brand, 13 to 19 digits, as
// text.
type PAN struct {
	Digits string // its ASCII digits
	Text   string // as written
}

// Build makes the card number that pick and body choose: brand, prefix,
// length, script, encoding, separator and group size from pick, the other
// digits from body.
func Build(pick uint32, body uint64) PAN {
	b := Brands[int(pick%uint32(len(Brands)))]
	pick /= uint32(len(Brands))
	n := b.Lengths[int(pick%uint32(len(b.Lengths)))]
	pick /= uint32(len(b.Lengths))
	prefix := strconv.Itoa(b.Lo + int(uint32(body)%uint32(b.Hi-b.Lo+1)))
	d := make([]int, n)
	for i := range prefix {
		d[i] = int(prefix[i] - '0')
	}
	for i := len(prefix); i < n-1; i++ {
		d[i] = int(body % 10)
		body /= 10
		if body == 0 {
			body = uint64(pick)*2654435761 + uint64(i) + 1
		}
	}
	d[n-1] = checkDigit(d[:n-1])
	zero := Zeros[int(pick%uint32(len(Zeros)))]
	if pick%3 == 0 {
		zero = '0' // ASCII a third of the time: the escapes matter there too
	}
	pick /= uint32(len(Zeros))
	enc := int(pick % nEncodings)
	pick /= nEncodings
	sep := Separators[int(pick%uint32(len(Separators)))]
	pick /= uint32(len(Separators))
	group := 1 + int(pick%5)
	var digits, text strings.Builder
	for i, v := range d {
		if i > 0 && i%group == 0 {
			text.WriteString(sep)
		}
		digits.WriteByte(byte('0' + v))
		r := zero + rune(v)
		e := enc
		if e == Mixed {
			e = i % Mixed
		}
		switch e {
		case Raw:
			text.WriteRune(r)
		case JSON:
			if r > 0xffff {
				hi, lo := utf16.EncodeRune(r)
				fmt.Fprintf(&text, `\u%04x\u%04x`, hi, lo)
			} else {
				fmt.Fprintf(&text, `\u%04x`, r)
			}
		case HTML:
			fmt.Fprintf(&text, "&#%d;", r)
		}
	}
	return PAN{Digits: digits.String(), Text: text.String()}
}

// checkDigit is the Luhn check digit for d.
func checkDigit(d []int) int {
	sum := 0
	for i := range d {
		v := d[len(d)-1-i]
		if i%2 == 0 { // doubled: these are every second digit from the check digit's left
			v *= 2
			if v > 9 {
				v -= 9
			}
		}
		sum += v
	}
	return (10 - sum%10) % 10
}
