package reconciler

import (
	"context"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
)

// RefundSettler is what settling the refunds the provider held pending
// needs of the store; *dedup.Store is one. A store without it settles
// none.
type RefundSettler interface {
	ProcessingRefunds(ctx context.Context, cur ledger.ProcessingCursor, limit int) ([]ledger.Refund, ledger.ProcessingCursor, error)
	SettleRefund(ctx context.Context, merchantID, key string, c ledger.RefundCompletion) (settled bool, status string, err error)
}

// settleRefunds looks up, among their payments' refunds, up to BatchSize
// refunds the ledger holds as processing (the provider answered them
// pending), resuming where the last pass stopped, and settles those the
// provider has finished: succeeded, or failed or canceled (the money is
// back, and free to refund again). Several reconcilers, and the webhook,
// may settle one at once: SettleRefund changes only a refund still
// processing, and its event is written once.
func (r *Reconciler) settleRefunds(ctx context.Context, res *RunResult) {
	rs, ok := r.store.(RefundSettler)
	rl, ok2 := r.looker.(RefundLooker)
	if !ok || !ok2 {
		return
	}
	r.mu.Lock()
	cur := r.refundCursor
	r.mu.Unlock()
	refunds, next, err := rs.ProcessingRefunds(ctx, cur, r.cfg.BatchSize)
	if err != nil {
		res.Errors++
		r.log.Error("list processing refunds", "error", err)
		return
	}
	r.mu.Lock()
	r.refundCursor = next
	r.mu.Unlock()
	for _, rf := range refunds {
		if ctx.Err() != nil {
			return
		}
		log := r.log.With("merchant_id", rf.MerchantID, "idempotency_key", rf.IdempotencyKey, "refund_id", rf.RefundID)
		lctx, cancel := context.WithTimeout(ctx, r.cfg.LookupTimeout)
		found, err := rl.LookupRefund(lctx, provider.RefundLookupRequest{ChargeID: rf.ChargeID, MerchantID: rf.MerchantID,
			IdempotencyKey: rf.IdempotencyKey, Amount: rf.Amount})
		cancel()
		switch {
		case err != nil:
			res.Errors++
			res.LookupErrors++
			log.Warn("lookup of a pending refund failed; left processing", "error", err)
			continue
		case !found.Found || found.Outcome == nil:
			// The provider answered it pending: its absence is for a
			// person, never a reason to call it failed.
			res.Errors++
			log.Error("provider has no refund for a pending one; left processing")
			continue
		case found.Outcome.RefundID != rf.RefundID:
			res.Errors++
			log.Error("lookup of a pending refund found another refund; left processing", "found", found.Outcome.RefundID)
			continue
		}
		c := ledger.RefundCompletionOf(found.Outcome)
		if c.Status != ledger.RefundSucceeded && c.Status != ledger.RefundFailed {
			res.RefundsStillPending++
			continue
		}
		settled, status, err := rs.SettleRefund(context.WithoutCancel(ctx), rf.MerchantID, rf.IdempotencyKey, c)
		switch {
		case err != nil:
			res.Errors++
			log.Error("could not settle a pending refund", "status", c.Status, "error", err)
		case settled:
			res.RefundsSettled++
			log.Info("pending refund settled", "status", status)
		case status != c.Status:
			// Settled meanwhile (the webhook, another reconciler) to
			// another outcome than the provider's now: for a person.
			res.Errors++
			log.Error("pending refund settled otherwise meanwhile; the ledger is unchanged", "ledger_status", status, "provider_status", c.Status)
		}
	}
}
