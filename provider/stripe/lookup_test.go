package stripe_test

import (
	"context"
	"testing"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
)

// TestStripeLookupByIDChecksMerchant: a charge id that belongs to the same
// idempotency key of another merchant is never taken for this merchant's
// payment (the reconciler would complete the row with another merchant's
// charge).
func TestStripeLookupByIDChecksMerchant(t *testing.T) {
	t.Parallel()
	_, srv := simServer(t, stripesim.Config{})
	s := newStripe(t, stripe.Config{APIBase: srv.URL})
	req := chargeReq("k-lookup-merchant")
	charged := mustCharge(t, s, req)
	res, err := s.Lookup(context.Background(), provider.LookupRequest{
		MerchantID: "m_other", IdempotencyKey: req.IdempotencyKey, ChargeID: charged.ChargeID})
	wantClass(t, err, provider.ClassUnknown)
	if res.Found {
		t.Fatalf("another merchant's charge found: %+v", res.Outcome)
	}
	res, err = s.Lookup(context.Background(), provider.LookupRequest{
		MerchantID: req.MerchantID, IdempotencyKey: req.IdempotencyKey, ChargeID: charged.ChargeID})
	if err != nil || !res.Found || res.Outcome.ChargeID != charged.ChargeID {
		t.Fatalf("own charge by id: %+v %v", res, err)
	}
}
