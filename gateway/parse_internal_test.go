package gateway

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/paydedup/paydedup/payment"
)

func TestParseWait(t *testing.T) {
	t.Parallel()
	cases := []struct {
		prefer []string
		want   time.Duration
	}{
		{nil, 0},
		{[]string{"wait=10"}, 10 * time.Second},
		{[]string{"respond-async, wait=5"}, 5 * time.Second},
		{[]string{"return=minimal", "Wait = 7 ; foo=bar"}, 7 * time.Second},
		{[]string{`wait="3"`}, 3 * time.Second},
		{[]string{"wait=100"}, 30 * time.Second},
		{[]string{"wait=99999999999999999999"}, 0},
		{[]string{"wait=-1"}, 0},
		{[]string{"wait=soon"}, 0},
		{[]string{"waiting=4"}, 0},
	}
	for _, c := range cases {
		h := http.Header{}
		for _, v := range c.prefer {
			h.Add("Prefer", v)
		}
		if got := parseWait(h, 30*time.Second); got != c.want {
			t.Errorf("Prefer %q: %v, want %v", c.prefer, got, c.want)
		}
	}
}

func TestDecodeCommandInjectsMerchant(t *testing.T) {
	t.Parallel()
	lim := payment.Limits{MaxBodyBytes: 200}
	cmd, err := decodeCommand([]byte(` {"amount":5,"currency":"eur","payment_method":"pm_x"}`), "m_1", "k", lim)
	if err != nil {
		t.Fatal(err)
	}
	if cmd.MerchantID != "m_1" || cmd.IdempotencyKey != "k" || cmd.Amount != 5 {
		t.Fatalf("%+v", cmd)
	}
	cases := []struct {
		body   string
		reason payment.Reason
		field  string
	}{
		{`{}`, payment.ReasonInvalidAmount, "amount"},
		{`{ }`, payment.ReasonInvalidAmount, "amount"},
		{`{,}`, payment.ReasonMalformedJSON, ""},
		{`{"merchant_id":"m_1","amount":5}`, payment.ReasonUnknownField, "merchant_id"},
		{`"str"`, payment.ReasonMalformedJSON, ""},
		{``, payment.ReasonMalformedJSON, ""},
		{`{"amount":5,"currency":"eur","payment_method":"pm_x"}{}`, payment.ReasonMalformedJSON, ""},
	}
	for _, c := range cases {
		_, err := decodeCommand([]byte(c.body), "m_1", "k", lim)
		var ve *payment.ValidationError
		if !errors.As(err, &ve) || ve.Reason != c.reason || ve.Field != c.field {
			t.Errorf("%q: %v, want %s on %q", c.body, err, c.reason, c.field)
		}
	}
	// The body limit applies to what the client sent, not to the merchant
	// put in front of it.
	body := []byte(`{"amount":5,"currency":"eur","payment_method":"pm_x","description":"` + string(make([]byte, 0)) + `"}`)
	if _, err := decodeCommand(body, "m_1", "k", payment.Limits{MaxBodyBytes: len(body)}); err != nil {
		t.Fatalf("a body at the limit was refused: %v", err)
	}
}
