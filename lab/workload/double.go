package workload

// The lab's one definition of a double charge, judged against the
// provider's ledger: the chaos verifier, the bench and the demo all count
// them here, so that none of them can drift into a looser count than the
// others.

import (
	"fmt"
	"slices"
)

// DoubleCharged returns the keys of chargesByKey (succeeded provider charges
// per "merchant_id:idempotency_key") charged more than once, sorted, each
// with its count: "m_1:k (charged 2 times)".
func DoubleCharged(chargesByKey map[string]int) []string {
	var out []string
	for key, n := range chargesByKey {
		if n > 1 {
			out = append(out, fmt.Sprintf("%s (charged %d times)", key, n))
		}
	}
	slices.Sort(out)
	return out
}
