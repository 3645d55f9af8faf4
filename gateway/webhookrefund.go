package gateway

import (
	"context"
	"errors"
	"fmt"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
)

// applyRefunds settles the refunds a refund event carries that the ledger
// holds as processing (the provider answered them pending), through the
// statement the reconciler settles them with: a failed one frees its
// amount, and each writes its outcome event once. A refund already
// settled (by the reconciler, an earlier delivery) is checked, never
// changed, so a redelivered event publishes nothing again. The event's
// result is the most telling of its refunds': an error, then a
// disagreement, then a settle.
func (g *Gateway) applyRefunds(ctx context.Context, ev provider.Event) (string, error) {
	result := WebhookIgnoredType
	rank := map[string]int{WebhookIgnoredType: 0, WebhookNotOurs: 1, WebhookNoPayment: 2, WebhookStillProcessing: 3,
		WebhookAgrees: 4, WebhookSettled: 5, WebhookDisagrees: 6, WebhookError: 7}
	for _, re := range ev.Refunds {
		got, err := g.applyRefund(ctx, ev, re)
		if err != nil {
			return WebhookError, err
		}
		if rank[got] > rank[result] {
			result = got
		}
	}
	return result, nil
}

// applyRefund settles one refund of an event, or checks that the ledger's
// final refund agrees with it, and says which it did.
func (g *Gateway) applyRefund(ctx context.Context, ev provider.Event, re *provider.RefundOutcome) (string, error) {
	if re.MerchantID == "" || re.IdempotencyKey == "" || re.RefundID == "" {
		return WebhookNotOurs, nil
	}
	log := g.log.With("event_id", ev.ID, "type", ev.Type, "merchant_id", re.MerchantID,
		"idempotency_key", re.IdempotencyKey, "refund_id", re.RefundID)
	c := ledger.RefundCompletionOf(re)
	if c.Status != ledger.RefundSucceeded && c.Status != ledger.RefundFailed {
		return WebhookStillProcessing, nil
	}
	settled, status, err := g.cfg.Webhooks.Ledger.SettleRefund(ctx, re.MerchantID, re.IdempotencyKey, c)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		// The worker has not recorded the provider's answer yet (or the
		// refund is not the ledger's: the audit finds it). The worker's
		// answer, or the reconciler, settles it.
		log.Info("webhook event for a refund not in the ledger; ignored")
		return WebhookNoPayment, nil
	case err != nil:
		return WebhookError, fmt.Errorf("settle refund: %w", err)
	case settled:
		log.Info("pending refund settled by webhook", "status", status)
		return WebhookSettled, nil
	case status == c.Status:
		return WebhookAgrees, nil
	case status == ledger.RefundPending || status == ledger.RefundUnknown:
		// Its answer is not recorded yet; the worker or the reconciler
		// records it (a lookup sees the same final refund).
		return WebhookStillProcessing, nil
	}
	log.Error("webhook event disagrees with the ledger's refund; the ledger is unchanged", "ledger_status", status, "event_status", c.Status)
	return WebhookDisagrees, nil
}
