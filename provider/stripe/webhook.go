package stripe

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	stripego "github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/webhook"

	"github.com/paydedup/paydedup/provider"
)

// APIVersion is the Stripe API version the adapter speaks (stripe-go's
// pinned version). A webhook endpoint must be created with it: an event of
// another release train is refused, as its objects may decode wrongly.
const APIVersion = stripego.APIVersion

// DefaultWebhookTolerance is how far a webhook signature's timestamp may lie
// from now, on either side (stripe-go's default, as Stripe recommends): an
// older one is a replay, a newer one was not made by a clock we trust.
const DefaultWebhookTolerance = webhook.DefaultTolerance

// The event types that say how a PaymentIntent ended.
const (
	EventIntentSucceeded     = "payment_intent.succeeded"
	EventIntentPaymentFailed = "payment_intent.payment_failed"
	EventIntentCanceled      = "payment_intent.canceled"
	// EventIntentAmountCapturableUpdated: an intent is left
	// requires_capture (an authorization), amount_capturable its hold.
	EventIntentAmountCapturableUpdated = "payment_intent.amount_capturable_updated"
)

// The event types that say how a refund stands: refund.updated (any
// refund's status changed), refund.failed, charge.refund.updated (the
// older name, for some payment methods) carry the refund;
// charge.refunded carries the charge, with its refunds when the event's
// API version lists them.
const (
	EventRefundUpdated       = "refund.updated"
	EventRefundFailed        = "refund.failed"
	EventChargeRefundUpdated = "charge.refund.updated"
	EventChargeRefunded      = "charge.refunded"
)

// WebhookVerifier checks the Stripe-Signature of webhook events with the
// endpoint's signing secrets (STRIPE_WEBHOOK_SECRET) and reads them.
type WebhookVerifier struct {
	secrets   []string
	tolerance time.Duration
}

// MaxWebhookSecrets bounds the secrets one verifier holds: each costs an
// HMAC of every refused event's body, and a rotation needs two.
const MaxWebhookSecrets = 4

// NewWebhookVerifier returns a verifier for secrets, the endpoint's signing
// secrets ("whsec_...") separated by commas, as STRIPE_WEBHOOK_SECRET holds
// them: an event verifies when its signature matches any of them. While
// Stripe rolls an endpoint's secret it signs each event with the old and the
// new one (a v1= each) for up to 24 hours; "new,old" verifies both sides
// of a rolling restart. It refuses signatures whose timestamp is more than
// tolerance before or after now (DefaultWebhookTolerance when 0).
func NewWebhookVerifier(secrets string, tolerance time.Duration) (*WebhookVerifier, error) {
	list, err := ParseWebhookSecrets(secrets)
	if err != nil {
		return nil, err
	}
	if tolerance < 0 {
		return nil, fmt.Errorf("%w: webhook tolerance %s is negative", provider.ErrInvalidConfig, tolerance)
	}
	if tolerance == 0 {
		tolerance = DefaultWebhookTolerance
	}
	return &WebhookVerifier{secrets: list, tolerance: tolerance}, nil
}

// Secrets is how many signing secrets the verifier holds (never their
// values: they are logged).
func (v *WebhookVerifier) Secrets() int { return len(v.secrets) }

// ParseWebhookSecrets splits a comma-separated list of signing secrets,
// refusing an empty one (",," or a trailing comma is a typo that would
// otherwise go unnoticed), one given twice, and more than MaxWebhookSecrets.
// The error names the secret by its position, never its value.
func ParseWebhookSecrets(list string) ([]string, error) {
	if strings.TrimSpace(list) == "" {
		return nil, fmt.Errorf("%w: the webhook signing secret is empty", provider.ErrInvalidConfig)
	}
	parts := strings.Split(list, ",")
	if len(parts) > MaxWebhookSecrets {
		return nil, fmt.Errorf("%w: %d webhook signing secrets, at most %d (a rotation needs two: new,old)",
			provider.ErrInvalidConfig, len(parts), MaxWebhookSecrets)
	}
	seen := map[string]bool{}
	out := make([]string, 0, len(parts))
	for i, s := range parts {
		s = strings.TrimSpace(s)
		switch {
		case s == "":
			return nil, fmt.Errorf("%w: webhook signing secret %d of %d is empty (secrets are separated by single commas)",
				provider.ErrInvalidConfig, i+1, len(parts))
		case seen[s]:
			return nil, fmt.Errorf("%w: webhook signing secret %d of %d repeats an earlier one", provider.ErrInvalidConfig, i+1, len(parts))
		}
		seen[s] = true
		out = append(out, s)
	}
	return out, nil
}

// Verify checks payload against its Stripe-Signature header with
// CheckSignature's rules and webhook.ConstructEvent's (a v1 HMAC-SHA256 of
// "t.payload" under any of the secrets, t within the tolerance, the event's API version of the adapter's
// release train) and returns the event. Any failure wraps
// provider.ErrBadSignature. A payment_intent.succeeded, payment_failed or
// canceled event carries the intent's Outcome, classified as a retrieve by
// id classifies it; other types carry none.
func (v *WebhookVerifier) Verify(payload []byte, signature string) (provider.Event, error) {
	// The header first, with stripe-go's reading of it: one t= within the
	// tolerance on both sides (stripe-go checks only the past side, with
	// the last t= it finds).
	if err := v.CheckSignature(signature); err != nil {
		return provider.Event{}, err
	}
	ev, err := v.construct(payload, signature)
	if err != nil {
		return provider.Event{}, fmt.Errorf("%w: %w", provider.ErrBadSignature, err)
	}
	out := provider.Event{ID: ev.ID, Type: string(ev.Type)}
	switch out.Type {
	case EventIntentSucceeded, EventIntentPaymentFailed, EventIntentCanceled, EventIntentAmountCapturableUpdated:
	case EventRefundUpdated, EventRefundFailed, EventChargeRefundUpdated, EventChargeRefunded:
		if ev.Data == nil || len(ev.Data.Raw) == 0 {
			return provider.Event{}, fmt.Errorf("%w: event %s has no data.object", provider.ErrBadSignature, ev.ID)
		}
		refunds, err := eventRefunds(out.Type, ev.Data.Raw)
		if err != nil {
			return provider.Event{}, fmt.Errorf("%w: event %s: data.object: %w", provider.ErrBadSignature, ev.ID, err)
		}
		out.Refunds = refunds
		return out, nil
	default:
		return out, nil
	}
	if ev.Data == nil || len(ev.Data.Raw) == 0 {
		return provider.Event{}, fmt.Errorf("%w: event %s has no data.object", provider.ErrBadSignature, ev.ID)
	}
	var pi stripego.PaymentIntent
	if err := json.Unmarshal(ev.Data.Raw, &pi); err != nil {
		return provider.Event{}, fmt.Errorf("%w: event %s: data.object: %w", provider.ErrBadSignature, ev.ID, err)
	}
	if pi.ID == "" {
		return provider.Event{}, fmt.Errorf("%w: event %s: data.object is not a payment intent", provider.ErrBadSignature, ev.ID)
	}
	out.Intent = intentFacts(&pi)
	o, err := intentOutcome(&pi, ev.Data.Raw)
	if err != nil {
		// A status no outcome is read from (requires_action): nothing to
		// settle.
		return out, nil
	}
	out.Outcome = o
	return out, nil
}

// eventRefunds reads the refunds of a refund event's data.object: the
// refund itself, or a charge.refunded's charge's listed refunds. A refund
// in a status the adapter does not know is left out: nothing is settled
// from it (the reconciler's lookup meets it too, and reports it).
func eventRefunds(typ string, raw json.RawMessage) ([]*provider.RefundOutcome, error) {
	if typ != EventChargeRefunded {
		var re stripego.Refund
		if err := json.Unmarshal(raw, &re); err != nil {
			return nil, err
		}
		if re.ID == "" || re.Object != "refund" {
			return nil, errors.New("not a refund")
		}
		out, err := refundState(&re, "")
		if err != nil {
			return nil, nil
		}
		out.Response = raw
		return []*provider.RefundOutcome{out}, nil
	}
	var ch stripego.Charge
	if err := json.Unmarshal(raw, &ch); err != nil {
		return nil, err
	}
	if ch.ID == "" {
		return nil, errors.New("not a charge")
	}
	if ch.Refunds == nil {
		return nil, nil // not listed: refund.updated, or the reconciler, settles them
	}
	intent := ""
	if ch.PaymentIntent != nil {
		intent = ch.PaymentIntent.ID
	}
	out := make([]*provider.RefundOutcome, 0, len(ch.Refunds.Data))
	for _, re := range ch.Refunds.Data {
		if o, err := refundState(re, intent); err == nil {
			out = append(out, o)
		}
	}
	return out, nil
}

// construct verifies payload with each secret in turn (the current one
// first) and reads the event. stripe-go parses the JSON only once an HMAC
// matched, so nothing unsigned is parsed.
func (v *WebhookVerifier) construct(payload []byte, signature string) (stripego.Event, error) {
	var err error
	for _, secret := range v.secrets {
		var ev stripego.Event
		ev, err = webhook.ConstructEventWithOptions(payload, signature, secret,
			webhook.ConstructEventOptions{Tolerance: v.tolerance})
		if !errors.Is(err, webhook.ErrNoValidSignature) {
			// Verified (and read), or refused whatever the secret:
			// too old, an unreadable header, a body not an event.
			return ev, err
		}
	}
	return stripego.Event{}, err
}

// Errors of CheckSignature, each wrapped with provider.ErrBadSignature.
var (
	// ErrSignedAhead is a signature whose timestamp lies further in the
	// future than the tolerance.
	ErrSignedAhead = errors.New("timestamp is ahead of now by more than the tolerance")
	// ErrSignedTooLongAgo is a signature whose timestamp lies further in the
	// past than the tolerance (a replay).
	ErrSignedTooLongAgo = errors.New("timestamp is older than the tolerance")
	// ErrSignatureHeader is a Stripe-Signature that is not one t= and at
	// least one v1= of comma-separated key=value pairs.
	ErrSignatureHeader = errors.New("malformed Stripe-Signature")
)

// CheckSignature checks a Stripe-Signature header without the body, so that
// a gateway refuses it before reading one: comma-separated key=value pairs
// as stripe-go splits them, exactly one t= (stripe-go keeps the last it
// reads; a header with two could be checked on one and verified on the
// other, so it is refused), t within the tolerance of now on both sides,
// and at least one v1= in hex. It wraps provider.ErrBadSignature.
func (v *WebhookVerifier) CheckSignature(signature string) error {
	if err := v.checkSignature(signature); err != nil {
		return fmt.Errorf("%w: %w", provider.ErrBadSignature, err)
	}
	return nil
}

func (v *WebhookVerifier) checkSignature(signature string) error {
	if signature == "" {
		return fmt.Errorf("%w: absent", ErrSignatureHeader)
	}
	var ts []string
	v1 := 0
	for pair := range strings.SplitSeq(signature, ",") {
		kv := strings.Split(pair, "=")
		if len(kv) != 2 {
			return fmt.Errorf("%w: %q is not key=value", ErrSignatureHeader, clipPair(pair))
		}
		switch kv[0] {
		case "t":
			ts = append(ts, kv[1])
		case "v1":
			if _, err := hex.DecodeString(kv[1]); err == nil && kv[1] != "" {
				v1++
			}
		}
	}
	switch {
	case len(ts) != 1:
		return fmt.Errorf("%w: %d t= values, want exactly one", ErrSignatureHeader, len(ts))
	case v1 == 0:
		return fmt.Errorf("%w: no v1= signature", ErrSignatureHeader)
	}
	sec, err := strconv.ParseInt(ts[0], 10, 64)
	if err != nil {
		return fmt.Errorf("%w: timestamp %q is not a number", ErrSignatureHeader, clipPair(ts[0]))
	}
	// time.Now, as stripe-go's own check of the past side.
	switch d := time.Until(time.Unix(sec, 0)); {
	case d > v.tolerance:
		return fmt.Errorf("%w (%s ahead, tolerance %s)", ErrSignedAhead, d.Round(time.Second), v.tolerance)
	case -d > v.tolerance:
		return fmt.Errorf("%w (%s ago, tolerance %s)", ErrSignedTooLongAgo, (-d).Round(time.Second), v.tolerance)
	}
	return nil
}

// clipPair shortens a header fragment quoted in an error (it is logged).
func clipPair(s string) string {
	if len(s) > 32 {
		return s[:32] + "..."
	}
	return s
}
