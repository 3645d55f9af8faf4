package client

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// The operations on a payment, each under its own idempotency key
// (Exchange.Kind, OperationResult.Object).
const (
	KindRefund  = "refund"
	KindCapture = "capture"
	KindCancel  = "cancel"
)

// The statuses of an operation besides a payment's queued,
// publish_unknown, processing and waiting_for_operator (docs/clients.md).
const (
	// StatusFailed: a refund the provider made failed afterwards; the
	// money is back on the payment. Final.
	StatusFailed = Status("failed")
	// StatusRefused: never done: the provider refused it (402), with
	// OperationResult.Reason. Final. (A refusal by the ledger's rules,
	// over_refundable..., is a *Problem matching ErrRejected.)
	StatusRefused = Status("refused")
	// StatusRefunded and StatusPartiallyRefunded are a succeeded
	// payment's, once refunds of all of it, or of part, succeeded (Get).
	StatusRefunded          = Status("refunded")
	StatusPartiallyRefunded = Status("partially_refunded")
)

// OperationResult is what the gateway answered about a refund, capture
// or cancel.
type OperationResult struct {
	Object         string `json:"object"` // KindRefund, KindCapture or KindCancel
	IdempotencyKey string `json:"idempotency_key"`
	PaymentKey     string `json:"payment_key,omitempty"`
	Status         Status `json:"status"`
	// Amount is what it moves once the worker fixed it; before, what was
	// asked (0: the rest of a refund, the whole of a capture).
	Amount      int64      `json:"amount"`
	Currency    string     `json:"currency,omitempty"`
	RefundID    string     `json:"refund_id,omitempty"`
	Reason      string     `json:"reason,omitempty"`
	CreatedAt   time.Time  `json:"created_at,omitzero"`
	CompletedAt *time.Time `json:"completed_at,omitempty"`

	// HTTPStatus is the answer's status code (202, 200, 402).
	HTTPStatus int `json:"-"`
	// Replayed: the answer to a retry, from the stored outcome.
	Replayed bool `json:"-"`
}

// Final reports whether the operation is done: succeeded, failed or
// refused. Anything else may still happen; keep the key.
func (r OperationResult) Final() bool {
	return r.Status == StatusSucceeded || r.Status == StatusFailed || r.Status == StatusRefused
}

// operationBody is the body of a refund or a capture.
type operationBody struct {
	Amount int64 `json:"amount,omitempty"`
}

// Refund refunds the payment under paymentKey, amount in minor units (0:
// all that is left), under the refund's own key. It keeps Create's
// contract: answers that may have been accepted, or that ask to come
// back, are retried with the same key and body; it returns StatusQueued
// (202: it will be refunded once, or refused with a reason you can read),
// the refund's outcome when the key was done before (a replay), or a
// *Problem: ErrRejected with Problem.Reason over_refundable (more than
// what is left), payment_not_charged..., ErrKeyReused for a key used with
// another request (another amount, payment or operation), ErrNotFound
// for an unknown payment, ErrInvalidRequest for a bad amount. When it
// gives up after an answer that may have been accepted, its error is
// ErrOutcomeUnknown: keep the key, call again with the same arguments.
func (c *Client) Refund(ctx context.Context, paymentKey, key string, amount int64) (OperationResult, error) {
	return c.operate(ctx, KindRefund, paymentKey, key, &operationBody{Amount: amount})
}

// Capture captures the authorized payment under paymentKey, amount in
// minor units (0: all of it), under the capture's own key, as Refund
// does: the ledger's rules refuse a capture of a payment that is not an
// authorization, or of more than it holds (ErrRejected,
// payment_not_authorized, over_capturable...). A gateway whose worker
// takes no captures refuses it (ErrInvalidRequest, invalid_kind).
func (c *Client) Capture(ctx context.Context, paymentKey, key string, amount int64) (OperationResult, error) {
	return c.operate(ctx, KindCapture, paymentKey, key, &operationBody{Amount: amount})
}

// Cancel cancels the authorized payment under paymentKey (the held amount
// is released), under the cancel's own key, as Refund does.
func (c *Client) Cancel(ctx context.Context, paymentKey, key string) (OperationResult, error) {
	return c.operate(ctx, KindCancel, paymentKey, key, nil)
}

// GetOperation returns the refund, capture or cancel (kind) under its
// own key as it stands, changing nothing; answers that ask to come back
// are retried.
func (c *Client) GetOperation(ctx context.Context, kind, key string) (OperationResult, error) {
	if err := checkKey(key); err != nil {
		return OperationResult{}, err
	}
	var out OperationResult
	_, err := c.retry(ctx, func() (Result, error) {
		a, err := c.do(ctx, http.MethodGet, operationPath(kind, key), key, kind, nil, 0)
		if err != nil {
			return Result{}, err
		}
		if a.status != http.StatusOK {
			return Result{}, a.failure()
		}
		out, err = a.operation()
		return Result{}, err
	})
	return out, err
}

// operationPath is where an operation of kind under key is read.
func operationPath(kind, key string) string {
	return "/v1/" + kind + "s/" + url.PathEscape(key)
}

// operationPost is where an operation of kind on the payment under
// paymentKey is posted.
func operationPost(kind, paymentKey string) string {
	what := kind
	if kind == KindRefund {
		what = "refunds"
	}
	return "/v1/payments/" + url.PathEscape(paymentKey) + "/" + what
}

// operate sends an operation of kind on the payment under paymentKey
// under key, by Create's rules: the key is bound to the operation and
// its body (its path and its amount: another is ErrKeyReused before
// anything is sent), and every answer that may have been accepted is
// retried with the same key and body.
func (c *Client) operate(ctx context.Context, kind, paymentKey, key string, b *operationBody) (OperationResult, error) {
	if err := checkKey(key); err != nil {
		return OperationResult{}, err
	}
	if err := checkKey(paymentKey); err != nil {
		return OperationResult{}, err
	}
	var body []byte
	if b != nil {
		var err error
		if body, err = json.Marshal(b); err != nil {
			return OperationResult{}, fmt.Errorf("client: encode %s: %w", kind, err)
		}
	}
	path := operationPost(kind, paymentKey)
	fresh, mayBeAccepted, err := c.keys.bind(key, sha256.Sum256(append([]byte(path+"\x00"), body...)))
	if err != nil {
		return OperationResult{}, err
	}
	var out OperationResult
	_, err = c.retry(ctx, func() (Result, error) {
		a, err := c.do(ctx, http.MethodPost, path, key, kind, body, 0)
		if err != nil {
			mayBeAccepted = true
			return Result{}, err
		}
		switch a.status {
		case http.StatusOK, http.StatusAccepted, http.StatusPaymentRequired:
			mayBeAccepted = true
			out, err = a.operation()
			return Result{}, err
		case http.StatusConflict: // in flight: ask how it stands
			g, gerr := c.do(ctx, http.MethodGet, operationPath(kind, key), key, kind, nil, 0)
			if gerr == nil && g.status == http.StatusOK {
				if r, err := g.operation(); err == nil && r.Status != StatusPublishUnknown && r.isOf(kind, paymentKey, b) {
					out = r
					return Result{}, nil
				}
			}
			// Not known, or about another operation under the key: ask
			// again later, never report another's outcome as this one's.
			mayBeAccepted = true
			return Result{}, a.retryLater()
		}
		if a.mayBeAccepted() {
			mayBeAccepted = true
		}
		return Result{}, a.failure()
	})
	if mayBeAccepted {
		c.keys.mayBe(key)
	}
	if err != nil && fresh && !mayBeAccepted && (boundNothing(err) || errors.Is(err, ErrNotFound)) {
		c.keys.forget(key) // refused at once: the key holds nothing
	}
	if err != nil && mayBeAccepted && !errors.Is(err, ErrKeyReused) && !isFinal(err) {
		err = outcomeUnknown(err)
	}
	return out, err
}

// isOf reports whether r may be the operation of kind on the payment
// under paymentKey with body b, as far as an answer shows it: its kind;
// its payment, when it names one (the worker's row does); its amount when
// b asked one, or when r shows what was asked (no payment named yet: the
// door's intake). A refund of the rest or a capture of the whole the
// worker fixed cannot be told from its amount.
func (r OperationResult) isOf(kind, paymentKey string, b *operationBody) bool {
	var asked int64
	if b != nil {
		asked = b.Amount
	}
	switch {
	case r.Object != kind:
		return false
	case r.PaymentKey == "":
		return r.Amount == asked
	case r.PaymentKey != paymentKey:
		return false
	}
	return asked == 0 || r.Amount == asked
}

// operation decodes an operation's answer.
func (a answer) operation() (OperationResult, error) {
	var r OperationResult
	if err := json.Unmarshal(a.body, &r); err != nil || r.Status == "" || r.Object == "" {
		return OperationResult{}, &retryLater{err: fmt.Errorf("client: a %d answer that is not an operation: %.80q", a.status, a.body)}
	}
	r.HTTPStatus = a.status
	r.Replayed = a.header.Get("Idempotent-Replayed") == "true"
	return r, nil
}
