package stripe_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/lab/providertest"
)

// rawResp is a response read whole.
type rawResp struct {
	status int
	header http.Header
	body   []byte
}

// post sends a form-encoded POST the way stripe-go does.
func post(t *testing.T, srv *httptest.Server, path, auth, key string, form url.Values) rawResp {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if auth != "" {
		req.Header.Set("Authorization", "Bearer "+auth)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return do(t, srv, req)
}

func do(t *testing.T, srv *httptest.Server, req *http.Request) rawResp {
	t.Helper()
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return rawResp{resp.StatusCode, resp.Header, body}
}

func intentForm(amount string) url.Values {
	return url.Values{
		"amount":                    {amount},
		"currency":                  {"usd"},
		"payment_method":            {"pm_card_visa"},
		"confirm":                   {"true"},
		"payment_method_types[0]":   {"card"},
		"metadata[merchant_id]":     {"m_1"},
		"metadata[idempotency_key]": {"k1"},
	}
}

// The provider tests' shared helpers (lab/providertest).
var (
	chargeReq  = providertest.ChargeReq
	mustCharge = providertest.MustCharge
	wantClass  = providertest.WantClass
	simServer  = providertest.SimServer
)
