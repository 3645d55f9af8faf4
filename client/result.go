package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/paydedup/paydedup/ledger"
)

// Payment is what a payment asks: the body of POST /v1/payments. The
// merchant is the API key's (or the Publisher's).
type Payment struct {
	Amount        int64             `json:"amount"` // in minor units (cents)
	Currency      string            `json:"currency"`
	PaymentMethod string            `json:"payment_method"` // a token (pm_...), never card data
	Description   string            `json:"description,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
	// CaptureMethod is Stripe's: "manual" authorizes (the payment ends
	// StatusAuthorized, the amount held, not moved); empty or
	// "automatic" charges.
	CaptureMethod string `json:"capture_method,omitempty"`
}

// Status is a payment's state as the gateway shows it.
type Status string

// The statuses of a payment (docs/clients.md, "GET /v1/payments/{key}").
const (
	// StatusQueued: accepted; it will be charged once or end in a refusal
	// you can read.
	StatusQueued = Status(ledger.StateQueued)
	// StatusPublishUnknown: sent to the stream without a confirmation;
	// call Create again with the same key and payment to settle it.
	StatusPublishUnknown = Status(ledger.StatePublishUnknown)
	// StatusProcessing: a worker holds it, or the provider accepted it and
	// money may still move.
	StatusProcessing = Status(ledger.StateProcessing)
	// StatusRetrying: known not charged; the queue retries it by itself.
	StatusRetrying = Status(ledger.StateRetrying)
	// StatusWaitingForOperator: set aside for a person (Result.Reason).
	// Not final: an operator's replay may still charge it.
	StatusWaitingForOperator = Status(ledger.StateWaitingForOperator)
	// StatusSucceeded: charged (Result.ChargeID). Final.
	StatusSucceeded = Status(ledger.StateSucceeded)
	// StatusDeclined: refused by the provider, definitively. Final; another
	// attempt is a new payment under a new key.
	StatusDeclined = Status(ledger.StateDeclined)
	// StatusAuthorized: a CaptureMethod "manual" payment's amount is held
	// by the provider, not moved (Result.AmountCapturable). Final.
	StatusAuthorized = Status(ledger.StateAuthorized)
)

// Result is what the gateway answered about a payment.
type Result struct {
	IdempotencyKey string `json:"idempotency_key"`
	Status         Status `json:"status"`
	Amount         int64  `json:"amount"`
	Currency       string `json:"currency"`
	// ChargeID is the provider's charge, once charged.
	ChargeID    string     `json:"charge_id,omitempty"`
	CreatedAt   time.Time  `json:"created_at"`
	CompletedAt *time.Time `json:"completed_at,omitempty"`
	// AmountCapturable is how much of an authorized payment can still be
	// captured; 0 in any other state.
	AmountCapturable int64 `json:"amount_capturable,omitempty"`
	// AmountReceived is what the payment moved: its amount once
	// succeeded; 0 otherwise.
	AmountReceived int64 `json:"amount_received,omitempty"`
	// AmountRefunded is the sum of its succeeded refunds, and Refunds
	// every refund of it (Get of a succeeded payment; its Status is then
	// StatusRefunded or StatusPartiallyRefunded once refunds succeeded).
	AmountRefunded int64           `json:"amount_refunded,omitempty"`
	Refunds        []RefundSummary `json:"refunds,omitempty"`
	// Outcome is the provider's stored answer, once completed.
	Outcome *Outcome `json:"outcome,omitempty"`
	// Reason is why a payment waits for an operator (provider_rejected,
	// max_deliveries, ...).
	Reason string `json:"reason,omitempty"`
	// Delay says why a payment waiting for a worker does not move (the
	// workers are paused by an outage, or no worker runs).
	Delay *Delay `json:"delay,omitempty"`

	// HTTPStatus is the answer's status code (201, 202, 402, 200).
	HTTPStatus int `json:"-"`
	// Replayed: the gateway answered a retry from the stored outcome
	// (Idempotent-Replayed: true).
	Replayed bool `json:"-"`
}

// Final reports whether the payment is done: succeeded (refunded or
// partially_refunded since), declined or authorized. Anything else may still be charged; keep the key.
func (r Result) Final() bool {
	return r.Status == StatusSucceeded || r.Status == StatusDeclined || r.Status == StatusAuthorized ||
		r.Status == StatusRefunded || r.Status == StatusPartiallyRefunded
}

// RefundSummary is one refund of a payment, as Get lists them.
type RefundSummary struct {
	IdempotencyKey string `json:"idempotency_key"`
	Amount         int64  `json:"amount"`
	Status         Status `json:"status"`
	Reason         string `json:"reason,omitempty"`
}

// Outcome is the provider's stored answer of a completed payment.
type Outcome struct {
	Status int             `json:"status"`
	Body   json.RawMessage `json:"body"`
}

// Delay is why a waiting payment is not moving (docs/clients.md).
type Delay struct {
	Cause         string     `json:"cause"`
	Since         time.Time  `json:"since,omitzero"`
	WorkersPaused int        `json:"workers_paused"`
	RetryAt       *time.Time `json:"retry_at,omitempty"`
}

// Errors a Problem matches with errors.Is, and the client's own.
var (
	// ErrKeyReused: the key belongs to another payment (422
	// idempotency-key-reused, or a Client or Publisher that sent the key
	// with another payment before). The first payment stands; a new
	// payment needs a new key.
	ErrKeyReused = errors.New("idempotency key already used with another payment")
	// ErrCardData: the request holds what looks like a card number (422
	// card-data). Nothing was stored; send a payment-method token.
	ErrCardData = errors.New("request holds card data")
	// ErrInvalidRequest: the request is wrong (400, 413, 415; Problem.Field
	// and Problem.Reason say what). Fix it; a retry of the same cannot
	// succeed.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrRejected: the worker dead-lettered the payment as bad input (422
	// payment-rejected with a reason). Final; nothing was charged.
	ErrRejected = errors.New("payment rejected")
	// ErrUnauthenticated: no API key, or a wrong or revoked one (401).
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrNotFound: no payment with this key for the API key's merchant
	// (GET 404 not-found).
	ErrNotFound = errors.New("payment not found")
	// ErrNotAccepted: nothing was accepted under this key (GET 404
	// not-accepted; to Create, 503 unavailable, 429, 500 internal). Create
	// returns it only for a key none of whose requests by this Client may
	// have been accepted; once one may have been, such an answer speaks of
	// its own request only and Create returns ErrOutcomeUnknown, until a Get
	// answers 404 not-accepted. Retrying with the same key is safe.
	ErrNotAccepted = errors.New("not accepted")
	// ErrOutcomeUnknown: the client gave up (RetryFor passed, or ctx ended)
	// after an answer that may have been accepted, in this call or an
	// earlier one with the key (the last answer is in its message). The payment may still
	// be charged: keep the key, call again later with the same key and the
	// same payment, and never pay under a new key.
	ErrOutcomeUnknown = errors.New("payment outcome unknown: retry later with the same key and payment, never a new key")
)

// Problem types of the gateway (openapi.yaml).
const (
	problemPrefix          = "urn:paydedup:problem:"
	ProblemKeyReused       = problemPrefix + "idempotency-key-reused"
	ProblemKeyInUse        = problemPrefix + "idempotency-key-in-use"
	ProblemCardData        = problemPrefix + "card-data"
	ProblemInvalidRequest  = problemPrefix + "invalid-request"
	ProblemMissingKey      = problemPrefix + "missing-idempotency-key"
	ProblemInvalidKey      = problemPrefix + "invalid-idempotency-key"
	ProblemTooLarge        = problemPrefix + "request-too-large"
	ProblemUnsupported     = problemPrefix + "unsupported-media-type"
	ProblemRejected        = problemPrefix + "payment-rejected"
	ProblemUnauthenticated = problemPrefix + "unauthenticated"
	ProblemNotFound        = problemPrefix + "not-found"
	ProblemNotAccepted     = problemPrefix + "not-accepted"
	ProblemUnavailable     = problemPrefix + "unavailable"
	ProblemRateLimited     = problemPrefix + "rate-limited"
	ProblemInternal        = problemPrefix + "internal"
	// ProblemPublishUnknown: sent to the stream, not confirmed: it may be
	// queued. The client retries it with the same key and body.
	ProblemPublishUnknown = problemPrefix + "publish-outcome-unknown"
)

// Problem is a gateway's refusal (RFC 9457 application/problem+json).
// Decide on Status and Type (or errors.Is with the Err values), never on
// Detail's text.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Field  string `json:"field,omitempty"`
	Reason string `json:"reason,omitempty"`
	// RetryAfter is the answer's Retry-After, 0 without one.
	RetryAfter time.Duration `json:"-"`
}

func (p *Problem) Error() string {
	s := fmt.Sprintf("paydedup: %d %s", p.Status, strings.TrimPrefix(p.Type, problemPrefix))
	if p.Field != "" {
		s += " (" + p.Field + ")"
	}
	if p.Detail != "" {
		s += ": " + p.Detail
	}
	return s
}

// Is matches the problem's type against the Err values.
func (p *Problem) Is(target error) bool {
	switch target {
	case ErrKeyReused:
		return p.Type == ProblemKeyReused
	case ErrCardData:
		return p.Type == ProblemCardData
	case ErrInvalidRequest:
		switch p.Type {
		case ProblemInvalidRequest, ProblemMissingKey, ProblemInvalidKey, ProblemTooLarge, ProblemUnsupported:
			return true
		}
	case ErrRejected:
		return p.Type == ProblemRejected
	case ErrUnauthenticated:
		return p.Status == 401
	case ErrNotFound:
		return p.Type == ProblemNotFound
	case ErrNotAccepted:
		switch p.Type {
		case ProblemNotAccepted, ProblemUnavailable, ProblemRateLimited, ProblemInternal:
			return true
		}
	}
	return false
}
