package gateway_test

import (
	"strings"
	"testing"

	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/internal/redact"
)

// Issue 54, item 2: a problem detail never quotes a card number the
// client sent, in any script, cut or not, whatever the answer (a
// validation error today, a refusal of card data at the door later).
func TestProblemDetailsHoldNoCardNumber(t *testing.T) {
	t.Parallel()
	w := setup(t, gateway.Config{})
	pad := strings.Repeat("-", 49)
	for _, body := range []string{
		`{"amount":100,"currency":"４１１１ １１１１ １１１１ １１１１","payment_method":"pm_card_visa"}`,
		`{"amount":100,"currency":"` + pad + `4111111111111111","payment_method":"pm_card_visa"}`,
		`{"amount":100,"currency":"usd","payment_method":"pm_card_visa","metadata":{"[٤١١١-١١١١-١١١١-١١١١]":"v"}}`,
		`{"amount":100,"currency":"usd","payment_method":"pm_card_visa","4111\t1111\t1111\t1111":1}`,
		`{"amount":100,"currency":"usd","payment_method":"pm_card_visa","` + pad + `4111111111111111":1}`,
		`{"amount":100,"currency":"usd","payment_method":"pm_card_visa","4111111111111111":1,"4111111111111111":2}`,
	} {
		r := w.post("pan-problem", body)
		if r.status < 400 {
			t.Errorf("%s: status %d", body, r.status)
		}
		if start, end, ok := redact.FindPAN(string(r.body)); ok || strings.Contains(string(r.body), "4111111111111") {
			t.Errorf("%s: the answer quotes %q:\n%s", body, string(r.body)[start:end], r.body)
		}
	}
}
