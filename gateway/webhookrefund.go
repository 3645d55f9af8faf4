package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
)

// applyRefunds applies the refunds a refund event carries. A succeeded
// one the ledger holds processing (the provider answered it pending) is
// settled, with its outcome event, once; a failed or canceled one is only
// a hint, since the event may be forged or stale and the refund may still
// be paid out: the ledger never frees a refund's amount on an event's
// word. The reconciler looks every processing refund up each pass, and
// one a succeeded refund's failure is reported of is stamped for its
// lookup (requestRecheck). A refund already settled (by the reconciler,
// an earlier delivery) is checked, never changed, so a redelivered event
// publishes nothing again. The event's result is the most telling of its
// refunds': an error, then a recheck, then a disagreement, then a settle.
// Every refund is applied even when one fails: the event's error (a 503,
// so it is sent again) is the first.
func (g *Gateway) applyRefunds(ctx context.Context, ev provider.Event) (string, error) {
	result := WebhookIgnoredType
	rank := map[string]int{WebhookIgnoredType: 0, WebhookNotOurs: 1, WebhookNoPayment: 2, WebhookStillProcessing: 3,
		WebhookAgrees: 4, WebhookSettled: 5, WebhookDisagrees: 6, WebhookRecheckRequested: 7, WebhookNotRecorded: 8, WebhookError: 9}
	var first error
	for _, re := range ev.Refunds {
		got, err := g.applyRefund(ctx, ev, re)
		if err != nil && first == nil {
			first = err
		}
		if rank[got] > rank[result] {
			result = got
		}
	}
	return result, first
}

// errRefundNotRecorded is an event's refund the ledger holds without the
// provider's refund id yet: the worker records its answer soon, and the
// provider sends the event again after the 503 it gets.
var errRefundNotRecorded = errors.New("the refund's provider id is not recorded yet")

// applyRefund settles one refund of an event, or checks that the ledger's
// final refund agrees with it, and says which it did.
func (g *Gateway) applyRefund(ctx context.Context, ev provider.Event, re *provider.RefundOutcome) (string, error) {
	if re.MerchantID == "" || re.IdempotencyKey == "" || re.RefundID == "" {
		return WebhookNotOurs, nil
	}
	log := g.log.With("event_id", ev.ID, "type", ev.Type, "merchant_id", re.MerchantID,
		"idempotency_key", re.IdempotencyKey, "refund_id", re.RefundID)
	c := ledger.RefundCompletionOf(re)
	switch c.Status {
	case ledger.RefundSucceeded:
	case ledger.RefundFailed:
		return g.reportedFailed(ctx, re, log)
	default:
		return WebhookStillProcessing, nil
	}
	settled, status, err := g.cfg.Webhooks.Ledger.SettleRefundSucceeded(ctx, re.MerchantID, re.IdempotencyKey, c)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return g.refundNotFound(ctx, re, log)
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
	// A stale event (succeeded, for a refund the provider failed since)
	// never moves a failed refund back.
	log.Error("webhook event disagrees with the ledger's refund; the ledger is unchanged", "ledger_status", status, "event_status", c.Status)
	return WebhookDisagrees, nil
}

// refundNotFound answers an event for a refund the ledger has not under
// the event's provider id. Claimed and not answered yet (pending or
// unknown, no refund id) is a 503: the worker records the provider's id
// soon, and the provider sends the event again. Anything else (no such
// refund: the audit finds one not the ledger's; another refund id) is
// acknowledged and ignored.
func (g *Gateway) refundNotFound(ctx context.Context, re *provider.RefundOutcome, log *slog.Logger) (string, error) {
	rf, err := g.cfg.Webhooks.Ledger.GetRefund(ctx, re.MerchantID, re.IdempotencyKey)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
	case err != nil:
		return WebhookError, fmt.Errorf("read refund: %w", err)
	case rf.RefundID == "" && (rf.Status == ledger.RefundPending || rf.Status == ledger.RefundUnknown):
		return WebhookNotRecorded, errRefundNotRecorded
	}
	log.Info("webhook event for a refund not in the ledger; ignored")
	return WebhookNoPayment, nil
}

// reportedFailed answers an event that says the provider failed (or
// canceled) a refund. Nothing is moved on its word: a refund the ledger
// holds processing stays so, holding its amount, and the reconciler's
// settle pass, which looks every processing refund up each pass, fails
// it once the provider confirms; a succeeded one is stamped for a
// recheck (requestRecheck). Both answer recheck_requested. A refund
// failed already agrees; one not answered yet is the worker's.
func (g *Gateway) reportedFailed(ctx context.Context, re *provider.RefundOutcome, log *slog.Logger) (string, error) {
	rf, err := g.cfg.Webhooks.Ledger.GetRefund(ctx, re.MerchantID, re.IdempotencyKey)
	switch {
	case errors.Is(err, ledger.ErrNotFound) || (err == nil && rf.RefundID != re.RefundID):
		return g.refundNotFound(ctx, re, log)
	case err != nil:
		return WebhookError, fmt.Errorf("read refund: %w", err)
	}
	switch rf.Status {
	case ledger.RefundProcessing:
		log.Warn("provider reports failed a refund the ledger holds pending; the reconciler's lookup settles it")
		return WebhookRecheckRequested, nil
	case ledger.RefundSucceeded:
		return g.requestRecheck(ctx, re, log)
	case ledger.RefundFailed:
		return WebhookAgrees, nil
	case ledger.RefundPending, ledger.RefundUnknown:
		return WebhookStillProcessing, nil
	}
	log.Error("webhook event disagrees with the ledger's refund; the ledger is unchanged", "ledger_status", rf.Status, "event_status", ledger.RefundFailed)
	return WebhookDisagrees, nil
}

// requestRecheck answers an event that says the provider failed a refund
// the ledger holds succeeded. The event is only a hint (the gateway has
// no provider client to confirm it): the refund is stamped for the
// reconciler, which looks it up and, if the provider confirms, moves it
// to failed (dedup.Store.RecheckRefund).
func (g *Gateway) requestRecheck(ctx context.Context, re *provider.RefundOutcome, log *slog.Logger) (string, error) {
	requested, status, err := g.cfg.Webhooks.Ledger.RequestRefundRecheck(ctx, re.MerchantID, re.IdempotencyKey, re.RefundID)
	switch {
	case err != nil && !errors.Is(err, ledger.ErrNotFound):
		return WebhookError, fmt.Errorf("request refund recheck: %w", err)
	case requested:
		log.Error("provider reports failed a refund the ledger holds succeeded; the reconciler looks it up again")
		return WebhookRecheckRequested, nil
	}
	log.Error("webhook event disagrees with the ledger's refund; the ledger is unchanged", "ledger_status", status, "event_status", ledger.RefundFailed)
	return WebhookDisagrees, nil
}
