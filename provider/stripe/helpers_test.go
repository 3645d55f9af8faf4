package stripe_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripesim"
)

// chargeReq is a valid request for key; tests change what they need.
func chargeReq(key string) provider.ChargeRequest {
	return provider.ChargeRequest{
		ProviderKey:    "pdk_" + key,
		MerchantID:     "m_123",
		IdempotencyKey: key,
		Amount:         1999,
		Currency:       "usd",
		PaymentMethod:  "pm_card_visa",
		Description:    "order 42",
		Metadata:       map[string]string{"order_id": "42"},
	}
}

func mustCharge(t *testing.T, p provider.Provider, req provider.ChargeRequest) *provider.Outcome {
	t.Helper()
	out, err := p.Charge(context.Background(), req)
	if err != nil {
		t.Fatalf("charge %s: %v", req.ProviderKey, err)
	}
	return out
}

func wantClass(t *testing.T, err error, want provider.Class) *provider.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("err = nil, want class %s", want)
	}
	var pe *provider.Error
	if !errors.As(err, &pe) {
		t.Fatalf("err = %v (%T), want *provider.Error", err, err)
	}
	if got := provider.ClassOf(err); got != want {
		t.Fatalf("class = %s, want %s (err: %v)", got, want, err)
	}
	return pe
}

// simServer starts a simulator behind httptest.
func simServer(t *testing.T, cfg stripesim.Config) (*stripesim.Simulator, *httptest.Server) {
	t.Helper()
	sim := stripesim.New(cfg)
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	return sim, srv
}

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
