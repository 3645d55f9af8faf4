package ledger

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/paydedup/paydedup/payment"
)

// Fingerprint returns the SHA-256 of the command's canonical encoding: the
// same request always has the same fingerprint, whatever its JSON looked like.
func Fingerprint(c *payment.Command) []byte {
	// The encoding is put together in a buffer on the stack (a command of
	// ordinary size fits it) and hashed at once, as ProviderKey does.
	var in [512]byte
	sum := sha256.Sum256(c.AppendCanonical(in[:0]))
	return sum[:]
}

// ProviderKey derives the idempotency key sent to the provider for our
// (merchant, key). It is deterministic, never equal to our key, and safe as
// a provider key (ASCII, 68 characters) whatever our key contains.
func ProviderKey(merchantID, idempotencyKey string) string {
	// One allocation, the key itself: the hashed bytes are put together in
	// a buffer on the stack (valid ids and keys fit it) and hashed at once.
	var in [512]byte
	b := append(in[:0], "paydedup/provider-key/v1\x00"...)
	b = append(append(append(b, merchantID...), 0), idempotencyKey...)
	sum := sha256.Sum256(b)
	var out [len("pdk_") + 2*sha256.Size]byte
	copy(out[:], "pdk_")
	hex.Encode(out[len("pdk_"):], sum[:])
	return string(out[:])
}

// ClaimRequest is what the store needs to claim one command.
type ClaimRequest struct {
	MerchantID     string
	IdempotencyKey string
	RequestHash    []byte
	Amount         int64
	Currency       string
	// TraceID is the W3C trace id (32 lower-case hex digits) of the message,
	// or empty. Only the first claim's is kept.
	TraceID string
	// Kind is the command's kind (payment.KindCharge when empty, or
	// payment.KindAuthorize): it chooses the provider key (ProviderKeyFor).
	Kind string
}

// ProviderKey is the provider key the claim stores for the request.
func (r ClaimRequest) ProviderKey() string {
	return ProviderKeyFor(r.Kind, r.MerchantID, r.IdempotencyKey)
}

// NewClaimRequest builds the claim for a validated command.
func NewClaimRequest(c *payment.Command) ClaimRequest {
	return ClaimRequest{
		MerchantID:     c.MerchantID,
		IdempotencyKey: c.IdempotencyKey,
		RequestHash:    Fingerprint(c),
		Amount:         c.Amount,
		Currency:       c.Currency,
		Kind:           c.Kind,
	}
}

// Validate reports why the claim request is not one the store accepts
// (a *payment.ValidationError).
func (r ClaimRequest) Validate() error {
	if err := payment.ValidateMerchant(r.MerchantID); err != nil {
		return err
	}
	if err := payment.ValidateKey(r.IdempotencyKey); err != nil {
		return err
	}
	if err := payment.ValidateKind(r.Kind); err != nil {
		return err
	}
	if r.Kind == payment.KindRefund || r.Kind == payment.KindCapture || r.Kind == payment.KindCancel {
		// A refund, a capture or a cancel is claimed in its own table
		// (RefundRequest, PaymentOpRequest), never under a payment's key.
		return &payment.ValidationError{Reason: payment.ReasonInvalidKind, Field: "kind", Msg: "a " + r.Kind + " is not a payment's claim"}
	}
	if len(r.RequestHash) != sha256.Size {
		return &payment.ValidationError{Reason: payment.ReasonMalformedJSON, Field: "request_hash", Msg: "must be a SHA-256 digest"}
	}
	if r.Amount <= 0 {
		return &payment.ValidationError{Reason: payment.ReasonInvalidAmount, Field: "amount", Msg: "must be positive"}
	}
	if !payment.ValidCurrency(r.Currency) {
		return &payment.ValidationError{Reason: payment.ReasonInvalidCurrency, Field: "currency", Msg: "must be an ISO 4217 code"}
	}
	if r.TraceID != "" && !validTraceID(r.TraceID) {
		return &payment.ValidationError{Reason: payment.ReasonMalformedJSON, Field: "trace_id", Msg: "must be 32 lower-case hex digits"}
	}
	return nil
}

// Outcome is what a claim found.
type Outcome int

// Claim outcomes.
const (
	// Claimed: a new row was inserted; the caller holds its lease.
	Claimed Outcome = iota + 1
	// Reacquired: a `failed` row, or a pending row whose lease expired,
	// inside its provider key window, was taken over (attempts+1); the
	// caller holds the lease.
	Reacquired
	// Duplicate: the key is completed; Record holds the stored response.
	Duplicate
	// InFlight: another holder has a live lease (or just won a race for it);
	// RetryIn says when it is worth looking again.
	InFlight
	// Mismatch: the key exists with another request fingerprint: a client
	// reused a key for a different payment. Nothing was changed.
	Mismatch
	// NeedsLookup: the row is pending with an expired lease, or failed, and
	// its first provider call is older than the provider's key window: a
	// blind re-call could charge again, so only a provider lookup may
	// resolve it. A failed row is parked for the reconciler (pending,
	// maybe_charged, lease expired) by the claim that finds it so.
	NeedsLookup
	// Refused: a refund's claim the ledger's rules refuse
	// (RefundClaim.Reason): nothing was written, and it must not be sent.
	Refused
)

func (o Outcome) String() string {
	switch o {
	case Claimed:
		return "claimed"
	case Reacquired:
		return "reacquired"
	case Duplicate:
		return "duplicate"
	case InFlight:
		return "in_flight"
	case Mismatch:
		return "mismatch"
	case NeedsLookup:
		return "needs_lookup"
	case Refused:
		return "refused"
	}
	return "unknown"
}

// ClaimResult is the result of claiming one command.
type ClaimResult struct {
	Outcome Outcome
	// Record is the row as the claim left it (for Claimed and Reacquired,
	// the row now held) or found it. It is zero only for an InFlight result
	// caused by a concurrent claim this statement could not see.
	Record Record
	// Lease is set for Claimed and Reacquired.
	Lease *Lease
	// RetryIn is set for InFlight and NeedsLookup.
	RetryIn time.Duration
	// FromLedger reports a Duplicate or Mismatch judged against the payments
	// ledger because the key's row was purged after its retention: Record is
	// built from the ledger row, with no fingerprint (RequestHash nil), and
	// Mismatch means the ledger's amount or currency differ from the
	// request's (a key reused for another payment).
	FromLedger bool
}

func validTraceID(s string) bool {
	if len(s) != 32 || s == "00000000000000000000000000000000" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if (s[i] < '0' || s[i] > '9') && (s[i] < 'a' || s[i] > 'f') {
			return false
		}
	}
	return true
}

// How soon a claim that found the key taken says to look again.
const (
	// MinRetry is the shortest RetryIn a claim reports, so a lease that is
	// about to expire is not polled in a tight loop.
	MinRetry = 250 * time.Millisecond
	// LookupRetry is the RetryIn of a NeedsLookup result: the reconciler,
	// not a redelivery, resolves such a row.
	LookupRetry = time.Minute
)

// Evaluate decides what a claim for req finds in an existing row it did not
// take. acquirable reports a row the claim could have taken but did not:
// another claim won it in the meantime. window is the provider's key
// window (a row whose first call is older may only be resolved by a
// lookup); now is the claim's time.
//
// A row built from the ledger after its key row was purged has no
// fingerprint (RequestHash nil): the ledger's amount, currency and kind
// (its provider key's) decide between the old payment's duplicate and a
// reused key.
func Evaluate(rec Record, req ClaimRequest, now time.Time, window time.Duration) (res ClaimResult, acquirable bool) {
	res.Record = rec
	if rec.RequestHash == nil {
		res.FromLedger = true
		res.Outcome = Duplicate
		if rec.Amount != req.Amount || rec.Currency != req.Currency ||
			KindOfProviderKey(rec.ProviderKey) != KindOfProviderKey(req.ProviderKey()) {
			res.Outcome = Mismatch
		}
		return res, false
	}
	switch {
	case !bytes.Equal(rec.RequestHash, req.RequestHash):
		res.Outcome = Mismatch
	case rec.Status == StatusCompleted:
		res.Outcome = Duplicate
	case rec.Status == StatusPending && rec.LockedUntil.After(now):
		res.Outcome = InFlight
		res.RetryIn = max(rec.LockedUntil.Sub(now), MinRetry)
	case rec.Status != StatusCompleted && !rec.KeyWindowStart.After(now.Add(-window)):
		// Pending with an expired lease, or failed: either way the
		// provider may have forgotten the key.
		res.Outcome = NeedsLookup
		res.RetryIn = LookupRetry
	default:
		res.Outcome = InFlight
		res.RetryIn = MinRetry
		acquirable = true
	}
	return res, acquirable
}
