package stripe

import (
	"math/rand/v2"
	"testing"

	stripego "github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/form"

	"github.com/paydedup/paydedup/provider"
)

// stripeGoForm is the body stripe-go's V1PaymentIntents.Create sends for
// req.
func stripeGoForm(req provider.ChargeRequest) string {
	v := &form.Values{}
	form.AppendTo(v, stripeCreateParams(req))
	return v.Encode()
}

// stripeCreateParams is the PaymentIntent create the adapter sends for req,
// as stripe-go's parameters: Charge writes their form itself
// (appendChargeForm), and the tests check it against stripe-go's.
func stripeCreateParams(req provider.ChargeRequest) *stripego.PaymentIntentCreateParams {
	params := &stripego.PaymentIntentCreateParams{
		Amount:        stripego.Int64(req.Amount),
		Currency:      stripego.String(req.Currency),
		PaymentMethod: stripego.String(req.PaymentMethod),
		// The account's enabled methods (cards, bank debits), but none that
		// redirects: an intent with no customer present confirms
		// server-side without a return_url.
		AutomaticPaymentMethods: &stripego.PaymentIntentCreateAutomaticPaymentMethodsParams{
			Enabled:        stripego.Bool(true),
			AllowRedirects: stripego.String("never"),
		},
		Confirm: stripego.Bool(true),
		// Off-session: Stripe declines (402 authentication_required) what
		// would need the absent customer to authenticate.
		OffSession: stripego.Bool(!req.OnSession),
		Metadata:   chargeMetadata(req),
	}
	if req.Description != "" {
		params.Description = stripego.String(req.Description)
	}
	if req.ManualCapture {
		params.CaptureMethod = stripego.String(string(stripego.PaymentIntentCaptureMethodManual))
	}
	params.SetIdempotencyKey(req.ProviderKey)
	return params
}

// TestChargeFormIsStripeGos: the body Charge builds is the one stripe-go
// would send, byte for byte, for awkward values too. A retry of a charge
// made by an older release then sends the same parameters under the same
// idempotency key (Stripe answers 400 idempotency_error to other ones).
func TestChargeFormIsStripeGos(t *testing.T) {
	t.Parallel()
	awkward := []string{"", "k", "a b", "k[1]", "]", "[", "a]b[c", "x&y=z", "100%", "ü€", "a+b", "~._-", "%5B", "tab\tnl\n", "'\"<>"}
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func() string {
		s := awkward[rng.IntN(len(awkward))]
		if rng.IntN(3) == 0 {
			s += awkward[rng.IntN(len(awkward))]
		}
		return s
	}
	for i := range 5000 {
		req := provider.ChargeRequest{
			MerchantID: "m_" + pick(), IdempotencyKey: "k" + pick(), ProviderKey: "pk",
			Amount: rng.Int64N(100_000_000), Currency: []string{"usd", "eur", "jpy"}[rng.IntN(3)],
			PaymentMethod: "pm_" + pick(), Description: pick(), OnSession: rng.IntN(2) == 0,
			ManualCapture: rng.IntN(2) == 0,
		}
		if n := rng.IntN(4); n > 0 {
			req.Metadata = map[string]string{}
			for range n {
				req.Metadata[pick()] = pick()
			}
		}
		if got, want := string(appendChargeForm(nil, req)), stripeGoForm(req); got != want {
			t.Fatalf("request %d %+v:\nbuilt     %s\nstripe-go %s", i, req, got, want)
		}
	}
}

// FuzzChargeFormIsStripeGos is TestChargeFormIsStripeGos over any strings.
func FuzzChargeFormIsStripeGos(f *testing.F) {
	f.Add("m_1", "order-42", "pm_card_visa", "order 42", "trace_id", "abc", int64(1999), false)
	f.Add("m", "k[1]", "pm", "", "a]b", "%5D", int64(0), true)
	f.Fuzz(func(t *testing.T, merchant, key, pm, desc, mdKey, mdValue string, amount int64, onSession bool) {
		req := provider.ChargeRequest{MerchantID: merchant, IdempotencyKey: key, PaymentMethod: pm, Description: desc,
			Amount: amount, Currency: "usd", OnSession: onSession, Metadata: map[string]string{mdKey: mdValue}}
		if got, want := string(appendChargeForm(nil, req)), stripeGoForm(req); got != want {
			t.Fatalf("%+v:\nbuilt     %s\nstripe-go %s", req, got, want)
		}
	})
}
