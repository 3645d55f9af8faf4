package provider_test

import (
	"errors"
	"testing"

	"github.com/paydedup/paydedup/provider"
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
