package payment

import (
	"encoding/json"
	"slices"

	"github.com/paydedup/paydedup/internal/redact"
)

// The card-data door. Commands carry payment-method tokens (pm_...):
// nothing in paydedup has a reason to hold a card number, and one that gets
// in is stored, published, logged and sent to the provider as metadata. So
// a command with something that looks like one (redact.ContainsPAN, the
// definition the masks share) in any field a person can type is refused
// before anything is done with it. The error names the field, never the
// value.

// cardDataMsg is what a card_data error says after the field.
const cardDataMsg = "holds what looks like a card number (13 to 19 digits with a card brand's prefix and length, passing the Luhn check); " +
	"send a payment-method token (pm_...), never card data"

// CardDataError is the card_data error for field; the value is never in it.
func CardDataError(field string) *ValidationError {
	return &ValidationError{Reason: ReasonCardData, Field: field, Msg: cardDataMsg}
}

// CheckCardData returns CardDataError(field) when value looks like it holds
// a card number, and nil otherwise.
func CheckCardData(field, value string) error {
	if redact.ContainsPAN(value) {
		return CardDataError(field)
	}
	return nil
}

// refuseCardData is the door of Decode: the card_data error when anything
// the command came with holds what looks like a card number, else nil.
// It looks at the envelope (the Idempotency-Key header, the subject's
// merchant), then at the decoded command's fields when the body decoded
// (c, valid or not), and, when the body did not make a valid command, at
// every string of the raw body too: a card number in an unknown field, a
// malformed body or trailing data is still card data, and the error of
// another reason could quote it.
func refuseCardData(body []byte, env Envelope, c *Command, decodeErr error) error {
	if env.HeaderKeySet {
		if err := CheckCardData("Idempotency-Key", env.HeaderKey); err != nil {
			return err
		}
	}
	if err := CheckCardData("subject", env.SubjectMerchant); err != nil {
		return err
	}
	if c != nil {
		if err := c.cardData(); err != nil {
			return err
		}
	}
	if decodeErr != nil && bodyStringsHoldPAN(body) {
		return CardDataError("body")
	}
	return nil
}

// bodyStringsHoldPAN reports whether any string of a body that did not
// decode, a member name or a value, holds what looks like a card number,
// its escapes decoded. It reads what lies between unescaped quotes, so a
// malformed body is read as far as it goes. Numbers are not looked at:
// an amount past int64 is bad input, not card data, and typed card numbers
// arrive as strings.
func bodyStringsHoldPAN(body []byte) bool {
	for i := 0; i < len(body); i++ {
		if body[i] != '"' {
			continue
		}
		end, escaped := i+1, false
		for ; end < len(body) && body[end] != '"'; end++ {
			if body[end] == '\\' {
				escaped = true
				end++
			}
		}
		lit := body[i+1 : min(end, len(body))]
		s := string(lit)
		if escaped {
			var v string
			if json.Unmarshal(body[i:min(end+1, len(body))], &v) == nil {
				s = v
			}
		}
		if redact.ContainsPAN(s) {
			return true
		}
		i = end
	}
	return false
}

// cardData checks every field of a decoded command a person types. A
// metadata key holding a card number is reported as "metadata" (naming it
// would show the number), a value as "metadata.<key>"; the first in key
// order, so the error is the same on every run.
func (c *Command) cardData() error {
	for _, f := range [...]struct{ name, value string }{
		{"idempotency_key", c.IdempotencyKey}, {"merchant_id", c.MerchantID}, {"currency", c.Currency},
		{"payment_method", c.PaymentMethod}, {"description", c.Description},
	} {
		if err := CheckCardData(f.name, f.value); err != nil {
			return err
		}
	}
	found := false
	for k, v := range c.Metadata {
		if redact.ContainsPAN(k) || redact.ContainsPAN(v) {
			found = true
			break
		}
	}
	if !found {
		return nil
	}
	keys := make([]string, 0, len(c.Metadata))
	for k := range c.Metadata {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if redact.ContainsPAN(k) {
			return CardDataError("metadata")
		}
		if redact.ContainsPAN(c.Metadata[k]) {
			return CardDataError("metadata." + clip(k))
		}
	}
	return nil
}
