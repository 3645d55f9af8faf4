package ledger

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
)

// authorizeKeyPrefix starts the provider key of an authorize; a charge's
// starts "pdk_" (ProviderKey).
const authorizeKeyPrefix = "pda_"

// ProviderKeyFor derives the provider idempotency key of a command of the
// given kind (payment.KindCharge or payment.KindAuthorize). A charge's is
// ProviderKey's, unchanged, so keys claimed before kinds keep theirs. An
// authorize's is derived under its own prefix and tag: the kind is stored
// in the key the claim writes before the first call, and whoever resolves
// the row later (a redelivery, the reconciler) reads it back from there
// (KindOfProviderKey) without another column.
func ProviderKeyFor(kind, merchantID, idempotencyKey string) string {
	if kind != payment.KindAuthorize {
		return ProviderKey(merchantID, idempotencyKey)
	}
	h := sha256.New()
	h.Write([]byte("paydedup/authorize-key/v1\x00"))
	h.Write([]byte(merchantID))
	h.Write([]byte{0})
	h.Write([]byte(idempotencyKey))
	return authorizeKeyPrefix + hex.EncodeToString(h.Sum(nil))
}

// KindOfProviderKey is the kind of the command a stored provider key was
// derived for (ProviderKeyFor).
func KindOfProviderKey(providerKey string) string {
	if strings.HasPrefix(providerKey, authorizeKeyPrefix) {
		return payment.KindAuthorize
	}
	return payment.KindCharge
}

// CompletionFor is the completion stored for a provider's definitive
// answer to a command of the given kind (KindOfProviderKey of the row's
// provider key): CompletionOf's, but an intent left requires_capture
// (Outcome.Authorized) is
//   - for an authorize, the payment authorized: the money held, not moved;
//   - for a charge, which asked for the money to move, never charged: it
//     is completed as processing (202, the ledger row processing), so the
//     key is never charged again and the payment settles by lookup when
//     the provider captures or releases it.
func CompletionFor(kind string, out *provider.Outcome, body MissingBody) Completion {
	c := CompletionOf(out, body)
	if !out.Authorized || out.Declined || out.Processing {
		return c
	}
	if kind == payment.KindAuthorize {
		c.Authorized = true
		return c
	}
	c.Processing, c.ResponseStatus = true, http.StatusAccepted
	return c
}

// intentFields are the fields of a stored intent a client's state shows.
type intentFields struct {
	Status           string `json:"status"`
	AmountCapturable *int64 `json:"amount_capturable"`
}

// authorizedAnswer reports whether a stored 2xx answer is an intent left
// requires_capture, and how much of it is capturable (def when the answer
// does not say).
func authorizedAnswer(response json.RawMessage, def int64) (bool, int64) {
	var f intentFields
	if json.Unmarshal(response, &f) != nil || f.Status != provider.StatusRequiresCapture {
		return false, 0
	}
	if f.AmountCapturable != nil {
		return true, *f.AmountCapturable
	}
	return true, def
}
