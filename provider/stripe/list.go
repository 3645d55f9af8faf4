package stripe

import (
	"context"
	"fmt"
	"iter"
	"time"

	stripego "github.com/stripe/stripe-go/v82"

	"github.com/paydedup/paydedup/provider"
)

// listLimit is the page size of ListIntents, the largest Stripe allows.
const listLimit = 100

// ListIntents yields the PaymentIntents created in [req.From, req.To),
// newest first, with Stripe's list API (GET /v1/payment_intents with
// created[gte], created[lt], limit and starting_after) and stripe-go's
// auto-pagination. Unlike search, the list is read-after-write consistent.
// Stripe filters on whole seconds, so From is rounded down and To up. The
// iteration is bounded by ctx alone, not by Config.Timeout (one list may
// take many pages); a failed page ends it with an *Error.
func (s *Client) ListIntents(ctx context.Context, req provider.ListRequest) iter.Seq2[provider.Intent, error] {
	return func(yield func(provider.Intent, error) bool) {
		if !req.From.Before(req.To) {
			return
		}
		params := &stripego.PaymentIntentListParams{
			CreatedRange: &stripego.RangeQueryParams{
				GreaterThanOrEqual: req.From.Unix(),
				LesserThan:         ceilUnix(req.To),
			},
		}
		params.Limit = stripego.Int64(listLimit)
		if req.StartingAfter != "" {
			params.StartingAfter = stripego.String(req.StartingAfter)
		}
		for pi, err := range s.client.V1PaymentIntents.List(ctx, params) {
			if err != nil {
				yield(provider.Intent{}, fmt.Errorf("list payment intents: %w", s.lookupError(err)))
				return
			}
			if !yield(intentOf(pi), nil) {
				return
			}
		}
	}
}

// GetIntent retrieves one PaymentIntent by id; an id Stripe does not know
// wraps provider.ErrNoSuchIntent.
func (s *Client) GetIntent(ctx context.Context, id string) (provider.Intent, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	pi, err := s.client.V1PaymentIntents.Retrieve(ctx, id, nil)
	switch {
	case err == nil:
		return intentOf(pi), nil
	case isResourceMissing(err):
		return provider.Intent{}, fmt.Errorf("retrieve payment intent %s: %w", id, provider.ErrNoSuchIntent)
	default:
		return provider.Intent{}, fmt.Errorf("retrieve payment intent %s: %w", id, s.lookupError(err))
	}
}

func intentOf(pi *stripego.PaymentIntent) provider.Intent {
	return provider.Intent{
		ID:             pi.ID,
		Status:         string(pi.Status),
		Amount:         pi.Amount,
		Currency:       string(pi.Currency),
		MerchantID:     pi.Metadata[provider.MetadataMerchantID],
		IdempotencyKey: pi.Metadata[provider.MetadataIdempotencyKey],
		Created:        time.Unix(pi.Created, 0).UTC(),
	}
}

// ceilUnix is t in whole seconds, rounded up.
func ceilUnix(t time.Time) int64 {
	if t.Truncate(time.Second).Equal(t) {
		return t.Unix()
	}
	return t.Unix() + 1
}
