package ledger

import (
	"bytes"
	"encoding/json"
	"net/http"
	"time"

	"github.com/paydedup/paydedup/payment"
)

// State is a payment's status as its client reads it: the status field of
// the HTTP API's payment.
type State string

// The client-visible states.
const (
	// StateQueued: published; no worker has claimed it yet.
	StateQueued State = "queued"
	// StatePublishUnknown: the gateway sent the command but got no PubAck,
	// so it may be queued; a POST with the same key and body settles it.
	StatePublishUnknown State = "publish_unknown"
	// StateProcessing: a worker holds the key (a provider call under way,
	// or one whose outcome is unknown), or the provider accepted it and
	// money may still move (a stored 202).
	StateProcessing State = "processing"
	// StateRetrying: known not charged; the queue retries it.
	StateRetrying State = "retrying"
	// StateWaitingForOperator: the worker dead-lettered it for a person
	// (PaymentState.Reason says why: provider_rejected, max_deliveries...).
	// Not final: nothing retries it until an operator replays the letter,
	// and the replay may still charge it; once a worker claims the key
	// again, the payment shows its record's state again.
	StateWaitingForOperator State = "waiting_for_operator"
	// StateSucceeded: charged.
	StateSucceeded State = "succeeded"
	// StateDeclined: definitively refused by the provider.
	StateDeclined State = "declined"
	// StateAuthorized: an authorize's money is held at the provider, not
	// moved (PaymentState.AmountCapturable says how much).
	StateAuthorized State = "authorized"
)

// PaymentState is a payment as its client sees it, whatever reads it (the
// gateway's GET and POST answers, the console): its status and the fields
// the HTTP API shows. StateOf builds it from the rows that hold a payment.
type PaymentState struct {
	// Status is the payment's status; empty when nothing is known of the
	// key, and when the payment is Rejected.
	Status State
	// Rejected: the worker dead-lettered the command for good
	// (Intake.DeadLettered): final, never charged. The HTTP API answers
	// the letter's reason as a problem, not a payment.
	Rejected bool
	// Reason is the dead letter's reason of a Rejected payment or of one
	// waiting for an operator.
	Reason string

	IdempotencyKey string
	Amount         int64
	Currency       string
	ChargeID       string
	CreatedAt      time.Time
	// Completed: the provider's outcome is stored (CompletedAt, and, when
	// the key's record still holds it, ResponseStatus and Response), and
	// every later answer is built from it alone.
	Completed      bool
	CompletedAt    time.Time
	ResponseStatus int
	Response       json.RawMessage
	// AmountCapturable is how much of an authorized payment can still be
	// captured; 0 in any other state.
	AmountCapturable int64
}

// Found reports whether anything is known of the payment.
func (s PaymentState) Found() bool { return s.Status != "" || s.Rejected }

// Final reports whether the answer no longer changes: charged, declined,
// authorized (the authorize's outcome), or rejected. A payment completed
// as processing is not final: the provider settles it later.
func (s PaymentState) Final() bool {
	return s.Rejected || s.Status == StateSucceeded || s.Status == StateDeclined || s.Status == StateAuthorized
}

// WaitsForWorker reports whether the payment waits for a worker to move
// it: queued, retrying, or processing with no outcome stored (its key
// pending: a call under way, perhaps waiting for the provider's rate
// limit, or one whose outcome is unknown, which a worker or the reconciler
// settles). Why it waits (the workers paused, none running...) is not the
// payment's: the reader adds it. A payment completed as processing waits
// for the provider instead.
func (s PaymentState) WaitsForWorker() bool {
	return s.Status == StateQueued || s.Status == StateRetrying || s.Status == StateProcessing && !s.Completed
}

// StateOf is a payment's client-visible state from the rows that hold it,
// each nil when absent: the gateway's intake in, the worker's record rec,
// and the ledger row pay. The record decides, unless it is not completed
// and in, for the same request, says the worker dead-lettered the command
// (Rejected) or the payment waits for an operator (Intake.WaitsForOperator).
// Without a record (never claimed, or purged after the key retention) the
// ledger row decides, then the intake: queued once published, else
// publish_unknown. in must be settled: a publish still in flight is the
// gateway's to wait for first.
func StateOf(in *Intake, rec *Record, pay *Payment) PaymentState {
	switch {
	case rec != nil && rec.Status == StatusCompleted:
		return recordState(*rec)
	case rec != nil:
		if in == nil || !bytes.Equal(in.RequestHash, rec.RequestHash) {
			return recordState(*rec)
		}
		if in.DeadLettered() {
			return PaymentState{Rejected: true, Reason: in.DeadLetterReason}
		}
		if in.WaitsForOperator(rec) {
			return OperatorWaitState(*in, rec)
		}
		return recordState(*rec)
	case pay != nil:
		return ledgerState(*pay)
	case in == nil:
		return PaymentState{}
	case in.DeadLettered():
		return PaymentState{Rejected: true, Reason: in.DeadLetterReason}
	case in.WaitsForOperator(nil):
		return OperatorWaitState(*in, nil)
	case !in.Published():
		// No mark of a publish, and none in flight: its PubAck never came
		// (or its mark was lost), so it may be queued.
		st := AcceptedState(*in)
		st.Status = StatePublishUnknown
		return st
	}
	return AcceptedState(*in)
}

// AcceptedState is the state of a payment whose command the gateway has
// published (its PubAck in, its mark perhaps not yet written): queued.
func AcceptedState(in Intake) PaymentState {
	return PaymentState{Status: StateQueued, IdempotencyKey: in.IdempotencyKey, Amount: in.Amount, Currency: in.Currency,
		CreatedAt: in.CreatedAt}
}

// OperatorWaitState is the state of a payment that waits for an operator
// (Intake.WaitsForOperator, which the caller checked): its record's fields
// when it has one (rec), else its intake's, and the letter's reason.
func OperatorWaitState(in Intake, rec *Record) PaymentState {
	st := AcceptedState(in)
	if rec != nil {
		st = recordState(*rec)
	}
	st.Status, st.Reason = StateWaitingForOperator, in.OperatorReason
	return st
}

// recordState is the state the worker's record says.
func recordState(rec Record) PaymentState {
	st := PaymentState{IdempotencyKey: rec.IdempotencyKey, Amount: rec.Amount, Currency: rec.Currency,
		ChargeID: rec.ChargeID, CreatedAt: rec.CreatedAt}
	switch rec.Status {
	case StatusCompleted:
		st.Status = StateDeclined
		switch {
		case rec.ResponseStatus == http.StatusAccepted:
			// Completed as processing: the key is settled, the money not
			// yet (the reconciler stores the final answer later).
			st.Status = StateProcessing
		case rec.ResponseStatus >= 200 && rec.ResponseStatus < 300:
			st.Status = StateSucceeded
			// An authorize's intent left requires_capture: held, not
			// moved. (An authorize the provider captured at once is
			// charged, and says so.)
			if KindOfProviderKey(rec.ProviderKey) == payment.KindAuthorize {
				if ok, capturable := authorizedAnswer(rec.Response, rec.Amount); ok {
					st.Status, st.AmountCapturable = StateAuthorized, capturable
				}
			}
		}
		st.Completed, st.CompletedAt = true, rec.CompletedAt
		st.ResponseStatus, st.Response = rec.ResponseStatus, rec.Response
	case StatusFailed:
		st.Status = StateRetrying
	default:
		st.Status = StateProcessing
	}
	return st
}

// ledgerState is the state of a completed payment whose record was purged:
// the ledger row outlives it, without the provider's stored answer. A
// processing payment that ended without moving money (PaymentFailed) was
// declined.
func ledgerState(p Payment) PaymentState {
	st := PaymentState{IdempotencyKey: p.IdempotencyKey, Amount: p.Amount, Currency: p.Currency, ChargeID: p.ChargeID,
		CreatedAt: p.CreatedAt, Completed: true, CompletedAt: p.CreatedAt}
	switch p.Status {
	case PaymentSucceeded:
		st.Status = StateSucceeded
	case PaymentProcessing:
		st.Status = StateProcessing
	case PaymentAuthorized:
		st.Status, st.AmountCapturable = StateAuthorized, p.Amount
	default:
		st.Status = StateDeclined
	}
	return st
}
