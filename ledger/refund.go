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

// The statuses of a refund's row (migration 00024).
const (
	// RefundPending: claimed, its lease held (a call may be under way).
	RefundPending = "pending"
	// RefundUnknown: a call's outcome was lost; no lease. It may have been
	// made: it is looked up (provider.LookupRefund) before any re-call.
	RefundUnknown = "unknown"
	// RefundProcessing: the provider holds the refund pending; it may
	// still succeed or fail.
	RefundProcessing = "processing"
	// RefundSucceeded: refunded.
	RefundSucceeded = "succeeded"
	// RefundFailed: the provider's refund failed or was canceled: the
	// money is back on the payment.
	RefundFailed = "failed"
	// RefundRefused: the provider's definitive no; nothing was refunded.
	RefundRefused = "refused"
)

// RefundHolds reports whether a refund in status counts against what is
// left to refund: every refund that may hold money (a claimed one, one
// whose outcome is unknown, one the provider holds pending, a succeeded
// one). Only a failed or a refused one gives it back.
func RefundHolds(status string) bool {
	return status != RefundFailed && status != RefundRefused
}

// The reasons a refund's claim is refused: it is never sent, and nothing is
// written.
const (
	// RefuseNoPayment: the merchant has no payment under the key.
	RefuseNoPayment = "payment_not_found"
	// RefuseNotCharged: the payment is not charged (declined, processing,
	// authorized, failed): nothing to refund yet, or ever.
	RefuseNotCharged = "payment_not_charged"
	// RefuseOverRefundable: the amount is more than what is left to
	// refund, counting every refund that may hold money (RefundHolds).
	RefuseOverRefundable = "over_refundable"
	// RefuseCurrency: the refund names another currency than the
	// payment's.
	RefuseCurrency = "currency_mismatch"
)

// RefundRefusals lists the reasons a refund's claim is refused.
var RefundRefusals = []string{RefuseNoPayment, RefuseNotCharged, RefuseOverRefundable, RefuseCurrency}

// IsRefundRefusal reports whether reason is one of RefundRefusals.
func IsRefundRefusal(reason string) bool { return slices.Contains(RefundRefusals, reason) }

// RefundRequest is what the store needs to claim one refund.
type RefundRequest struct {
	// MerchantID and IdempotencyKey are the refund's own.
	MerchantID     string
	IdempotencyKey string
	// PaymentKey is the refunded payment's idempotency key (same
	// merchant).
	PaymentKey string
	// Amount is how much to refund, in minor units; 0 refunds all that is
	// left when the claim is made.
	Amount int64
	// Currency, when not empty, must be the payment's.
	Currency string
	// RequestHash is the refund command's fingerprint (NewRefundRequest):
	// the same key with another request is a Mismatch.
	RequestHash []byte
}

// Validate reports why the request is not one the store accepts (a
// *payment.ValidationError).
func (r RefundRequest) Validate() error {
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
	if r.Amount < 0 {
		return &payment.ValidationError{Reason: payment.ReasonInvalidAmount, Field: "amount", Msg: "must not be negative (0 refunds the rest)"}
	}
	if r.Currency != "" && !payment.ValidCurrency(r.Currency) {
		return &payment.ValidationError{Reason: payment.ReasonInvalidCurrency, Field: "currency", Msg: "must be an ISO 4217 code"}
	}
	return nil
}

// NewRefundRequest builds the claim of a validated refund command. Its
// fingerprint is the command's (Fingerprint): a refund's canonical
// encoding names its kind and its payment, so it is never a charge's.
func NewRefundRequest(c *payment.Command) RefundRequest {
	return RefundRequest{MerchantID: c.MerchantID, IdempotencyKey: c.IdempotencyKey, PaymentKey: c.PaymentKey,
		Amount: c.Amount, Currency: c.Currency, RequestHash: Fingerprint(c)}
}

// RefundProviderKey derives the provider idempotency key of the refund
// (merchantID, idempotencyKey): deterministic, never a charge's or an
// authorize's (its own prefix and tag), safe at the provider.
func RefundProviderKey(merchantID, idempotencyKey string) string {
	h := sha256.New()
	h.Write([]byte("paydedup/refund-key/v1\x00"))
	h.Write([]byte(merchantID))
	h.Write([]byte{0})
	h.Write([]byte(idempotencyKey))
	return "pdr_" + hex.EncodeToString(h.Sum(nil))
}

// Refund is one row of the refunds table.
type Refund struct {
	MerchantID     string
	IdempotencyKey string
	PaymentKey     string
	RequestHash    []byte
	ProviderKey    string
	ChargeID       string // the refunded payment's intent
	Amount         int64
	Currency       string
	Status         string // RefundPending, RefundUnknown, ...
	Attempts       int
	LockedBy       string
	LockedUntil    time.Time // zero unless pending
	KeyWindowStart time.Time
	RefundID       string
	ResponseStatus int
	Response       json.RawMessage
	Reason         string // the provider's refusal or failure reason
	LastError      string
	CreatedAt      time.Time
	UpdatedAt      time.Time
	CompletedAt    time.Time
}

// Final reports whether the refund's row will not change: succeeded,
// failed or refused. (A processing refund is settled later.)
func (r Refund) Final() bool {
	return r.Status == RefundSucceeded || r.Status == RefundFailed || r.Status == RefundRefused
}

// Lease is the lease a holder of the pending refund r holds.
func (r Refund) Lease() Lease {
	return Lease{MerchantID: r.MerchantID, IdempotencyKey: r.IdempotencyKey, ProviderKey: r.ProviderKey,
		Holder: r.LockedBy, Attempt: r.Attempts, Until: r.LockedUntil, CreatedAt: r.CreatedAt, MaybeCharged: r.Attempts > 1}
}

// RefundClaim is what a refund's claim found.
type RefundClaim struct {
	// Outcome is Claimed (a new row: call the provider), NeedsLookup (a
	// row that may have been sent, re-acquired: look it up before any
	// re-call), Duplicate (final or processing: its stored answer
	// stands), InFlight (another holder's live lease), Mismatch (the key
	// holds another request) or Refused (Reason says why; nothing was
	// written, nothing may be sent).
	Outcome Outcome
	// Reason is the refusal's (RefuseNoPayment, ...), for Refused.
	Reason string
	// Refund is the row as the claim left or found it; zero for Refused.
	Refund Refund
	// Lease is set for Claimed and NeedsLookup.
	Lease *Lease
	// RetryIn is set for InFlight.
	RetryIn time.Duration
	// Refundable is what was left to refund before this refund, for
	// Claimed and Refused by the sum rule.
	Refundable int64
}

// RefundCompletion is a provider's settled answer to a refund.
type RefundCompletion struct {
	// Status is RefundProcessing, RefundSucceeded, RefundFailed or
	// RefundRefused.
	Status   string
	RefundID string // required but for RefundRefused
	Reason   string
	// ResponseStatus and Response are the provider's answer, stored and
	// replayed.
	ResponseStatus int
	Response       json.RawMessage
}

// RefundCompletionOf is the record of a provider's refund answer, the
// worker's and the reconciler's alike: refused (its definitive no),
// succeeded, failed (failed or canceled: the money is back), or
// processing (pending, requires_action: settled later). An answer without
// a body is stored as a summary of it.
func RefundCompletionOf(out *provider.RefundOutcome) RefundCompletion {
	c := RefundCompletion{RefundID: out.RefundID, ResponseStatus: out.HTTPStatus, Response: out.Response}
	switch {
	case out.Refused:
		c.Status, c.Reason = RefundRefused, out.RefusalCode
	case out.Status == provider.RefundSucceeded:
		c.Status = RefundSucceeded
	case out.Status == provider.RefundFailed || out.Status == provider.RefundCanceled:
		c.Status, c.Reason = RefundFailed, out.FailureReason
	default:
		c.Status = RefundProcessing
	}
	if c.ResponseStatus == 0 {
		c.ResponseStatus = 200
	}
	if len(c.Response) == 0 {
		c.Response, _ = json.Marshal(map[string]any{"id": out.RefundID, "status": out.Status, "amount": out.Amount, "refused": out.Refused})
	}
	return c
}
