package ledger

import (
	"cmp"
	"encoding/json"
	"net/http"
	"time"
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
	// ResponseStatus and Response are stored and replayed to duplicates.
	ResponseStatus int
	Response       json.RawMessage
}

// PaymentStatus is the ledger status a completion writes.
func (c Completion) PaymentStatus() string {
	switch {
	case c.Declined:
		return PaymentDeclined
	case c.Processing:
		return PaymentProcessing
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
)

// Payment is one row of the payments ledger: the business effect of a
// completed key. The ledger is never purged, so it outlives the key's row.
type Payment struct {
	MerchantID     string
	IdempotencyKey string
	ProviderKey    string
	ChargeID       string // empty for a decline that created no object
	Status         string // PaymentSucceeded, PaymentDeclined, PaymentProcessing or PaymentFailed
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

// SettleStatus is the ledger status and stored HTTP status of a processing
// payment whose provider answer is final: PaymentFailed and 402 when the
// provider declined it (httpStatus, when not 0, over 402), else
// PaymentSucceeded and 200. The reconciler and the gateway's webhook both
// read an answer through it, so the two cannot settle a row differently.
func SettleStatus(declined bool, httpStatus int) (status string, responseStatus int) {
	if declined {
		return PaymentFailed, cmp.Or(httpStatus, http.StatusPaymentRequired)
	}
	return PaymentSucceeded, cmp.Or(httpStatus, http.StatusOK)
}
