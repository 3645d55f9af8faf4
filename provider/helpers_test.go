package provider_test

import "github.com/paydedup/paydedup/lab/providertest"

// The provider tests' shared helpers (lab/providertest).
var (
	chargeReq = providertest.ChargeReq
	wantClass = providertest.WantClass
)
