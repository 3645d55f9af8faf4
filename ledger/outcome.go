package ledger

import "time"

// The kinds of an OutcomeEvent.
const (
	OutcomeCharged    = "charged"    // the ledger row's insert, succeeded
	OutcomeDeclined   = "declined"   // the ledger row's insert, declined
	OutcomeProcessing = "processing" // the ledger row's insert, processing: a settled event follows
	OutcomeSettled    = "settled"    // a processing payment ended: succeeded or failed
	OutcomeAuthorized = "authorized" // the ledger row's insert, authorized: an authorize's money held
	// OutcomeRefunded and OutcomeRefundFailed are a refund's final
	// outcome (seq 3, under the refund's own key): succeeded; failed or
	// refused by the provider (Status says which).
	OutcomeRefunded     = "refunded"
	OutcomeRefundFailed = "refund_failed"
)

// OutcomeEvent is one final outcome of a payment as the outbox holds it:
// written with the ledger row (or its settlement) in the same transaction,
// relayed to the outcomes stream under EventID.
type OutcomeEvent struct {
	ID             int64  // the outbox's own order; the relay's cursor
	EventID        string // <merchant_id>:<idempotency_key>:<kind>: stable across retries
	MerchantID     string
	IdempotencyKey string
	Seq            int    // the event's place among its payment's events, from 1
	Kind           string // OutcomeCharged, OutcomeDeclined, OutcomeProcessing, OutcomeSettled, OutcomeAuthorized, OutcomeRefunded or OutcomeRefundFailed
	Status         string // the ledger status the outcome left: PaymentSucceeded, ...
	Amount         int64
	Currency       string
	ChargeID       string // empty for a decline that created no object
	Reason         string // the provider's reason for a decline or a failed settlement
	OccurredAt     time.Time
}

// OutboxBacklog is what the outbox holds that no relay has published yet.
type OutboxBacklog struct {
	Unrelayed int64
	// Oldest is when the oldest unrelayed event occurred; zero when none.
	Oldest time.Time
	// Now is the store's clock when it counted, to measure Oldest's age.
	Now time.Time
}
