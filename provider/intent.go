package provider

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
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

// DeclineAuthenticationRequired is the decline code of a charge that needed
// the customer to authenticate (3-D Secure): Stripe's own code for the 402 it
// sends off-session, and the code we record for an on-session intent left
// requires_action that the adapter canceled.
const DeclineAuthenticationRequired = "authentication_required"

// ErrForeignIntent is wrapped, in an *Error of ClassUnknown, when a lookup
// met an intent that is not the key's own: its metadata merchant_id or
// idempotency_key, its amount or its currency differ from the row's. The
// row must not be completed from it, nor marked not charged; it waits for
// a person.
var ErrForeignIntent = errors.New("foreign payment intent")

// IntentFacts are the fields of a provider's intent that say whose it is.
type IntentFacts struct {
	ID                         string
	MerchantID, IdempotencyKey string
	Amount                     int64
	Currency                   string
}

// CheckIntent returns nil when in can be req's intent: the same metadata
// merchant_id and idempotency_key (when req names them), amount (when
// req.Amount is not 0) and currency (when req.Currency is not empty). Else it
// returns an *Error of ClassUnknown wrapping ErrForeignIntent that names
// what differs.
func CheckIntent(req LookupRequest, in IntentFacts) error {
	var diffs []string
	if req.MerchantID != "" && in.MerchantID != req.MerchantID {
		diffs = append(diffs, fmt.Sprintf("metadata merchant_id %q", in.MerchantID))
	}
	if req.IdempotencyKey != "" && in.IdempotencyKey != req.IdempotencyKey {
		diffs = append(diffs, fmt.Sprintf("metadata idempotency_key %q", in.IdempotencyKey))
	}
	if req.Amount != 0 && in.Amount != req.Amount {
		diffs = append(diffs, fmt.Sprintf("amount %d, not %d", in.Amount, req.Amount))
	}
	if req.Currency != "" && !strings.EqualFold(in.Currency, req.Currency) {
		diffs = append(diffs, fmt.Sprintf("currency %q, not %q", in.Currency, req.Currency))
	}
	if len(diffs) == 0 {
		return nil
	}
	return &Error{Class: ClassUnknown,
		Message: fmt.Sprintf("payment intent %s belongs to another key (%s)", in.ID, strings.Join(diffs, ", ")),
		Err:     ErrForeignIntent}
}

// CancelKey is the idempotency key under which an adapter cancels the
// intent intentID that a charge under providerKey left requiring action:
// derived from both, so a repeated cancel (a redelivery, the reconciler)
// replays the first, and never equal to the charge's own key.
func CancelKey(providerKey, intentID string) string {
	h := sha256.New()
	h.Write([]byte("paydedup/cancel-key/v1\x00"))
	h.Write([]byte(providerKey))
	h.Write([]byte{0})
	h.Write([]byte(intentID))
	return "pdc_" + hex.EncodeToString(h.Sum(nil))
}
