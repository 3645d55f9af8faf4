// Package providertest holds the helpers the provider packages' tests share:
// a valid charge request, a charge that must succeed, the class an error
// must have, and a simulator behind httptest. It is lab code, for tests
// only; the core never imports it (lab/layout checks).
package providertest

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider"
)

// ChargeReq is a valid request for key; tests change what they need.
func ChargeReq(key string) provider.ChargeRequest {
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

// MustCharge charges req and fails the test on any error.
func MustCharge(t testing.TB, p provider.Provider, req provider.ChargeRequest) *provider.Outcome {
	t.Helper()
	out, err := p.Charge(context.Background(), req)
	if err != nil {
		t.Fatalf("charge %s: %v", req.ProviderKey, err)
	}
	return out
}

// WantClass fails the test unless err is a *provider.Error of class want,
// and returns it.
func WantClass(t testing.TB, err error, want provider.Class) *provider.Error {
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

// SimServer starts a simulator behind httptest, closed when the test ends.
func SimServer(t testing.TB, cfg stripesim.Config) (*stripesim.Simulator, *httptest.Server) {
	t.Helper()
	sim := stripesim.New(cfg)
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	return sim, srv
}
