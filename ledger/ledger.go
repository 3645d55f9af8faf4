// Package ledger holds the words of a payment's life in paydedup, with no
// database behind them: an idempotency key's record (Record, Status), the
// fenced right to call the provider for it (Lease), a claim and what it
// found (ClaimRequest, ClaimResult, Outcome), a definitive provider outcome
// to record (Completion), the payments ledger's rows (Payment), the
// request's fingerprint and the provider key derived from ours, the
// sentinel errors every store returns, and the pure rules over them
// (Evaluate, CompletionOf, and StateOf: a payment's state as its client
// sees it).
//
// The stores are written in these words: dedup is the PostgreSQL
// implementation, and the packages above it (consumer, reconciler,
// gateway, audit, console) declare the store interfaces they use in them,
// so that none of them links a database driver. (River's rivertype plays
// the same part beside riverdriver and riverpgxv5.)
package ledger

import (
	"errors"
	"time"

	"github.com/paydedup/paydedup/internal/storeerr"
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
	// statement did not finish; the operation may be retried. Every store
	// returns this value (internal/pg's ErrUnavailable is it too).
	ErrUnavailable = storeerr.ErrUnavailable
)

// Defaults of the stores' configuration.
const (
	// DefaultRetention is how long a finished key is kept. It must outlive
	// the redelivery schedule of its message (the payments stream has no
	// max age; consumer.RedeliverySchedule) and dlq replay refuses letters
	// older than it.
	DefaultRetention = 48 * time.Hour
	// DefaultProviderKeyWindow is how long the provider is trusted to replay
	// a key: Stripe keeps keys at least 24 h; we keep a margin.
	DefaultProviderKeyWindow = 23 * time.Hour
)
