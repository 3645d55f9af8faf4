package provider

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// The operations after a charge: capture or cancel an authorization (a
// charge sent with ChargeRequest.ManualCapture), refund a captured payment.
// Each is sent under a provider idempotency key of its own, derived and
// stored by the caller before the first call like a charge's, and each
// answers in the charge's classes: a settled outcome (done, or Refused: the
// provider's definitive no), or an *Error of ClassUnknown (it may have
// acted: look it up before any re-call past the key's window),
// ClassRetryable (rate limits among them), ClassMismatch, ClassRejected or
// ClassUnauthorized. Their lookups never act: RetrieveIntent for a capture
// or a cancel, a refund found by its metadata among the payment's refunds.
// The package that calls them declares the interface it needs (a
// Capturer, a Refunder); the adapters implement these methods.

// Intent statuses an authorization moves through (Stripe's words).
const (
	StatusRequiresCapture = "requires_capture"
	StatusSucceeded       = "succeeded"
	StatusCanceled        = "canceled"
)

// Refund statuses (Stripe's): pending and requires_action are not final;
// a pending refund may still fail, which puts the money back.
const (
	RefundPending        = "pending"
	RefundSucceeded      = "succeeded"
	RefundFailed         = "failed"
	RefundCanceled       = "canceled"
	RefundRequiresAction = "requires_action"
)

// CaptureRequest captures all or part of an authorization.
type CaptureRequest struct {
	// ProviderKey is the capture's own idempotency key, never the
	// charge's.
	ProviderKey string
	// ChargeID is the authorized intent ("pi_...").
	ChargeID string
	// Amount is how much to capture, in minor units; 0 captures all that
	// is capturable. The rest of the authorization is released: a provider
	// without multicapture (Stripe's default) captures once.
	Amount int64
	// MerchantID is the payment's merchant: not sent, it draws the call
	// from the merchant's share of the fleet's budget.
	MerchantID string
}

// CancelRequest voids an authorization (or an intent not yet finished).
type CancelRequest struct {
	// ProviderKey is the cancel's own idempotency key.
	ProviderKey string
	// ChargeID is the intent to cancel.
	ChargeID string
	// Reason is Stripe's cancellation_reason (duplicate, fraudulent,
	// requested_by_customer, abandoned); empty sends none.
	Reason string
	// MerchantID is the payment's merchant, for the budget (not sent).
	MerchantID string
}

// IntentOutcome is an intent as a capture, a cancel or RetrieveIntent left
// it: its status and its sums say whether a capture or a cancel happened.
type IntentOutcome struct {
	// ChargeID is the intent's id; Status its status (requires_capture,
	// succeeded, canceled, ...).
	ChargeID string
	Status   string
	// Amount is what was authorized or charged; AmountCapturable what can
	// still be captured; AmountReceived what was captured (all minor units).
	Amount, AmountCapturable, AmountReceived int64
	// Refused is the provider's definitive no (the intent was already
	// captured or canceled, its authorization expired, the amount is too
	// large): nothing happened, and the same request will never succeed.
	// RefusalCode is the provider's code (payment_intent_unexpected_state,
	// amount_too_large, ...).
	Refused     bool
	RefusalCode string
	// HTTPStatus and Response are the provider's answer, to store and replay.
	HTTPStatus int
	Response   json.RawMessage
	// Replayed reports an answer from the provider's idempotency cache.
	Replayed bool
}

// Captured reports whether the intent was captured (in part or in full).
func (o *IntentOutcome) Captured() bool { return o.Status == StatusSucceeded }

// RetrieveIntentRequest names the intent a lookup after a capture or a
// cancel retrieves; it never acts.
type RetrieveIntentRequest struct {
	ChargeID string
	// MerchantID is the payment's merchant, for the budget (not sent).
	MerchantID string
}

// RefundRequest refunds all or part of a captured payment. Several partial
// refunds of one payment are allowed, each under its own keys.
type RefundRequest struct {
	// ProviderKey is the refund's own idempotency key.
	ProviderKey string
	// ChargeID is the payment intent to refund.
	ChargeID string
	// Amount is how much to refund, in minor units; 0 refunds all that is
	// left.
	Amount int64
	// MerchantID and IdempotencyKey are the refund's own (not the
	// payment's): they go in the refund's metadata, which is how
	// LookupRefund finds it.
	MerchantID     string
	IdempotencyKey string
	// Metadata is the command's own; merchant_id and idempotency_key win.
	Metadata map[string]string
}

// RefundMetadata is the metadata a refund is sent with: the command's, then
// merchant_id and idempotency_key, which win.
func RefundMetadata(r RefundRequest) map[string]string {
	md := make(map[string]string, len(r.Metadata)+2)
	for k, v := range r.Metadata {
		md[k] = v
	}
	md[MetadataMerchantID] = r.MerchantID
	md[MetadataIdempotencyKey] = r.IdempotencyKey
	return md
}

// RefundOutcome is a refund as the provider answered it.
type RefundOutcome struct {
	// RefundID is the provider's id ("re_..."), empty when Refused.
	RefundID string
	// ChargeID is the refunded payment intent.
	ChargeID string
	// Status is pending, succeeded, failed, canceled or requires_action;
	// only succeeded, failed and canceled are final.
	Status string
	// Amount is the refund's amount in minor units.
	Amount int64
	// FailureReason is the provider's reason for a failed refund.
	FailureReason string
	// MerchantID and IdempotencyKey are the refund's metadata.
	MerchantID, IdempotencyKey string
	// Refused is the provider's definitive no (more than is left to
	// refund, a payment not captured, ...): no refund was made.
	Refused     bool
	RefusalCode string
	// HTTPStatus and Response are the provider's answer.
	HTTPStatus int
	Response   json.RawMessage
	Replayed   bool
}

// Final reports whether the refund's status will not change.
func (o *RefundOutcome) Final() bool {
	return o.Refused || o.Status == RefundSucceeded || o.Status == RefundFailed || o.Status == RefundCanceled
}

// Holds reports whether the refund counts against what is left to refund:
// a succeeded one, and one not yet final (it may still succeed). A failed
// or canceled refund puts the money back.
func (o *RefundOutcome) Holds() bool {
	return !o.Refused && o.Status != RefundFailed && o.Status != RefundCanceled
}

// RefundLookupRequest names the refund a lookup after an unknown outcome
// finds: the payment's refunds are listed (never searched: Stripe's Search
// covers no refunds, and a payment's list is read from the source, not from
// an eventually consistent index) and matched on metadata.
type RefundLookupRequest struct {
	// ChargeID is the refunded payment intent.
	ChargeID string
	// MerchantID and IdempotencyKey are the refund's metadata.
	MerchantID, IdempotencyKey string
	// Amount, when not 0, must be the refund's: one with our metadata and
	// another amount is someone else's (ErrForeignIntent).
	Amount int64
}

// RefundLookupResult is what the provider holds under a refund's key.
type RefundLookupResult struct {
	// Found is false when the payment has no refund with the metadata: the
	// refund was never made (the list is not lagged).
	Found   bool
	Outcome *RefundOutcome
}

// RefundVerdict is LookupRefund's answer from the refunds of req's payment:
// the one with req's metadata; none is not found; two are a ClassUnknown
// error (a refund made twice, never hidden); one of another amount is a
// ClassUnknown error wrapping ErrForeignIntent.
func RefundVerdict(req RefundLookupRequest, refunds []*RefundOutcome) (RefundLookupResult, error) {
	var mine []*RefundOutcome
	for _, r := range refunds {
		if r.MerchantID == req.MerchantID && r.IdempotencyKey == req.IdempotencyKey {
			mine = append(mine, r)
		}
	}
	switch {
	case len(mine) == 0:
		return RefundLookupResult{}, nil
	case len(mine) > 1:
		ids := make([]string, len(mine))
		for i, r := range mine {
			ids[i] = r.RefundID
		}
		return RefundLookupResult{}, &Error{Class: ClassUnknown, Message: "multiple refunds under one key: " + strings.Join(ids, ", ")}
	case req.Amount != 0 && mine[0].Amount != req.Amount:
		return RefundLookupResult{}, &Error{Class: ClassUnknown,
			Message: fmt.Sprintf("refund %s belongs to another key (amount %d, not %d)", mine[0].RefundID, mine[0].Amount, req.Amount),
			Err:     ErrForeignIntent}
	}
	return RefundLookupResult{Found: true, Outcome: mine[0]}, nil
}

// RefusalCodes are the provider's codes for a definitive no to a capture,
// a cancel or a refund, answered as a 400 invalid_request_error: the
// request was well formed and the payment's state forbids it. Any other
// 400 stays ClassRejected (our request is wrong).
var RefusalCodes = []string{
	"payment_intent_unexpected_state",
	"amount_too_large",
	"charge_already_refunded",
	"charge_already_captured",
	"charge_expired_for_capture",
	"charge_disputed",
}

// Refusal is a capture's, cancel's or refund's answer to r: the refusal
// code when the provider definitively refused (a 402, or a 400 with one of
// RefusalCodes), else the *Error of the charge path's classification.
func (r *Rejection) Refusal() (code string, err error) {
	class := r.class()
	switch {
	case class == ClassDeclined:
		return cmp.Or(r.DeclineCode, r.Code, "declined"), nil
	case class == ClassRejected && slices.Contains(RefusalCodes, r.Code):
		return r.Code, nil
	}
	return "", r.error(class)
}
