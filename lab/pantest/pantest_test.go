package pantest_test

import (
	"testing"

	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/lab/pantest"
)

// Every number Build makes is a card number by the definition, and its
// ASCII digits too.
func TestBuildMakesCardNumbers(t *testing.T) {
	t.Parallel()
	for pick := uint32(0); pick < 200000; pick += 7 {
		p := pantest.Build(pick*2654435761, uint64(pick)*40503+411111111)
		if !redact.ContainsPAN(p.Digits) || !redact.ContainsPAN(p.Text) {
			t.Fatalf("Build(%d) = %q (%s): not a card number", pick, p.Text, p.Digits)
		}
	}
}
