package ledger

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/paydedup/paydedup/provider"
)

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
	// Authorized records an authorization (an authorize's intent left
	// requires_capture): the money is held, not moved; its ledger row is
	// `authorized`. ChargeID is required. CompletionFor sets it.
	Authorized bool
	// ResponseStatus and Response are stored and replayed to duplicates.
	ResponseStatus int
	Response       json.RawMessage
}

// MissingBody says what CompletionOf stores when the provider's answer
// came without a body.
type MissingBody int

const (
	// SummaryIfNoBody stores a summary of the answer (its id, status and
	// whether it was declined): the worker's choice, for the answer to its
	// own charge call, which must be replayable whatever the adapter read.
	SummaryIfNoBody MissingBody = iota
	// ProviderBodyOnly stores the provider's body or nothing: the
	// reconciler's and the settle path's choice. A charge found by lookup
	// without its body is not recorded from a summary: the store refuses
	// the empty body and the row stays pending, counted as an error, for a
	// person to read (TestUnusableAnswersLeaveRowPending).
	ProviderBodyOnly
)

// CompletionOf is the completion stored for a provider's definitive answer,
// by the worker, the reconciler and the settle path alike: the provider's
// HTTP status, else 402 for a decline, 202 for a payment still processing
// (accepted, not finished) and 200 for a charge; and its body, or what body
// says when it gave none.
func CompletionOf(out *provider.Outcome, body MissingBody) Completion {
	c := Completion{ChargeID: out.ChargeID, Declined: out.Declined, Processing: out.Processing,
		ResponseStatus: out.HTTPStatus, Response: out.Response}
	if c.ResponseStatus == 0 {
		c.ResponseStatus = http.StatusOK
		switch {
		case out.Declined:
			c.ResponseStatus = http.StatusPaymentRequired
		case out.Processing:
			c.ResponseStatus = http.StatusAccepted
		}
	}
	if len(c.Response) == 0 && body == SummaryIfNoBody {
		c.Response, _ = json.Marshal(map[string]any{"id": out.ChargeID, "status": out.Status, "declined": out.Declined})
	}
	return c
}

// SettleStatus is the ledger status a processing payment settles to when
// the provider's answer, as this completion, is final (not Processing):
// PaymentFailed for a decline, else PaymentSucceeded; ResponseStatus is the
// status stored with it. The reconciler and the gateway's webhook both
// settle through it, so the two cannot settle a row differently.
func (c Completion) SettleStatus() string {
	if c.Declined {
		return PaymentFailed
	}
	return PaymentSucceeded
}

// PaymentStatus is the ledger status a completion writes.
func (c Completion) PaymentStatus() string {
	switch {
	case c.Declined:
		return PaymentDeclined
	case c.Processing:
		return PaymentProcessing
	case c.Authorized:
		return PaymentAuthorized
	}
	return PaymentSucceeded
}

// The ledger's payment statuses. A row is never changed but for one
// transition, guarded by the schema (migration 00009): PaymentProcessing to
// PaymentSucceeded or PaymentFailed, by SettlePayment.
const (
	PaymentSucceeded  = "succeeded"
	PaymentDeclined   = "declined"
	PaymentProcessing = "processing"
	// PaymentFailed is a processing payment that ended without moving
	// money (a bank debit returned).
	PaymentFailed = "failed"
	// PaymentAuthorized is an authorize's payment: the money held at the
	// provider, not moved (migration 00023).
	PaymentAuthorized = "authorized"
)

// Payment is one row of the payments ledger: the business effect of a
// completed key. The ledger is never purged, so it outlives the key's row.
type Payment struct {
	MerchantID     string
	IdempotencyKey string
	ProviderKey    string
	ChargeID       string // empty for a decline that created no object
	Status         string // PaymentSucceeded, PaymentDeclined, PaymentProcessing, PaymentFailed or PaymentAuthorized
	Amount         int64
	Currency       string
	CreatedAt      time.Time
	SettledAt      time.Time // when a processing payment settled; zero otherwise
}

// ProcessingCursor is where a scan of processing payments resumes: after
// the payment created at CreatedAt with ledger id ID. The zero value starts
// at the oldest.
type ProcessingCursor struct {
	CreatedAt time.Time
	ID        int64
}

// CancelRecheck is a payment stamped for a recheck of its cancel (an
// event, or an operation refused payment_intent_unexpected_state, said
// the provider may have canceled its authorization): RequestedAt is the
// latest stamp's time (a recheck clears only stamps up to it), Attempts
// the passes that found no answer yet (a failed retrieve, an operation
// in flight), each pushing the stamp back.
type CancelRecheck struct {
	Payment
	RequestedAt time.Time
	Attempts    int
}
