// Package payment owns the payment command: its fields, its strict decoding
// and validation, and the canonical encoding its fingerprint is computed over.
//
// It has no dependencies beyond the standard library (and internal/redact,
// the one definition of a card number), so every other package
// (the store, the worker, the CLI) can share one definition of a valid
// command and one definition of "the same request".
package payment

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/paydedup/paydedup/internal/redact"
)

// Limits on a command. They follow the provider's own limits where it has
// them (Stripe: 50 metadata keys, 40-character keys, 500-character values).
const (
	DefaultMaxBodyBytes   = 64 << 10
	DefaultMaxAmount      = 99_999_999 // Stripe's largest amount in minor units
	MaxKeyLen             = 255
	MaxMerchantLen        = 64
	MaxPaymentMethodLen   = 255
	MaxDescriptionLen     = 1000
	MaxMetadataEntries    = 47 // Stripe allows 50; paydedup adds merchant_id, idempotency_key and trace_id
	MaxMetadataKeyLen     = 40
	MaxMetadataValueLen   = 500
	maxJSONNestingAllowed = 3 // object → metadata object → string
)

// Command is one payment command as published on the queue.
type Command struct {
	MerchantID     string            `json:"merchant_id"`
	IdempotencyKey string            `json:"idempotency_key"`
	Amount         int64             `json:"amount"`
	Currency       string            `json:"currency"`
	PaymentMethod  string            `json:"payment_method"`
	Description    string            `json:"description,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	// Kind is what the command asks of the provider (KindCharge, the
	// default when empty, or KindAuthorize). A charge's kind is left out of
	// its encoding, so its fingerprint is the one it had before kinds.
	Kind string `json:"kind,omitempty"`
	// PaymentKey names the payment a refund, a capture or a cancel acts
	// on: that payment's idempotency key, under the same merchant. Only
	// those kinds have one (ActsOnPayment).
	PaymentKey string `json:"payment_key,omitempty"`
}

// The kinds of a command. KindRefund acts on a charged payment (named by
// PaymentKey); KindCapture and KindCancel on an authorized one.
const (
	KindCharge    = "charge"
	KindAuthorize = "authorize" // a charge with manual capture: the money is held, not moved
	KindCapture   = "capture"
	KindCancel    = "cancel"
	KindRefund    = "refund"
)

// KindOf is the command's kind, KindCharge when it names none.
func (c *Command) KindOf() string {
	if c.Kind == "" {
		return KindCharge
	}
	return c.Kind
}

// ActsOnPayment reports whether the command acts on a payment named by its
// PaymentKey (a refund, a capture, a cancel) rather than being one: it is
// claimed in its own table, under the payment's lock, never under a
// payment's key.
func (c *Command) ActsOnPayment() bool {
	return c.Kind == KindRefund || c.Kind == KindCapture || c.Kind == KindCancel
}

// Reason names why a command was rejected. Reasons are stable strings: they
// become dead-letter subjects (payments.dlq.<reason>) and metric labels.
type Reason string

// The reasons a command can be rejected before any claim is made.
const (
	ReasonBodyTooLarge     Reason = "body_too_large"
	ReasonInvalidEncoding  Reason = "invalid_encoding"
	ReasonMalformedJSON    Reason = "malformed_json"
	ReasonUnknownField     Reason = "unknown_field"
	ReasonDuplicateField   Reason = "duplicate_field"
	ReasonMissingKey       Reason = "missing_key"
	ReasonInvalidKey       Reason = "invalid_key"
	ReasonKeyMismatch      Reason = "key_mismatch"
	ReasonInvalidMerchant  Reason = "invalid_merchant"
	ReasonMerchantMismatch Reason = "merchant_mismatch"
	ReasonInvalidAmount    Reason = "invalid_amount"
	ReasonAmountOverLimit  Reason = "amount_over_limit"
	ReasonInvalidCurrency  Reason = "invalid_currency"
	ReasonInvalidMethod    Reason = "invalid_payment_method"
	ReasonInvalidDesc      Reason = "invalid_description"
	ReasonInvalidMetadata  Reason = "invalid_metadata"
	ReasonInvalidKind      Reason = "invalid_kind"
	// ReasonCardData: something in the command looks like a card number
	// (a PAN). Commands carry payment-method tokens; paydedup refuses to
	// hold card data, whatever else is wrong with the message (card.go).
	ReasonCardData Reason = "card_data"
)

// InputReasons lists every Reason: all of them mean the message itself is
// wrong, so replaying it unchanged cannot succeed.
var InputReasons = []Reason{
	ReasonBodyTooLarge, ReasonInvalidEncoding, ReasonMalformedJSON, ReasonUnknownField,
	ReasonDuplicateField, ReasonMissingKey, ReasonInvalidKey, ReasonKeyMismatch,
	ReasonInvalidMerchant, ReasonMerchantMismatch, ReasonInvalidAmount, ReasonAmountOverLimit,
	ReasonInvalidCurrency, ReasonInvalidMethod, ReasonInvalidDesc, ReasonInvalidMetadata,
	ReasonCardData, ReasonInvalidKind,
}

// IsInputReason reports whether r is one of the bad-input reasons.
func IsInputReason(r string) bool { return slices.Contains(InputReasons, Reason(r)) }

// ValidationError is returned for a command that must not be processed. It
// names the field at fault so an operator can fix the publisher.
type ValidationError struct {
	Reason Reason
	Field  string
	Msg    string
}

// Error says the reason, the field if there is one, and what is wrong.
func (e *ValidationError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s: %s", e.Reason, e.Msg)
	}
	return fmt.Sprintf("%s: %s: %s", e.Reason, e.Field, e.Msg)
}

// invalid words a ValidationError. Its message quotes what a publisher
// wrote, clipped; it is masked whole as well, as it is stored in a dead
// letter's Dlq-Error, logged and shown.
func invalid(r Reason, field, format string, args ...any) *ValidationError {
	return &ValidationError{Reason: r, Field: field, Msg: redact.PANs(fmt.Sprintf(format, args...))}
}

// Limits configures decoding. The zero value means the defaults.
type Limits struct {
	MaxBodyBytes int
	MaxAmount    int64
}

func (l Limits) withDefaults() Limits {
	if l.MaxBodyBytes <= 0 {
		l.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if l.MaxAmount <= 0 {
		l.MaxAmount = DefaultMaxAmount
	}
	return l
}

// Envelope is what arrives with a command besides its body: the subject's
// merchant token and the optional Idempotency-Key header.
type Envelope struct {
	SubjectMerchant string // last token of payments.requests.<merchant_id>; empty to skip the check
	HeaderKey       string // Idempotency-Key header; empty when absent
	HeaderKeySet    bool   // the header was present (even if empty)
}

// Decode strictly decodes and validates a command body. Any problem is a
// *ValidationError; Decode never panics on hostile input. A command with
// card data anywhere (refuseCardData) is refused as card_data, whatever
// else is wrong with it, so no other reason's error quotes a card number.
func Decode(body []byte, env Envelope, lim Limits) (*Command, error) {
	c, err := decode(body, env, lim)
	if cerr := refuseCardData(body, env, c, err); cerr != nil {
		return nil, cerr
	}
	if err != nil {
		return nil, err
	}
	return c, nil
}

// DecodeAsSent reads a body Decode refused as far as it decodes, for what
// a refusal may report of the command (its key, amount and currency): the
// command, valid or not, when the body holds one JSON object of the
// command's fields, else nil. Nothing is validated and no card data is
// looked for, so a caller that shows a value checks it itself; a command
// is never acted on from it.
func DecodeAsSent(body []byte, lim Limits) *Command {
	c, _ := decode(body, Envelope{}, lim)
	return c
}

// decode is Decode without the card-data door. When the body decodes but
// the command is invalid it returns the command with the error, for the
// door to name the field holding card data.
func decode(body []byte, env Envelope, lim Limits) (*Command, error) {
	lim = lim.withDefaults()
	if len(body) > lim.MaxBodyBytes {
		return nil, invalid(ReasonBodyTooLarge, "", "body is %d bytes, limit is %d", len(body), lim.MaxBodyBytes)
	}
	if !utf8.Valid(body) {
		return nil, invalid(ReasonInvalidEncoding, "", "body is not valid UTF-8")
	}
	end, err := checkStructure(body)
	if err != nil {
		return nil, err
	}
	if end < 0 {
		// Nothing, or a value cut short between two tokens.
		if len(bytes.TrimLeft(body, " \t\r\n")) == 0 {
			return nil, invalid(ReasonMalformedJSON, "", "%v", io.EOF)
		}
		return nil, invalid(ReasonMalformedJSON, "", "%v", io.ErrUnexpectedEOF)
	}
	c, err := decodeCommand(body[:end])
	if err != nil {
		return nil, err
	}
	if len(bytes.TrimLeft(body[end:], " \t\r\n")) > 0 {
		return c, invalid(ReasonMalformedJSON, "", "trailing data after the JSON object")
	}
	if env.HeaderKeySet {
		if c.IdempotencyKey == "" {
			c.IdempotencyKey = env.HeaderKey
		} else if env.HeaderKey != c.IdempotencyKey {
			return c, invalid(ReasonKeyMismatch, "idempotency_key", "Idempotency-Key header %q differs from the body's %q", clip(env.HeaderKey), clip(c.IdempotencyKey))
		}
	}
	if err := c.Validate(lim); err != nil {
		return c, err
	}
	if env.SubjectMerchant != "" && env.SubjectMerchant != c.MerchantID {
		return c, invalid(ReasonMerchantMismatch, "merchant_id", "subject merchant %q differs from the body's %q", clip(env.SubjectMerchant), c.MerchantID)
	}
	return c, nil
}

// Validate checks the fields of a decoded command.
func (c *Command) Validate(lim Limits) error {
	lim = lim.withDefaults()
	if c == nil {
		return invalid(ReasonMalformedJSON, "", "no command")
	}
	if err := ValidateKey(c.IdempotencyKey); err != nil {
		return err
	}
	if err := ValidateMerchant(c.MerchantID); err != nil {
		return err
	}
	if err := ValidateKind(c.Kind); err != nil {
		return err
	}
	if c.ActsOnPayment() {
		return c.validateRefund(lim)
	}
	if c.PaymentKey != "" {
		return invalid(ReasonInvalidKind, "payment_key", "only a refund, a capture or a cancel names a payment")
	}
	switch {
	case c.Amount <= 0:
		return invalid(ReasonInvalidAmount, "amount", "must be a positive integer in minor units, got %d", c.Amount)
	case c.Amount > lim.MaxAmount:
		return invalid(ReasonAmountOverLimit, "amount", "%d exceeds the limit of %d", c.Amount, lim.MaxAmount)
	}
	if !ValidCurrency(c.Currency) {
		return invalid(ReasonInvalidCurrency, "currency", "%q is not a lower-case ISO 4217 code", clip(c.Currency))
	}
	if c.PaymentMethod == "" || len(c.PaymentMethod) > MaxPaymentMethodLen || !printableASCII(c.PaymentMethod) {
		return invalid(ReasonInvalidMethod, "payment_method", "must be 1..%d printable ASCII characters", MaxPaymentMethodLen)
	}
	if !utf8.ValidString(c.Description) || utf8.RuneCountInString(c.Description) > MaxDescriptionLen || hasControl(c.Description) {
		return invalid(ReasonInvalidDesc, "description", "must be at most %d characters without control characters", MaxDescriptionLen)
	}
	if len(c.Metadata) > MaxMetadataEntries {
		return invalid(ReasonInvalidMetadata, "metadata", "%d entries, limit is %d", len(c.Metadata), MaxMetadataEntries)
	}
	for k, v := range c.Metadata {
		if k == "" || !utf8.ValidString(k) || len(k) > MaxMetadataKeyLen || hasControl(k) || hasBracket(k) {
			return invalid(ReasonInvalidMetadata, "metadata", "key %q must be 1..%d characters without control characters or brackets", clip(k), MaxMetadataKeyLen)
		}
		if !utf8.ValidString(v) || utf8.RuneCountInString(v) > MaxMetadataValueLen || hasControl(v) {
			return invalid(ReasonInvalidMetadata, "metadata", "value of %q must be at most %d characters without control characters", clip(k), MaxMetadataValueLen)
		}
		if k == "merchant_id" || k == "idempotency_key" || k == "trace_id" {
			return invalid(ReasonInvalidMetadata, "metadata", "key %q is reserved", clip(k))
		}
	}
	return nil
}

// ValidateKey checks an idempotency key: 1..255 printable ASCII characters.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return invalid(ReasonMissingKey, "idempotency_key", "is required")
	case len(key) > MaxKeyLen:
		return invalid(ReasonInvalidKey, "idempotency_key", "is %d characters, limit is %d", len(key), MaxKeyLen)
	case !printableASCII(key):
		return invalid(ReasonInvalidKey, "idempotency_key", "must be printable ASCII")
	}
	return nil
}

// ValidateKind checks a command's kind: empty (a charge), charge,
// authorize, capture, cancel or refund; any other is invalid_kind.
func ValidateKind(kind string) error {
	switch kind {
	case "", KindCharge, KindAuthorize, KindRefund, KindCapture, KindCancel:
		return nil
	}
	return invalid(ReasonInvalidKind, "kind", "%q is not a kind; kinds handled: charge, authorize, capture, cancel, refund", clip(kind))
}

// validateRefund checks the fields of a command that acts on a payment (a
// refund, a capture, a cancel): the payment (payment_key, a key of the
// same merchant), an amount that is 0 (the rest of the payment) or
// positive (a cancel has none), a currency that, when given, is a code
// (the claim checks it is the payment's), no payment method (the money
// goes back to, or is taken from, the payment's), and metadata as a
// charge's.
func (c *Command) validateRefund(lim Limits) error {
	if err := ValidateKey(c.PaymentKey); err != nil {
		return invalid(ReasonInvalidKey, "payment_key", "a %s names the payment it acts on by its idempotency key, 1..%d printable ASCII", c.Kind, MaxKeyLen)
	}
	if c.Kind == KindCancel && c.Amount != 0 {
		return invalid(ReasonInvalidAmount, "amount", "a cancel voids the whole authorization: it names no amount, got %d", c.Amount)
	}
	switch {
	case c.Amount < 0:
		return invalid(ReasonInvalidAmount, "amount", "must be a positive integer in minor units, or absent for the rest of the payment, got %d", c.Amount)
	case c.Amount > lim.MaxAmount:
		return invalid(ReasonAmountOverLimit, "amount", "%d exceeds the limit of %d", c.Amount, lim.MaxAmount)
	}
	if c.Currency != "" && !ValidCurrency(c.Currency) {
		return invalid(ReasonInvalidCurrency, "currency", "%q is not a lower-case ISO 4217 code", clip(c.Currency))
	}
	if c.PaymentMethod != "" {
		return invalid(ReasonInvalidMethod, "payment_method", "a %s acts on the payment's method: it names none", c.Kind)
	}
	c2 := *c
	c2.Kind, c2.PaymentKey, c2.Amount, c2.Currency, c2.PaymentMethod = "", "", 1, "usd", "pm"
	return c2.Validate(lim)
}

// ValidateMerchant checks a merchant id: 1..64 of [A-Za-z0-9_-], since it is
// also a subject token.
func ValidateMerchant(m string) error {
	if m == "" || len(m) > MaxMerchantLen || !merchantChars(m) {
		return invalid(ReasonInvalidMerchant, "merchant_id", "%q must be 1..%d of [A-Za-z0-9_-]", clip(m), MaxMerchantLen)
	}
	return nil
}

// merchantChars reports whether s has only [A-Za-z0-9_-].
func merchantChars(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// AppendCanonical appends the canonical encoding of the command that its
// fingerprint is computed over to dst and returns the extended slice: a
// version tag, then every field in a fixed order, each length-prefixed so
// no two commands share an encoding, with metadata sorted by key. JSON
// field order and whitespace do not reach it. A caller hashing it can keep
// the bytes in a buffer of its own (ledger.Fingerprint, on the stack).
// A charge's encoding has no kind (so it is the one it was before kinds);
// any other kind is appended, length-prefixed, after the metadata, so no
// authorize shares an encoding with a charge, and a refund's payment key
// after it.
func (c *Command) AppendCanonical(dst []byte) []byte {
	put := func(b []byte, s string) []byte {
		return append(binary.BigEndian.AppendUint32(b, uint32(len(s))), s...)
	}
	b := append(dst, "paydedup.command.v1"...)
	b = put(b, c.MerchantID)
	b = put(b, c.IdempotencyKey)
	b = binary.BigEndian.AppendUint64(b, uint64(c.Amount))
	b = put(b, c.Currency)
	b = put(b, c.PaymentMethod)
	b = put(b, c.Description)
	var small [8]string // metadata is short: its keys sorted without a heap slice
	keys := small[:0]
	for k := range c.Metadata {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = binary.BigEndian.AppendUint32(b, uint32(len(keys)))
	for _, k := range keys {
		b = put(b, k)
		b = put(b, c.Metadata[k])
	}
	if k := c.KindOf(); k != KindCharge {
		b = put(b, k)
	}
	if c.PaymentKey != "" {
		b = put(b, c.PaymentKey)
	}
	return b
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func hasControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return true
		}
	}
	return false
}

// hasBracket reports whether s has a '[' or a ']'. It is strings.ContainsAny
// without the rune decoding: Decode calls it for every metadata key.
func hasBracket(s string) bool {
	return strings.IndexByte(s, '[') >= 0 || strings.IndexByte(s, ']') >= 0
}

// clip keeps hostile values short in error messages, card numbers masked
// before the cut: an error is stored in a dead letter's Dlq-Error, logged
// and shown.
func clip(s string) string {
	const n = 64
	s, cut := redact.Cut(s, n)
	if !cut {
		return strings.ToValidUTF8(s, "?")
	}
	return strings.ToValidUTF8(s, "?") + "…"
}
