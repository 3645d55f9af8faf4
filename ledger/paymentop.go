package ledger

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"time"

	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
)

// The statuses of a capture's or a cancel's row (migration 00027).
const (
	// OpPending: claimed, its lease held (a call may be under way).
	OpPending = "pending"
	// OpUnknown: a call's outcome was lost; no lease. It may have been
	// made: the intent is retrieved (provider RetrieveIntent) before any
	// re-call.
	OpUnknown = "unknown"
	// OpSucceeded: captured, or canceled. The payment's ledger row moved
	// with it (captured: succeeded with what was received; canceled:
	// canceled).
	OpSucceeded = "succeeded"
	// OpRefused: the provider's definitive no, or an intent that can never
	// be so moved; nothing happened, and another capture or cancel of the
	// payment may be claimed.
	OpRefused = "refused"
)

// PaymentCanceled is an authorized payment whose authorization was
// canceled (voided): no money moved (migration 00027).
const PaymentCanceled = "canceled"

// The reasons a capture's or a cancel's claim is refused besides
// RefuseNoPayment and RefuseCurrency: it is never sent, and nothing is
// written.
const (
	// RefuseNotAuthorized: the payment is not an authorization that may
	// be captured or canceled (a charge, a decline, a payment still
	// processing at the provider: a cancel of that is not simple, and is
	// refused).
	RefuseNotAuthorized = "payment_not_authorized"
	// RefuseOverCapturable: the capture asks more than was authorized.
	RefuseOverCapturable = "over_capturable"
	// RefuseCanceled: a cancel of the payment holds (claimed, of unknown
	// outcome, or done): nothing more may be captured or canceled.
	RefuseCanceled = "payment_canceled"
	// RefuseAlreadyCaptured: a capture of the payment holds: the provider
	// captures once.
	RefuseAlreadyCaptured = "already_captured"
	// RefuseCaptured: a cancel of a payment a capture of which holds.
	RefuseCaptured = "payment_captured"
)

// PaymentOpRefusals lists the reasons a capture's or a cancel's claim is
// refused.
var PaymentOpRefusals = []string{RefuseNoPayment, RefuseNotAuthorized, RefuseOverCapturable, RefuseCanceled,
	RefuseAlreadyCaptured, RefuseCaptured, RefuseCurrency}

// IsPaymentOpRefusal reports whether reason is one of PaymentOpRefusals.
func IsPaymentOpRefusal(reason string) bool { return slices.Contains(PaymentOpRefusals, reason) }

// IsLedgerRefusal reports whether reason is a refusal of the ledger's
// rules, a refund's or a capture's or a cancel's.
func IsLedgerRefusal(reason string) bool {
	return IsRefundRefusal(reason) || IsPaymentOpRefusal(reason)
}

// PaymentOpRequest is what the store needs to claim one capture or cancel.
type PaymentOpRequest struct {
	// Kind is payment.KindCapture or payment.KindCancel.
	Kind string
	// MerchantID and IdempotencyKey are the operation's own.
	MerchantID     string
	IdempotencyKey string
	// PaymentKey is the authorized payment's idempotency key (same
	// merchant).
	PaymentKey string
	// Amount is a capture's, in minor units; 0 captures all that was
	// authorized. A cancel has none.
	Amount int64
	// Currency, when not empty, must be the payment's.
	Currency string
	// RequestHash is the command's fingerprint: the same key with another
	// request is a Mismatch.
	RequestHash []byte
}

// Validate reports why the request is not one the store accepts (a
// *payment.ValidationError).
func (r PaymentOpRequest) Validate() error {
	if r.Kind != payment.KindCapture && r.Kind != payment.KindCancel {
		return &payment.ValidationError{Reason: payment.ReasonInvalidKind, Field: "kind", Msg: "must be capture or cancel"}
	}
	if err := payment.ValidateMerchant(r.MerchantID); err != nil {
		return err
	}
	if err := payment.ValidateKey(r.IdempotencyKey); err != nil {
		return err
	}
	if err := payment.ValidateKey(r.PaymentKey); err != nil {
		return &payment.ValidationError{Reason: payment.ReasonInvalidKey, Field: "payment_key", Msg: err.Error()}
	}
	if len(r.RequestHash) != sha256.Size {
		return &payment.ValidationError{Reason: payment.ReasonMalformedJSON, Field: "request_hash", Msg: "must be a SHA-256 digest"}
	}
	if r.Amount < 0 || r.Kind == payment.KindCancel && r.Amount != 0 {
		return &payment.ValidationError{Reason: payment.ReasonInvalidAmount, Field: "amount", Msg: "a capture's must not be negative (0 captures all); a cancel has none"}
	}
	if r.Currency != "" && !payment.ValidCurrency(r.Currency) {
		return &payment.ValidationError{Reason: payment.ReasonInvalidCurrency, Field: "currency", Msg: "must be an ISO 4217 code"}
	}
	return nil
}

// NewPaymentOpRequest builds the claim of a validated capture or cancel
// command; its fingerprint is the command's, which names its kind and its
// payment.
func NewPaymentOpRequest(c *payment.Command) PaymentOpRequest {
	return PaymentOpRequest{Kind: c.Kind, MerchantID: c.MerchantID, IdempotencyKey: c.IdempotencyKey, PaymentKey: c.PaymentKey,
		Amount: c.Amount, Currency: c.Currency, RequestHash: Fingerprint(c)}
}

// PaymentOpProviderKey derives the provider idempotency key of the capture
// ("pdc_") or cancel ("pdv_") (merchantID, idempotencyKey): deterministic,
// never a charge's, an authorize's or a refund's (its own prefix and tag).
func PaymentOpProviderKey(kind, merchantID, idempotencyKey string) string {
	prefix := "pdc_"
	if kind == payment.KindCancel {
		prefix = "pdv_"
	}
	h := sha256.New()
	h.Write([]byte("paydedup/" + kind + "-key/v1\x00"))
	h.Write([]byte(merchantID))
	h.Write([]byte{0})
	h.Write([]byte(idempotencyKey))
	return prefix + hex.EncodeToString(h.Sum(nil))
}

// PaymentOp is one row of the payment_ops table: a capture or a cancel.
type PaymentOp struct {
	Kind           string // payment.KindCapture or payment.KindCancel
	MerchantID     string
	IdempotencyKey string
	PaymentKey     string
	RequestHash    []byte
	ProviderKey    string
	ChargeID       string // the payment's intent
	Amount         int64  // a capture's; a cancel's is what it releases
	AmountReceived int64  // what a succeeded capture took
	Currency       string
	Status         string // OpPending, OpUnknown, OpSucceeded, OpRefused
	Attempts       int
	LockedBy       string
	LockedUntil    time.Time // zero unless pending
	KeyWindowStart time.Time
	ResponseStatus int
	Response       json.RawMessage
	Reason         string // the provider's refusal
	LastError      string
	CreatedAt      time.Time
	UpdatedAt      time.Time
	CompletedAt    time.Time
}

// Final reports whether the row will not change: succeeded or refused.
func (o PaymentOp) Final() bool { return o.Status == OpSucceeded || o.Status == OpRefused }

// Lease is the lease a holder of the pending operation o holds.
func (o PaymentOp) Lease() Lease {
	return Lease{MerchantID: o.MerchantID, IdempotencyKey: o.IdempotencyKey, ProviderKey: o.ProviderKey,
		Holder: o.LockedBy, Attempt: o.Attempts, Until: o.LockedUntil, CreatedAt: o.CreatedAt, MaybeCharged: o.Attempts > 1}
}

// PaymentOpClaim is what a capture's or a cancel's claim found: Outcome
// as a refund's (RefundClaim), with Op for Refund.
type PaymentOpClaim struct {
	Outcome Outcome
	Reason  string
	Op      PaymentOp
	Lease   *Lease
	RetryIn time.Duration
	// Capturable is what the payment authorized, for Claimed and Refused
	// by the amount rule.
	Capturable int64
}

// PaymentOpCompletion is a settled answer to a capture or a cancel.
type PaymentOpCompletion struct {
	// Status is OpSucceeded or OpRefused.
	Status string
	// AmountReceived is what a succeeded capture took.
	AmountReceived int64
	Reason         string
	ResponseStatus int
	Response       json.RawMessage
}

// The reasons of an operation recorded refused because the intent, as
// looked up, can never be so moved.
const (
	// OpIntentCanceled: a capture of an intent the provider canceled (its
	// authorization expired, or someone voided it).
	OpIntentCanceled = "intent_canceled"
	// OpIntentCaptured: a cancel of an intent the provider captured.
	OpIntentCaptured = "intent_captured"
)

// PaymentOpCompletionOf is the record of an intent as a capture's or a
// cancel's answer, or a lookup (RetrieveIntent), left it, the worker's and
// the reconciler's alike; ok is false when it says the operation has not
// happened and still may (requires_capture, or another status): the
// caller may send it (again, under its key), or leave it unknown.
//   - refused: the provider's definitive no;
//   - a capture: succeeded is done, with what was received; canceled is
//     refused (OpIntentCanceled);
//   - a cancel: canceled is done; succeeded is refused (OpIntentCaptured).
func PaymentOpCompletionOf(kind string, out *provider.IntentOutcome) (c PaymentOpCompletion, ok bool) {
	c = PaymentOpCompletion{ResponseStatus: out.HTTPStatus, Response: out.Response}
	switch {
	case out.Refused:
		c.Status, c.Reason = OpRefused, out.RefusalCode
	case kind == payment.KindCapture && out.Status == provider.StatusSucceeded:
		c.Status, c.AmountReceived = OpSucceeded, out.AmountReceived
	case kind == payment.KindCapture && out.Status == provider.StatusCanceled:
		c.Status, c.Reason = OpRefused, OpIntentCanceled
	case kind == payment.KindCancel && out.Status == provider.StatusCanceled:
		c.Status = OpSucceeded
	case kind == payment.KindCancel && out.Status == provider.StatusSucceeded:
		c.Status, c.Reason = OpRefused, OpIntentCaptured
	default:
		return PaymentOpCompletion{}, false
	}
	if c.ResponseStatus == 0 {
		c.ResponseStatus = 200
	}
	if len(c.Response) == 0 {
		c.Response, _ = json.Marshal(map[string]any{"id": out.ChargeID, "status": out.Status, "amount_received": out.AmountReceived,
			"refused": out.Refused, "code": out.RefusalCode})
	}
	return c, true
}
