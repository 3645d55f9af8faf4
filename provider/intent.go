package provider

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// DeclineAuthenticationRequired is the decline code of a charge that needed
// the customer to authenticate (3-D Secure): Stripe's own code for the 402 it
// sends off-session, and the code we record for an on-session intent left
// requires_action that the adapter canceled.
const DeclineAuthenticationRequired = "authentication_required"

// ErrForeignIntent is wrapped, in an *Error of ClassUnknown, when a lookup
// met an intent that is not the key's own: its metadata merchant_id or
// idempotency_key, its amount or its currency differ from the row's. The
// row must not be completed from it, nor marked not charged; it waits for
// a person.
var ErrForeignIntent = errors.New("foreign payment intent")

// IntentFacts are the fields of a provider's intent that say whose it is.
type IntentFacts struct {
	ID                         string
	MerchantID, IdempotencyKey string
	Amount                     int64
	Currency                   string
}

// CheckIntent returns nil when in can be req's intent: the same metadata
// merchant_id and idempotency_key (when req names them), amount (when
// req.Amount is not 0) and currency (when req.Currency is not empty). Else it
// returns an *Error of ClassUnknown wrapping ErrForeignIntent that names
// what differs.
func CheckIntent(req LookupRequest, in IntentFacts) error {
	var diffs []string
	if req.MerchantID != "" && in.MerchantID != req.MerchantID {
		diffs = append(diffs, fmt.Sprintf("metadata merchant_id %q", in.MerchantID))
	}
	if req.IdempotencyKey != "" && in.IdempotencyKey != req.IdempotencyKey {
		diffs = append(diffs, fmt.Sprintf("metadata idempotency_key %q", in.IdempotencyKey))
	}
	if req.Amount != 0 && in.Amount != req.Amount {
		diffs = append(diffs, fmt.Sprintf("amount %d, not %d", in.Amount, req.Amount))
	}
	if req.Currency != "" && !strings.EqualFold(in.Currency, req.Currency) {
		diffs = append(diffs, fmt.Sprintf("currency %q, not %q", in.Currency, req.Currency))
	}
	if len(diffs) == 0 {
		return nil
	}
	return &Error{Class: ClassUnknown,
		Message: fmt.Sprintf("payment intent %s belongs to another key (%s)", in.ID, strings.Join(diffs, ", ")),
		Err:     ErrForeignIntent}
}

// CancelKey is the idempotency key under which an adapter cancels the
// intent intentID that a charge under providerKey left requiring action:
// derived from both, so a repeated cancel (a redelivery, the reconciler)
// replays the first, and never equal to the charge's own key.
func CancelKey(providerKey, intentID string) string {
	h := sha256.New()
	h.Write([]byte("paydedup/cancel-key/v1\x00"))
	h.Write([]byte(providerKey))
	h.Write([]byte{0})
	h.Write([]byte(intentID))
	return "pdc_" + hex.EncodeToString(h.Sum(nil))
}
