// Package dedup owns the Postgres idempotency store: one row per
// (merchant_id, idempotency_key) that records who may call the provider for
// it (a fenced lease), under which provider key, and what the outcome was.
//
// The store is the source of truth for "has this payment been charged". Its
// rules:
//
//   - A claim is committed in its own transaction before the provider is
//     called, so a crash after the call always leaves a row to find.
//   - Only the holder of the current lease (holder id and attempt number)
//     may heartbeat, complete, fail or release a row. A worker whose lease
//     expired and was re-acquired by another changes nothing: fencing.
//   - Completing writes the key's outcome and the ledger row in one
//     transaction.
//   - A row on which a provider call may have charged without us learning
//     the answer is marked maybe_charged; it never becomes `failed` until a
//     provider lookup proves nothing was charged.
//   - `failed` means provably nothing charged under the provider key: only
//     a provider answer that proves it, or a lookup, sets it (Fail keeps a
//     maybe_charged row pending; the schema refuses a failed maybe_charged
//     row).
//   - A row, pending or failed, whose key window (the provider's own
//     idempotency-key retention, counted from the first call under the key)
//     has passed is never handed out for a blind re-call: only a lookup may
//     resolve it, and only a lookup that proves nothing was charged starts
//     a fresh window.
//
// dedup knows nothing of HTTP, API keys or the gateway's intake: those are
// the gateway's store (gateway/pgstore) and httpidem's (httpidem/pgstore),
// on tables the same migrations create. One seam remains, a documented
// contract: when a key that has a gateway_intake row becomes completed,
// dedup announces it on CompletedChannel (see there), and the gateway's
// listener, which wakes the requests waiting on the key, consumes it.
//
// pgx is used only in the stores (here, gateway/pgstore, httpidem/pgstore)
// and internal/pg, which they share; its errors never leave the package. cmd opens the pool
// (pg.Connect) and hands it to the stores it builds.
package dedup

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"time"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/payment"
)

// Sentinel errors. Callers test them with errors.Is.
var (
	// ErrNotFound means no row exists for the key.
	ErrNotFound = errors.New("idempotency key not found")
	// ErrLeaseLost means the caller no longer holds the row's lease: it
	// expired and another holder re-acquired it, or the row was finished.
	// Nothing was changed.
	ErrLeaseLost = errors.New("lease lost")
	// ErrLedgerConflict means the ledger already holds the provider charge id
	// under another key, or a payment for this key: the last net against a
	// double charge being recorded. Nothing was changed.
	ErrLedgerConflict = errors.New("ledger conflict")
	// ErrUnavailable means the database could not be reached or the
	// statement did not finish; the operation may be retried. It is
	// pg.ErrUnavailable, the same value in every store.
	ErrUnavailable = pg.ErrUnavailable
)

// CompletedChannel is the LISTEN/NOTIFY channel on which dedup announces,
// at commit, every idempotency_keys row that became completed and has a
// gateway_intake row (only the gateway's keys can have waiters). It is a
// contract with its listener (gateway/pgstore's Listener): the payload is
// JSON, {"s": schema, "m": merchant_id, "k": idempotency_key}, where schema
// is the one the tables live in, so that stores on other schemas of the
// same database ignore it. A row is announced at most once, by whichever
// path completes it: the group commit (CompleteBatch) sends its rows'
// notifications from its own statement (one probe of gateway_intake per
// row) and tells the row trigger of migrations 00003 and 00005 to skip them
// (the transaction-local setting paydedup.completions_notified); every
// other completion (Complete, the reconciler) is announced by that trigger.
// A listener must treat a notification as a hint to re-read the row, never
// as the outcome: notifications sent while it is not listening are lost.
const CompletedChannel = "paydedup_key_completed"

// Status is the state of an idempotency record.
type Status string

// The record states; the schema's CHECK constraints enforce them.
const (
	StatusPending   Status = "pending"
	StatusCompleted Status = "completed"
	StatusFailed    Status = "failed"
)

// Record is one row of idempotency_keys.
type Record struct {
	MerchantID     string
	IdempotencyKey string
	RequestHash    []byte
	Status         Status
	ProviderKey    string
	Amount         int64
	Currency       string
	Attempts       int
	LockedBy       string
	LockedUntil    time.Time // zero unless pending
	MaybeCharged   bool
	KeyWindowStart time.Time
	ChargeID       string
	ResponseStatus int
	Response       json.RawMessage
	LastError      string
	TraceID        string // W3C trace id of the message that first claimed the key; may be empty
	CreatedAt      time.Time
	UpdatedAt      time.Time
	CompletedAt    time.Time
	ExpiresAt      time.Time
}

// Lease is the right to call the provider for one key, held by one holder at
// one attempt number. Every write after the claim presents it.
type Lease struct {
	MerchantID     string
	IdempotencyKey string
	ProviderKey    string
	Holder         string
	Attempt        int
	Until          time.Time
	// TraceID is the trace id stored with the claim: the one every provider
	// call under ProviderKey carries, so the request never changes.
	TraceID string
	// MaybeCharged is true when an earlier holder may already have charged
	// under ProviderKey: the call must reuse the key (it does) and a
	// known-not-charged failure of this call proves nothing.
	MaybeCharged bool
	// CreatedAt is the row's created_at: when its key was first claimed,
	// which never changes, and the day partition the row lives in
	// (migration 00013). The completion names it, so that PostgreSQL
	// looks for the row in that partition alone rather than probing every
	// live day's key index for it.
	CreatedAt time.Time
}

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
}

// NewClaimRequest builds the claim for a validated command.
func NewClaimRequest(c *payment.Command) ClaimRequest {
	return ClaimRequest{
		MerchantID:     c.MerchantID,
		IdempotencyKey: c.IdempotencyKey,
		RequestHash:    Fingerprint(c),
		Amount:         c.Amount,
		Currency:       c.Currency,
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

// Completion is a definitive provider outcome to record.
type Completion struct {
	// ChargeID is the provider's object id; required when charged.
	ChargeID string
	// Declined records a definitive business failure (card declined,
	// invalid payment details), stored and replayed like a success.
	Declined bool
	// Processing records a charge the provider accepted and has not
	// finished (money may still move): the key is completed, never charged
	// again, and its ledger row is `processing` until SettlePayment moves it
	// to `succeeded` or `failed`. ChargeID is required.
	Processing bool
	// ResponseStatus and Response are stored and replayed to duplicates.
	ResponseStatus int
	Response       json.RawMessage
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

// paymentStatus is the ledger status a completion writes.
func (c Completion) paymentStatus() string {
	switch {
	case c.Declined:
		return PaymentDeclined
	case c.Processing:
		return PaymentProcessing
	}
	return PaymentSucceeded
}
