package provider

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Metadata keys the adapters always set on a charge; they win over the
// command's own metadata so that a lookup can find the charge again.
const (
	MetadataMerchantID     = "merchant_id"
	MetadataIdempotencyKey = "idempotency_key"
)

// KeyLifetime is how long the provider is trusted to remember an
// idempotency key and replay its first answer: Stripe keeps keys for at
// least 24 hours. A request under a key it has forgotten runs again, so a
// blind call (without a lookup first) is safe only while the key is younger.
const KeyLifetime = 24 * time.Hour

// MaxProviderKeyLen is the longest provider idempotency key Stripe accepts.
const MaxProviderKeyLen = 255

// CheckProviderKey rejects a provider key that a provider would refuse or
// silently alter (stripe-go trims spaces): empty, longer than
// MaxProviderKeyLen, or with leading or trailing space. Its error is an
// *Error of ClassMismatch wrapping ErrInvalidRequest.
func CheckProviderKey(k string) error {
	switch {
	case k == "":
		return &Error{Class: ClassMismatch, Message: "provider key is empty", Err: ErrInvalidRequest}
	case len(k) > MaxProviderKeyLen:
		return &Error{Class: ClassMismatch, Message: fmt.Sprintf("provider key is longer than %d bytes", MaxProviderKeyLen), Err: ErrInvalidRequest}
	case strings.TrimSpace(k) != k:
		return &Error{Class: ClassMismatch, Message: "provider key has leading or trailing space", Err: ErrInvalidRequest}
	}
	return nil
}

// ChargeRequest is what paydedup asks the provider to do for one command.
type ChargeRequest struct {
	// ProviderKey is sent as the provider's idempotency key (Stripe's
	// Idempotency-Key header). It must be the same on every call for one
	// command.
	ProviderKey string
	// MerchantID scopes IdempotencyKey; it goes in metadata["merchant_id"].
	MerchantID string
	// IdempotencyKey is paydedup's own key; it goes in
	// metadata["idempotency_key"].
	IdempotencyKey string
	// Amount is in minor units (cents).
	Amount int64
	// Currency is a three-letter lower-case ISO code such as "usd".
	Currency string
	// PaymentMethod is the provider's payment method id, e.g. "pm_card_visa".
	PaymentMethod string
	// Description is shown on the provider's dashboard; optional.
	Description string
	// Metadata is the command's own metadata; merchant_id and idempotency_key
	// are added and override keys of the same name.
	Metadata map[string]string
	// OnSession asks for an on-session charge (the customer is present and
	// can authenticate). The default, false, charges off-session: Stripe
	// then answers a need for authentication with a 402
	// authentication_required decline instead of leaving the intent open.
	OnSession bool
	// ManualCapture authorizes instead of charging (Stripe's
	// capture_method=manual): a card answer leaves the intent
	// requires_capture, reported as an Outcome with Authorized set, until
	// a Capture moves the money or a Cancel (or the provider, when the
	// authorization expires) releases it.
	ManualCapture bool
}

// Outcome is a settled result of a charge: charged, declined, or processing
// (the provider accepted it and money may still move; only a later lookup by
// ChargeID tells how it ended).
type Outcome struct {
	// ChargeID is the provider's object id ("pi_..."); it may be empty for a
	// rejection that created no object (HTTPStatus 400).
	ChargeID string
	// Status is the provider's status ("succeeded",
	// "requires_payment_method", ...), empty when no object exists.
	Status string
	// Declined reports a definitive business failure; the charge did not
	// happen and must not be retried.
	Declined bool
	// DeclineCode is the provider's reason when Declined: Stripe's
	// decline_code, else its code ("generic_decline", "card_declined",
	// "authentication_required", ...), never its error type.
	DeclineCode string
	// Processing reports an intent accepted but not finished (asynchronous
	// methods such as bank debits): it must never be charged again under
	// the key, and it ends succeeded or failed later. ChargeID is set.
	Processing bool
	// Authorized reports an intent left requires_capture: the money is
	// held, not moved, until a capture; AmountCapturable is how much.
	// HTTPStatus is 200, as for a charge.
	Authorized       bool
	AmountCapturable int64
	// HTTPStatus is the status to store and replay: 200 for charged, 202
	// for processing (accepted, not finished), 402 for declined.
	HTTPStatus int
	// Response is the provider's exact response body, stored and replayed to
	// duplicates.
	Response json.RawMessage
	// Replayed reports that the provider answered from its idempotency cache
	// (Idempotent-Replayed: true): an earlier call with this key already ran.
	Replayed bool
}

// LookupRequest names the key whose fate Lookup should find.
type LookupRequest struct {
	// ProviderKey is the provider idempotency key used for the charge; kept
	// for logging and for providers that can search by it (Stripe cannot).
	ProviderKey string
	// MerchantID and IdempotencyKey are searched in the charge's metadata.
	MerchantID     string
	IdempotencyKey string
	// ChargeID, when known, is retrieved directly instead of searching.
	ChargeID string
	// Amount and Currency are the row's: a search hit whose amount or
	// currency differ is someone else's intent and never counts (0 and ""
	// skip the check, for callers that do not know them).
	Amount   int64
	Currency string
}

// LookupResult is what the provider knows about a key.
type LookupResult struct {
	// Found is false when the provider has no charge under the key as far as
	// its (eventually consistent) search knows now.
	Found bool
	// Outcome is set when Found: a charge, a declined intent (Declined) or
	// one still processing (Processing).
	Outcome *Outcome
}

// Charger is the one method ChargeWithRetry needs; every Provider is one.
type Charger interface {
	// Charge asks the provider to charge once; see Provider.Charge.
	Charge(ctx context.Context, req ChargeRequest) (*Outcome, error)
}

// Provider charges and looks up charges at a payment provider.
type Provider interface {
	// Charge asks the provider to charge req under req.ProviderKey. It
	// returns an Outcome when the result is definitive (charged or declined)
	// and an *Error otherwise.
	Charge(ctx context.Context, req ChargeRequest) (*Outcome, error)
	// Lookup reports, without charging, what the provider has under the key.
	// It returns an *Error when it could not tell.
	Lookup(ctx context.Context, req LookupRequest) (LookupResult, error)
}
