package redact

import (
	"strings"
	"testing"
)

// TestShownReadsAsItWasMasked checks that making text printable never
// changes how the definition reads it: an escape Printable writes must
// decode to the character it stands for, or a separator could turn into
// letters and a digit glued to a card number into a digit of an
// identifier, which leaves the number standing alone in the output.
func TestShownReadsAsItWasMasked(t *testing.T) {
	kawi := strings.Repeat(`\ud807\udf51 `, 10)
	for _, s := range []string{
		// "0", a private-use rune, then "0" glued to Amex 348511111111115
		// in escaped Kawi digits: "03..." is no card number, but
		// `\u1030fc` for the private-use rune reads as U+1030 and "fc",
		// which made "c0" an identifier and the 3 a group's start.
		"0\U001030fc0" + `\ud807\udf53 \ud807\udf54 \ud807\udf58 \ud807\udf55 ` + kawi + `\ud807\udf55` + "\x7f",
		"0\U000e0001" + "03485 111111 11115",
		"0\U0010fffd" + "04111 1111 1111 1111",
	} {
		if ContainsPAN(s) {
			t.Fatalf("%q: the input itself holds a card number", s)
		}
		if out := Shown(s, false); ContainsPAN(out) {
			a, b, _ := FindPAN(out)
			t.Errorf("Shown(%q) = %q shows %q", s, out, out[a:b])
		}
	}
	for r, want := range map[rune]string{0x1030fc: `\U001030fc`, 0xe0001: `\U000e0001`, 0x200e: `\u200e`, 0x7f: `\x7f`} {
		if got := Printable(string(r), false); got != want {
			t.Errorf("Printable(%U) = %s, want %s", r, got, want)
		}
	}
}
