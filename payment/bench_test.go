package payment_test

import (
	"testing"

	"github.com/paydedup/paydedup/payment"
)

// benchBodies are typical commands as publishers send them: one plain, one
// with a handful of metadata entries.
var benchBodies = []struct {
	name string
	body []byte
}{
	{"plain", []byte(`{"merchant_id":"m_bench","idempotency_key":"p-12345","amount":1099,"currency":"usd",` +
		`"payment_method":"pm_card_visa","description":"bench"}`)},
	{"metadata", []byte(`{"merchant_id":"m_bench","idempotency_key":"p-12345","amount":1099,"currency":"usd",` +
		`"payment_method":"pm_card_visa","description":"bench","metadata":{"order_id":"42","customer":"c_981",` +
		`"channel":"web","campaign":"spring","note":"gift wrap"}}`)},
}

// BenchmarkDecode measures Decode on typical commands; it must stay at a few
// allocations (the Command, one copy of the body, the metadata map).
func BenchmarkDecode(b *testing.B) {
	for _, bb := range benchBodies {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bb.body)))
			env := payment.Envelope{SubjectMerchant: "m_bench"}
			for b.Loop() {
				if _, err := payment.Decode(bb.body, env, payment.Limits{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
