package workload

import (
	"encoding/json"
	"fmt"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// NumberedMerchant is the merchant of every numbered payment.
const NumberedMerchant = "m_bench"

// Numbered is the bench's workload: n valid payments of NumberedMerchant
// under the keys p-0 … p-(n-1), and dups of them published a second time,
// interleaved.
type Numbered struct{ N, Dups int }

// Command is payment i.
func (w Numbered) Command(i int) Command {
	key := fmt.Sprintf("p-%d", i)
	c := payment.Command{MerchantID: NumberedMerchant, IdempotencyKey: key, Amount: int64(100 + i%1000),
		Currency: "usd", PaymentMethod: "pm_card_visa", Description: "bench"}
	body, _ := json.Marshal(c)
	return Command{Cmd: c, Body: body}
}

// Copy is one publish of a numbered payment: its index, and 0 for the
// first publish, 1 for the duplicate.
type Copy struct{ I, N int }

// Order is the publish order: every payment in turn, each duplicate half a
// stride after its original, the duplicates left over at the end.
func (w Numbered) Order() []Copy {
	out := make([]Copy, 0, w.N+w.Dups)
	every := 0
	if w.Dups > 0 {
		every = max(w.N/w.Dups, 1)
	}
	d := 0
	for i := range w.N {
		out = append(out, Copy{I: i})
		if every > 0 && d < w.Dups && i%every == every-1 {
			out = append(out, Copy{I: i - every/2, N: 1})
			d++
		}
	}
	for ; d < w.Dups; d++ {
		out = append(out, Copy{I: d % w.N, N: 1})
	}
	return out
}

// Refs are the keys of the n payments.
func (w Numbered) Refs() []ledger.KeyRef {
	refs := make([]ledger.KeyRef, w.N)
	for i := range refs {
		refs[i] = ledger.KeyRef{MerchantID: NumberedMerchant, IdempotencyKey: fmt.Sprintf("p-%d", i)}
	}
	return refs
}

// Expected is what the verifier checks: every payment charged once.
func (w Numbered) Expected() []Expected {
	out := make([]Expected, w.N)
	for i, ref := range w.Refs() {
		out[i] = Expected{Key: RowKey(ref)}
	}
	return out
}
