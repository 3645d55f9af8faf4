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
	// OutcomeCaptured, OutcomeCanceled, OutcomeCaptureFailed and
	// OutcomeCancelFailed are a capture's or a cancel's final outcome
	// (seq 3, under its own key): captured (status succeeded, the amount
	// received), canceled (status canceled, the amount released), or
	// refused by the provider (status refused).
	OutcomeCaptured      = "captured"
	OutcomeCanceled      = "canceled"
	OutcomeCaptureFailed = "capture_failed"
	OutcomeCancelFailed  = "cancel_failed"
	// OutcomeRefused is a command the worker refused (dead-lettered for
	// bad input or a reused key): final for that command, not for its
	// key, which it never bound. Its status is StatusRefused, its Seq 0.
	OutcomeRefused = "refused"
	// OutcomeWaiting is a command filed for an operator (dead-lettered
	// for a reason that waits for a person: max_deliveries,
	// provider_rejected, ...): not final, a replay that succeeds writes
	// the payment's own final event. Its status is StatusWaiting, its Seq
	// 0 (migration 00029).
	OutcomeWaiting = "waiting_for_operator"
)

// StatusRefused is the status of an OutcomeRefused event: no ledger row
// stands behind it.
const StatusRefused = "refused"

// StatusWaiting is the status of an OutcomeWaiting event.
const StatusWaiting = "waiting_for_operator"

// OutcomeEvent is one final outcome of a payment as the outbox holds it:
// written with the ledger row (or its settlement) in the same transaction,
// relayed to the outcomes stream under EventID.
type OutcomeEvent struct {
	ID int64 // the outbox's own order; the relay's cursor
	// EventID is <merchant_id>:<idempotency_key>:<kind>, or for a refusal
	// or a command waiting for an operator
	// <merchant_id>:<idempotency_key>:<kind>:<stream sequence>: stable
	// across retries.
	EventID        string
	MerchantID     string
	IdempotencyKey string
	Seq            int    // the event's place among its payment's events, from 1 (3 for a refund's); 0 for a refused or waiting command, outside that order
	Kind           string // OutcomeCharged, OutcomeDeclined, OutcomeProcessing, OutcomeSettled, OutcomeAuthorized, OutcomeRefunded, OutcomeRefundFailed, OutcomeRefused or OutcomeWaiting
	Status         string // the ledger status the outcome left: PaymentSucceeded, ...; StatusRefused for a refused command or a refund the provider refused
	Amount         int64
	Currency       string
	ChargeID       string // empty for a decline that created no object
	Reason         string // the provider's reason for a decline or a failed settlement; a refusal's dead-letter reason
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

// Refusal is a command the worker refused, or filed for an operator
// (Waiting), as its outcome event records it (Store.RecordRefusal): written when its dead letter is filed, before the
// message is termed, under an id made of the merchant, the key and the
// stream sequence of the refused message, so a redelivery of that message
// writes no second event.
type Refusal struct {
	MerchantID     string
	IdempotencyKey string
	// StreamSeq is the refused message's sequence in the payments stream.
	StreamSeq uint64
	// Reason is the dead letter's: a payment.Reason or key_reused.
	Reason string
	// Amount and Currency are the command's as decoded, 0 and "" when
	// they could not be read.
	Amount   int64
	Currency string
	// FiledAt is when the dead letter was filed.
	FiledAt time.Time
	// Waiting: the command is not refused but filed for an operator (its
	// Reason is no refusal); its event is OutcomeWaiting, under
	// <merchant_id>:<idempotency_key>:waiting_for_operator:<StreamSeq>.
	Waiting bool
}
