package provider

import (
	"cmp"
	"encoding/json"
	"strings"
	"time"
)

// Rejection is an error answer from a provider's API, as an adapter reads it:
// the status and the provider's error fields. Its methods are the one mapping
// of such an answer to what Charge and Lookup return, shared by every
// implementation that speaks to a Stripe-compatible API.
type Rejection struct {
	// HTTPStatus is the answer's status code.
	HTTPStatus int
	// Type, Code, DeclineCode and Message are the provider's error fields.
	Type, Code, DeclineCode, Message string
	// RetryAfter is the provider's Retry-After hint, 0 when none.
	RetryAfter time.Duration
	// RateLimitReason is the Stripe-Rate-Limited-Reason header.
	RateLimitReason string
	// ShouldRetry is the Stripe-Should-Retry header.
	ShouldRetry Advice
	// Replayed is the Idempotent-Replayed header.
	Replayed bool
	// Response is the answer's body; ChargeResult needs it only for a
	// decline.
	Response json.RawMessage
	// ChargeID and ChargeStatus are those of the payment intent the error
	// carries, if any.
	ChargeID, ChargeStatus string
}

func (r *Rejection) class() Class { return Classify(r.HTTPStatus, r.Type, r.Code, nil) }

// ChargeResult is Charge's answer: a declined Outcome when the provider
// declined the charge for good (a 402 card_error), else an *Error (a 400
// on our parameters is ClassRejected, not a decline).
func (r *Rejection) ChargeResult() (*Outcome, error) {
	class := r.class()
	if class != ClassDeclined {
		return nil, r.error(class)
	}
	return &Outcome{
		ChargeID: r.ChargeID,
		Status:   r.ChargeStatus,
		Declined: true,
		// Stripe's own reason; its error type (card_error, or whatever a
		// last_payment_error carries) is not one.
		DeclineCode: cmp.Or(r.DeclineCode, r.Code, "card_declined"),
		HTTPStatus:  r.HTTPStatus,
		Response:    r.Response,
		Replayed:    r.Replayed,
	}, nil
}

// LookupError is Lookup's error. A lookup cannot be declined or rejected
// for good, so a 4xx the charge path would call definitive means "could not
// tell" here; a refused API key stays ClassUnauthorized.
func (r *Rejection) LookupError() *Error {
	class := r.class()
	if class != ClassRetryable && class != ClassUnauthorized {
		class = ClassUnknown
	}
	return r.error(class)
}

func (r *Rejection) error(class Class) *Error {
	return &Error{
		Class:      class,
		HTTPStatus: r.HTTPStatus,
		Type:       r.Type,
		Code:       r.Code,
		Message:    r.Message,
		RetryAfter: r.RetryAfter,

		RateLimitReason: r.RateLimitReason,
		ShouldRetry:     r.ShouldRetry,
	}
}

// SearchVerdict is Lookup's answer from the outcomes of the intents a search
// found under one key, newest first. Several charges (processing ones among
// them: money may move) are a ClassUnknown error, never hidden; otherwise
// the one charge (or processing intent), else the latest decline, else not
// found.
func SearchVerdict(found []*Outcome) (LookupResult, error) {
	var charged, declined []*Outcome
	for _, o := range found {
		if o.Declined {
			declined = append(declined, o)
		} else {
			charged = append(charged, o)
		}
	}
	switch {
	case len(charged) > 1:
		return LookupResult{}, &Error{Class: ClassUnknown, Message: "multiple charges under one key: " + strings.Join(outcomeIDs(charged), ", ")}
	case len(charged) == 1:
		return LookupResult{Found: true, Outcome: charged[0]}, nil
	case len(declined) > 0:
		// Search returns newest first: the latest attempt is the answer.
		return LookupResult{Found: true, Outcome: declined[0]}, nil
	default:
		return LookupResult{}, nil
	}
}

func outcomeIDs(outs []*Outcome) []string {
	ids := make([]string, len(outs))
	for i, o := range outs {
		ids[i] = o.ChargeID
	}
	return ids
}
