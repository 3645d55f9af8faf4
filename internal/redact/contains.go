package redact

// ContainsPAN reports whether s holds something that looks like a card
// number (PAN), by the one definition paydedup uses everywhere, at the door
// and in every mask (see PANs): a Luhn-valid run of 13 to 19 decimal digits
// of any script, joined by anything but letters, escapes decoded first.
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
