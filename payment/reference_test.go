package payment

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"regexp"
	"strings"
	"unicode/utf8"
)

// This file keeps the original, straightforward implementation of Decode
// (a json.Decoder Token walk, then a DisallowUnknownFields decode, then
// Validate with a regexp for the merchant id) as the reference that the
// faster Decode must agree with on every input; FuzzDecodeMatchesReference
// compares the two. Change it only to fix a bug in both.

// referenceDecode is Decode as it was before the single-pass scanner.
func referenceDecode(body []byte, env Envelope, lim Limits) (*Command, error) {
	lim = lim.withDefaults()
	if len(body) > lim.MaxBodyBytes {
		return nil, invalid(ReasonBodyTooLarge, "", "body is %d bytes, limit is %d", len(body), lim.MaxBodyBytes)
	}
	if !utf8.Valid(body) {
		return nil, invalid(ReasonInvalidEncoding, "", "body is not valid UTF-8")
	}
	if err := referenceCheckStructure(body); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var c Command
	if err := dec.Decode(&c); err != nil {
		return nil, referenceDecodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, invalid(ReasonMalformedJSON, "", "trailing data after the JSON object")
	}
	if env.HeaderKeySet {
		if c.IdempotencyKey == "" {
			c.IdempotencyKey = env.HeaderKey
		} else if env.HeaderKey != c.IdempotencyKey {
			return nil, invalid(ReasonKeyMismatch, "idempotency_key", "Idempotency-Key header %q differs from the body's %q", clip(env.HeaderKey), clip(c.IdempotencyKey))
		}
	}
	if err := referenceValidate(&c, lim); err != nil {
		return nil, err
	}
	if env.SubjectMerchant != "" && env.SubjectMerchant != c.MerchantID {
		return nil, invalid(ReasonMerchantMismatch, "merchant_id", "subject merchant %q differs from the body's %q", clip(env.SubjectMerchant), c.MerchantID)
	}
	return &c, nil
}

// referenceValidate is Command.Validate as it was.
func referenceValidate(c *Command, lim Limits) error {
	lim = lim.withDefaults()
	if c == nil {
		return invalid(ReasonMalformedJSON, "", "no command")
	}
	if err := referenceValidateKey(c.IdempotencyKey); err != nil {
		return err
	}
	if err := referenceValidateMerchant(c.MerchantID); err != nil {
		return err
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
		if k == "" || !utf8.ValidString(k) || len(k) > MaxMetadataKeyLen || hasControl(k) || strings.ContainsAny(k, "[]") {
			return invalid(ReasonInvalidMetadata, "metadata", "key %q must be 1..%d characters without control characters or brackets", clip(k), MaxMetadataKeyLen)
		}
		if !utf8.ValidString(v) || utf8.RuneCountInString(v) > MaxMetadataValueLen || hasControl(v) {
			return invalid(ReasonInvalidMetadata, "metadata", "value of %q must be at most %d characters without control characters", clip(k), MaxMetadataValueLen)
		}
		if k == "merchant_id" || k == "idempotency_key" || k == "trace_id" {
			return invalid(ReasonInvalidMetadata, "metadata", "key %q is reserved", k)
		}
	}
	return nil
}

// referenceValidateKey is ValidateKey as it was.
func referenceValidateKey(key string) error {
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

var referenceMerchantRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// referenceValidateMerchant is ValidateMerchant as it was.
func referenceValidateMerchant(m string) error {
	if !referenceMerchantRE.MatchString(m) {
		return invalid(ReasonInvalidMerchant, "merchant_id", "%q must be 1..%d of [A-Za-z0-9_-]", clip(m), MaxMerchantLen)
	}
	return nil
}

// referenceDecodeError is decodeError as it was.
func referenceDecodeError(err error) error {
	var typeErr *json.UnmarshalTypeError
	var synErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		switch typeErr.Field {
		case "amount":
			return invalid(ReasonInvalidAmount, "amount", "must be an integer in minor units within int64, got JSON %s", clip(typeErr.Value))
		case "idempotency_key":
			return invalid(ReasonInvalidKey, "idempotency_key", "must be a string")
		case "merchant_id":
			return invalid(ReasonInvalidMerchant, "merchant_id", "must be a string")
		case "currency":
			return invalid(ReasonInvalidCurrency, "currency", "must be a string")
		case "payment_method":
			return invalid(ReasonInvalidMethod, "payment_method", "must be a string")
		case "description":
			return invalid(ReasonInvalidDesc, "description", "must be a string")
		}
		if strings.HasPrefix(typeErr.Field, "metadata") {
			return invalid(ReasonInvalidMetadata, "metadata", "must be an object of strings")
		}
		return invalid(ReasonMalformedJSON, typeErr.Field, "wrong JSON type %s", clip(typeErr.Value))
	case errors.As(err, &synErr), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return invalid(ReasonMalformedJSON, "", "%v", err)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return invalid(ReasonUnknownField, clip(field), "is not a field of a payment command")
	}
	return invalid(ReasonMalformedJSON, "", "%v", err)
}

// referenceCommandFields are the JSON names of Command's fields, exactly.
var referenceCommandFields = map[string]bool{
	"merchant_id": true, "idempotency_key": true, "amount": true, "currency": true,
	"payment_method": true, "description": true, "metadata": true,
}

// referenceCheckStructure is checkStructure as it was: a json.Decoder
// Token walk with a key set per object.
func referenceCheckStructure(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	type frame struct {
		obj     bool
		keys    map[string]struct{}
		wantKey bool
		path    string
		lastKey string
	}
	var stack []*frame
	valueDone := func() {
		if n := len(stack); n > 0 && stack[n-1].obj {
			stack[n-1].wantKey = true
		}
	}
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return invalid(ReasonMalformedJSON, "", "%v", err)
		}
		if n := len(stack); n > 0 && stack[n-1].obj && stack[n-1].wantKey {
			top := stack[n-1]
			if tok == json.Delim('}') {
				stack = stack[:n-1]
				valueDone()
				continue
			}
			key, _ := tok.(string)
			if n == 1 && top.path == "" && !referenceCommandFields[key] {
				return invalid(ReasonUnknownField, clip(key), "is not a field of a payment command (names are case-sensitive)")
			}
			if _, dup := top.keys[key]; dup {
				return invalid(ReasonDuplicateField, clip(referenceJoinPath(top.path, key)), "appears more than once")
			}
			top.keys[key] = struct{}{}
			top.lastKey = key
			top.wantKey = false
			continue
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			if len(stack) >= maxJSONNestingAllowed {
				return invalid(ReasonMalformedJSON, "", "JSON nested deeper than %d levels", maxJSONNestingAllowed)
			}
			path := ""
			if n := len(stack); n > 0 {
				path = referenceJoinPath(stack[n-1].path, stack[n-1].lastKey)
			}
			obj := tok == json.Delim('{')
			stack = append(stack, &frame{obj: obj, keys: map[string]struct{}{}, wantKey: obj, path: path})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			valueDone()
		default:
			valueDone()
		}
	}
}

func referenceJoinPath(p, k string) string {
	if p == "" {
		return k
	}
	return p + "." + k
}
