package payment_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/payment"
)

// Issue 54, item 3: a validation error quotes the offending value clipped
// to 64 bytes; the card number in it is masked before the cut, so the
// error (stored in Dlq-Error, logged, shown) never keeps 15 of its 16
// digits. Before, "----...4111111111111111" came back as the dashes and
// 411111111111111, whose 16th digit is the Luhn check digit.
func TestValidationErrorsMaskBeforeTheCut(t *testing.T) {
	t.Parallel()
	const pan = "4111111111111111"
	pad := strings.Repeat("-", 49) // 49 + 16 > 64: the cut falls on the last digit
	base := map[string]any{"merchant_id": "m_1", "idempotency_key": "k1", "amount": 100, "currency": "usd", "payment_method": "pm_card_visa"}
	for name, c := range map[string]struct {
		set    func(map[string]any)
		header string
	}{
		"currency":           {set: func(m map[string]any) { m["currency"] = pad + pan }},
		"fullwidth currency": {set: func(m map[string]any) { m["currency"] = "４１１１ １１１１ １１１１ １１１１" }},
		"metadata key":       {set: func(m map[string]any) { m["metadata"] = map[string]string{pad + pan + "[": "v"} }},
		"metadata value":     {set: func(m map[string]any) { m["metadata"] = map[string]string{pad + pan: strings.Repeat("v", 501)} }},
		"reserved key":       {set: func(m map[string]any) { m["metadata"] = map[string]string{"merchant_id": "x"} }},
		"merchant":           {set: func(m map[string]any) { m["merchant_id"] = pad + pan + "!" }},
		"header key":         {set: func(map[string]any) {}, header: pad + pan},
	} {
		m := map[string]any{}
		for k, v := range base {
			m[k] = v
		}
		c.set(m)
		body, _ := json.Marshal(m)
		_, err := payment.Decode(body, payment.Envelope{HeaderKey: c.header, HeaderKeySet: c.header != ""}, payment.Limits{})
		if err == nil {
			t.Errorf("%s: decoded", name)
			continue
		}
		if msg := err.Error(); redact.ContainsPAN(msg) || strings.Contains(msg, pan[:13]) {
			t.Errorf("%s: %q keeps a card number's digits", name, msg)
		}
	}
}
