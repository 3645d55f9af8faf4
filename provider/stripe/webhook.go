package stripe

import (
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
)

// WebhookVerifier checks the Stripe-Signature of webhook events with the
// endpoint's signing secret (STRIPE_WEBHOOK_SECRET) and reads them.
type WebhookVerifier struct {
	secret    string
	tolerance time.Duration
}

// NewWebhookVerifier returns a verifier for the signing secret ("whsec_...")
// that refuses signatures whose timestamp is more than tolerance before or
// after now (DefaultWebhookTolerance when 0).
func NewWebhookVerifier(secret string, tolerance time.Duration) (*WebhookVerifier, error) {
	if secret == "" {
		return nil, fmt.Errorf("%w: the webhook signing secret is empty", provider.ErrInvalidConfig)
	}
	if tolerance < 0 {
		return nil, fmt.Errorf("%w: webhook tolerance %s is negative", provider.ErrInvalidConfig, tolerance)
	}
	if tolerance == 0 {
		tolerance = DefaultWebhookTolerance
	}
	return &WebhookVerifier{secret: secret, tolerance: tolerance}, nil
}

// Verify checks payload against its Stripe-Signature header with
// webhook.ConstructEvent's rules (a v1 HMAC-SHA256 of "t.payload" under the
// secret, t within the tolerance, the event's API version of the adapter's
// release train) and returns the event. Any failure wraps
// provider.ErrBadSignature. A payment_intent.succeeded, payment_failed or
// canceled event carries the intent's Outcome, classified as a retrieve by
// id classifies it; other types carry none.
func (v *WebhookVerifier) Verify(payload []byte, signature string) (provider.Event, error) {
	ev, err := webhook.ConstructEventWithOptions(payload, signature, v.secret,
		webhook.ConstructEventOptions{Tolerance: v.tolerance})
	if err != nil {
		return provider.Event{}, fmt.Errorf("%w: %w", provider.ErrBadSignature, err)
	}
	// stripe-go refuses only a timestamp older than the tolerance; one
	// from the future is refused here (|now - t| <= tolerance).
	if err := v.checkNotAhead(signature); err != nil {
		return provider.Event{}, fmt.Errorf("%w: %w", provider.ErrBadSignature, err)
	}
	out := provider.Event{ID: ev.ID, Type: string(ev.Type)}
	switch out.Type {
	case EventIntentSucceeded, EventIntentPaymentFailed, EventIntentCanceled:
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

// errSignedAhead is a signature whose timestamp lies further in the future
// than the tolerance.
var errSignedAhead = errors.New("timestamp is ahead of now by more than the tolerance")

// checkNotAhead reads the signature's t= (the first, as stripe-go does) and
// refuses it when it lies more than the tolerance after now.
func (v *WebhookVerifier) checkNotAhead(signature string) error {
	for part := range strings.SplitSeq(signature, ",") {
		val, ok := strings.CutPrefix(part, "t=")
		if !ok {
			continue
		}
		sec, err := strconv.ParseInt(val, 10, 64)
		if err != nil {
			return fmt.Errorf("timestamp %q: %w", val, err)
		}
		// time.Now, as stripe-go's own check of the past side.
		if ahead := time.Until(time.Unix(sec, 0)); ahead > v.tolerance {
			return fmt.Errorf("%w (%s ahead, tolerance %s)", errSignedAhead, ahead.Round(time.Second), v.tolerance)
		}
		return nil
	}
	return errors.New("no timestamp in the signature")
}
