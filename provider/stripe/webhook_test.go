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
