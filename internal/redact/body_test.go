package redact_test

import (
	"strings"
	"testing"

	"github.com/paydedup/paydedup/internal/redact"
)

// Issue 54, items 1 to 3, on the shown body (ShownBody; the console's body view): fullwidth and other
// scripts' digits, escaped separators in a body that is not one JSON value,
// all-\u00NN digits, and a body over the 64 KiB shown whose card number
// straddles the cut. Before, each was shown: the body was cut first, then
// parsed, and only a valid value's strings were read as decoded.
func TestRedactBodyMasksEveryScriptEscapeAndCut(t *testing.T) {
	t.Parallel()
	const pan = "4111111111111111"
	big := `{"description":"` + strings.Repeat("-", 64<<10-len(`{"description":"`)-21) + `4111\t1111\t1111\t1111"}`
	for name, body := range map[string]string{
		"fullwidth":       `{"description":"４１１１ １１１１ １１１１ １１１１"}`,
		"arabic-indic":    `{"metadata":{"n":"٤١١١ ١١١١ ١١١١ ١١١١"}}`,
		"trailing data":   `{"description":"4111\t1111\t1111\t1111"} trailing`,
		"duplicate":       `{"description":"4111\t1111\t1111\t1111","description":"ok"}`,
		"unicode escapes": `{"description":"\u0034\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031\u0031"} x`,
		"cut":             big,
	} {
		got := redact.ShownBody([]byte(body))
		if start, end, ok := redact.FindPAN(got); ok {
			t.Errorf("%s: ShownBody shows %q", name, got[start:end])
		}
		for _, s := range []string{"４１１１", "٤١١١", `4111\t1111`, "4111\t1111", `\u0034\u0031`, pan[:13]} {
			if strings.Contains(got, s) {
				t.Errorf("%s: ShownBody shows %q", name, s)
			}
		}
	}
}
