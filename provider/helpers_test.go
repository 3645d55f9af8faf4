package provider_test

import "github.com/paydedup/paydedup/internal/providertest"

// The provider tests' shared helpers (internal/providertest).
var (
	chargeReq = providertest.ChargeReq
	wantClass = providertest.WantClass
)
