package stripe_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
)

// STRIPE_WEBHOOK_SECRET's list: an empty entry, a repeat or too many are
// refused, by position, never quoting a secret.
func TestParseWebhookSecrets(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"whsec_a", "whsec_new,whsec_old", " whsec_new , whsec_old "} {
		if _, err := stripe.ParseWebhookSecrets(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", " ", "whsec_a,", ",whsec_a", "whsec_a,,whsec_b", "whsec_a,whsec_a", "a,b,c,d,e"} {
		_, err := stripe.ParseWebhookSecrets(bad)
		if !errors.Is(err, provider.ErrInvalidConfig) {
			t.Errorf("%q: %v, want ErrInvalidConfig", bad, err)
			continue
		}
		if strings.Contains(err.Error(), "whsec_a") {
			t.Errorf("%q: the error quotes a secret: %v", bad, err)
		}
	}
}

// An event verifies with any of the verifier's secrets, signed by one or
// by each (Stripe during a roll); with none of them it does not.
func TestWebhookVerifierSeveralSecrets(t *testing.T) {
	t.Parallel()
	v, err := stripe.NewWebhookVerifier("whsec_new,whsec_old", 0)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"id":"evt_1","object":"event","api_version":"` + stripesim.WebhookAPIVersion + `","type":"payment_intent.created","data":{"object":{}}}`)
	now := time.Now()
	both := stripesim.SignWebhook(body, "whsec_old", now)
	_, v1New, _ := strings.Cut(stripesim.SignWebhook(body, "whsec_new", now), ",")
	both += "," + v1New
	for name, sig := range map[string]string{
		"old": stripesim.SignWebhook(body, "whsec_old", now), "new": stripesim.SignWebhook(body, "whsec_new", now), "both": both,
	} {
		if ev, err := v.Verify(body, sig); err != nil || ev.ID != "evt_1" {
			t.Errorf("signed with %s: %+v %v", name, ev, err)
		}
	}
	if _, err := v.Verify(body, stripesim.SignWebhook(body, "whsec_other", now)); !errors.Is(err, provider.ErrBadSignature) {
		t.Errorf("another secret: %v, want ErrBadSignature", err)
	}
}

// CheckSignature reads the header as stripe-go does and refuses, before
// any body is read, what Verify would refuse for the header alone.
func TestWebhookCheckSignature(t *testing.T) {
	t.Parallel()
	v, err := stripe.NewWebhookVerifier("whsec_a", 0)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().Unix()
	sig := strings.Repeat("ab", 32)
	if err := v.CheckSignature(fmt.Sprintf("t=%d,v1=%s,v0=x,scheme=y", now, sig)); err != nil {
		t.Fatalf("a well-formed header: %v", err)
	}
	for name, c := range map[string]struct {
		header string
		want   error
	}{
		"absent":            {"", stripe.ErrSignatureHeader},
		"two t=":            {fmt.Sprintf("t=%d,t=%d,v1=%s", now, now, sig), stripe.ErrSignatureHeader},
		"no t=":             {"v1=" + sig, stripe.ErrSignatureHeader},
		"no v1=":            {fmt.Sprintf("t=%d,v0=%s", now, sig), stripe.ErrSignatureHeader},
		"v1 not hex":        {fmt.Sprintf("t=%d,v1=zz", now), stripe.ErrSignatureHeader},
		"a pair with two =": {fmt.Sprintf("t=%d,v1=%s=", now, sig), stripe.ErrSignatureHeader},
		"t not a number":    {"t=soon,v1=" + sig, stripe.ErrSignatureHeader},
		"six minutes ahead": {fmt.Sprintf("t=%d,v1=%s", now+360, sig), stripe.ErrSignedAhead},
		"six minutes ago":   {fmt.Sprintf("t=%d,v1=%s", now-360, sig), stripe.ErrSignedTooLongAgo},
		"t= with a space":   {fmt.Sprintf("t=%d, t=%d,v1=%s", now, now+3600, sig), nil},
	} {
		err := v.CheckSignature(c.header)
		if c.want == nil {
			// " t=" is no t= to stripe-go either: one t=, accepted
			// here and verified with that one.
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			continue
		}
		if !errors.Is(err, c.want) || !errors.Is(err, provider.ErrBadSignature) {
			t.Errorf("%s: %v, want %v and ErrBadSignature", name, err, c.want)
		}
	}
}

// Refund events carry their refunds: refund.updated and
// charge.refund.updated the refund (its own JSON kept as the response),
// charge.refunded the refunds its charge lists, none when it lists none; a
// refund in a status the adapter does not know is left out.
func TestWebhookRefundEvents(t *testing.T) {
	t.Parallel()
	v, err := stripe.NewWebhookVerifier("whsec_a", 0)
	if err != nil {
		t.Fatal(err)
	}
	re := func(id, status string) string {
		return `{"id":"` + id + `","object":"refund","status":"` + status + `","amount":500,"payment_intent":"pi_1",` +
			`"failure_reason":"lost_or_stolen_card","metadata":{"merchant_id":"m_1","idempotency_key":"r-` + id + `"}}`
	}
	event := func(typ, object string) []byte {
		return []byte(`{"id":"evt_1","object":"event","api_version":"` + stripesim.WebhookAPIVersion + `","type":"` + typ +
			`","data":{"object":` + object + `}}`)
	}
	verify := func(body []byte) provider.Event {
		t.Helper()
		ev, err := v.Verify(body, stripesim.SignWebhook(body, "whsec_a", time.Now()))
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		return ev
	}
	for _, typ := range []string{stripe.EventRefundUpdated, stripe.EventRefundFailed, stripe.EventChargeRefundUpdated} {
		ev := verify(event(typ, re("re_1", "failed")))
		if len(ev.Refunds) != 1 {
			t.Fatalf("%s: %+v", typ, ev)
		}
		got := ev.Refunds[0]
		if got.RefundID != "re_1" || got.ChargeID != "pi_1" || got.Status != provider.RefundFailed || got.Amount != 500 ||
			got.FailureReason != "lost_or_stolen_card" || got.MerchantID != "m_1" || got.IdempotencyKey != "r-re_1" || len(got.Response) == 0 {
			t.Fatalf("%s: refund %+v", typ, got)
		}
	}
	ev := verify(event(stripe.EventChargeRefunded, `{"id":"ch_1","object":"charge","payment_intent":"pi_1","refunds":{"object":"list","data":[`+
		re("re_1", "succeeded")+`,`+re("re_2", "pending")+`,`+re("re_3", "weird")+`]}}`))
	if len(ev.Refunds) != 2 || ev.Refunds[0].Status != provider.RefundSucceeded || ev.Refunds[1].Status != provider.RefundPending {
		t.Fatalf("charge.refunded: %+v", ev.Refunds)
	}
	if ev := verify(event(stripe.EventChargeRefunded, `{"id":"ch_1","object":"charge","payment_intent":"pi_1"}`)); ev.Refunds != nil {
		t.Fatalf("charge.refunded without its refunds: %+v", ev.Refunds)
	}
	if ev := verify(event(stripe.EventRefundUpdated, re("re_1", "weird"))); ev.Refunds != nil {
		t.Fatalf("a refund of an unknown status: %+v", ev.Refunds)
	}
}
