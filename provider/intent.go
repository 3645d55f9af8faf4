package provider

import (
	"errors"
	"time"
)

// Intent is one payment object as the provider lists it (a Stripe
// PaymentIntent): what an audit compares with the ledger. MerchantID and
// IdempotencyKey come from the metadata the adapters set on every charge;
// they are empty on an object paydedup did not create.
type Intent struct {
	// ID is the provider's object id ("pi_...").
	ID string `json:"id"`
	// Status is the provider's status: "succeeded", "processing",
	// "requires_payment_method", "canceled", ...
	Status string `json:"status"`
	// Amount is in minor units; Currency is lower-case ISO.
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	// MerchantID and IdempotencyKey are metadata merchant_id and
	// idempotency_key.
	MerchantID     string `json:"merchant_id,omitempty"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// Created is when the provider created it (whole seconds at Stripe).
	Created time.Time `json:"created"`
}

// Ours reports whether the intent carries paydedup's metadata.
func (i Intent) Ours() bool { return i.MerchantID != "" && i.IdempotencyKey != "" }

// Charged reports whether money moved (or is held for capture) under the
// intent: the statuses Lookup reports as a charge.
func (i Intent) Charged() bool { return i.Status == "succeeded" || i.Status == "requires_capture" }

// ListRequest selects the intents created in [From, To). Stripe filters
// on whole seconds: the adapters widen From down and To up to a second, so
// a list may hold intents up to a second outside; callers that care filter
// on Created.
type ListRequest struct {
	From, To time.Time
	// StartingAfter, when set, resumes a list after the intent with this
	// id (Stripe's starting_after), e.g. after a failed page.
	StartingAfter string
}

// ErrNoSuchIntent is returned (wrapped) by an intent retrieve when the
// provider has no object with that id.
var ErrNoSuchIntent = errors.New("no such payment intent")
