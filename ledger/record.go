package ledger

import (
	"encoding/json"
	"time"
)

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

// Stuck is a pending row the reconciler has leased to resolve.
type Stuck struct {
	Record Record
	Lease  Lease
}

// Backoff is a lookup back-off: the n-th consecutive failed lookup of a row
// delays its next one by Base × 2^(n-1), at most Max.
type Backoff struct {
	Base time.Duration
	Max  time.Duration
}

// CompleteItem is one completion of a batch.
type CompleteItem struct {
	Lease      Lease
	Completion Completion
}

// Stats is the store's state as an operator reads it (paydedup status).
type Stats struct {
	// Now is the time the figures are as of: the database's clock (or the
	// store's test clock).
	Now time.Time
	// Pending, Completed and Failed count rows by status.
	Pending   int64
	Completed int64
	Failed    int64
	// OldestPending is when the oldest pending row became pending (its
	// pending_since); zero when none is pending.
	OldestPending time.Time
	// Stuck counts rows pending for longer than the grace: neither a
	// redelivery nor the reconciler has resolved them yet. Releases and
	// failed lookups do not reset their age.
	Stuck int64
	// LookupBackedOff counts pending rows whose provider lookups failed and
	// are backed off.
	LookupBackedOff int64
	// MaybeCharged counts pending rows on which a provider call may have
	// charged without us learning the answer.
	MaybeCharged int64
	// CompletedLastMinute and CompletedLastHour count outcomes committed in
	// that window (charged or declined), from the ledger.
	CompletedLastMinute int64
	CompletedLastHour   int64
	// DeclinedLastHour is the part of CompletedLastHour that was declined.
	DeclinedLastHour int64
}

// Total is the number of rows.
func (s Stats) Total() int64 { return s.Pending + s.Completed + s.Failed }

// KeyRef names one idempotency record.
type KeyRef struct {
	MerchantID     string
	IdempotencyKey string
}

// PendingCounts are the figures an operator alerts on, cheap enough to read
// on every metrics scrape: both walk pending_keys, which names only the keys
// in flight or stuck.
type PendingCounts struct {
	// Pending counts rows claimed and not finished.
	Pending int64
	// Stuck counts rows pending for longer than the grace: since they became
	// pending (pending_since), however often a redelivery or a failed lookup
	// took and released them since.
	Stuck int64
}
