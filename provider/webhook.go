package provider

import "errors"

// Event is a provider's signed notification that one of its payment
// objects changed (a Stripe webhook event), as an adapter verified and
// read it.
type Event struct {
	// ID is the provider's event id ("evt_..."); a redelivery carries the
	// same id.
	ID string
	// Type is the provider's event type ("payment_intent.succeeded").
	Type string
	// Intent says whose intent the event is about; its MerchantID and
	// IdempotencyKey are empty for an intent paydedup did not create.
	Intent IntentFacts
	// Outcome is the intent's outcome as the event's copy of it reads,
	// classified as a retrieve by id is (charged, processing or declined);
	// nil for an event type that says nothing about a payment's outcome.
	Outcome *Outcome
	// Refunds are the refunds the event is about, as its copy reads them
	// (a refund.updated: its refund; a charge.refunded: the refunds its
	// charge lists, if it lists them); nil for other types. A refund whose
	// metadata names no merchant and key is not one paydedup made.
	Refunds []*RefundOutcome
}

// ErrBadSignature is wrapped by an event verifier for a payload that is
// not the provider's: an absent or wrong signature, a signature too old to
// trust (a replay), or a body that cannot be read. Nothing in it is
// believed.
var ErrBadSignature = errors.New("webhook signature not verified")
