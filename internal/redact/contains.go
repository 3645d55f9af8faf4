package redact

import (
	"strings"
	"unicode/utf8"
)

// ContainsPAN reports whether s holds something that looks like a card
// number (PAN), by the one definition paydedup uses everywhere, at the door
// and in every mask (see PANs): 13 to 19 decimal digits of any script,
// joined by anything but letters, escapes decoded first, from the start of
// a group of digits to the end of one, with a card brand's issuer prefix
// and length, passing the Luhn check.
func ContainsPAN(s string) bool {
	_, _, ok := FindPAN(s)
	return ok
}

// FindPAN returns the byte offsets of the first stretch of s that PANs
// would mask: from the first byte of its first digit (or of the escape
// that spells it) to just past its last. A caller can name where a card
// number was found without quoting it.
func FindPAN(s string) (start, end int, ok bool) {
	if !mayHoldPAN(s) {
		return 0, 0, false
	}
	var sc scanner
	sc.scan(s, func(from, to int) bool {
		start, end, ok = from, to, true
		return false
	})
	return start, end, ok
}

// Cut masks the card numbers of s, then keeps at most n bytes of it, cut
// at a character boundary and never inside a mask, and reports whether it
// cut. Masking first means no cut leaves 15 of a card number's 16 digits
// (the 16th, the Luhn check digit, can be recomputed); what is kept is
// masked again, since a cut can take away the end of a UUID or a timestamp
// that kept its digits from being a card number, so the result may exceed
// n by a mask's length.
func Cut(s string, n int) (string, bool) {
	s = PANs(s)
	if len(s) <= n {
		return s, false
	}
	k := max(n, 0)
	for k > 0 && !utf8.RuneStart(s[k]) {
		k--
	}
	if j := strings.LastIndex(s[:min(len(s), k+len(PANMask)-1)], PANMask); j >= 0 && j < k && j+len(PANMask) > k {
		k = j
	}
	return PANs(s[:k]), true
}
