package reconciler

import (
	"context"
	"fmt"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
)

// RefundSettler is what settling the refunds the provider held pending
// needs of the store; *dedup.Store is one. A store without it settles
// none. A looker without LookupRefund settles none either: a pass that
// finds such a refund counts an error, and the first logs it.
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
	if !ok {
		return
	}
	rl, ok := r.looker.(RefundLooker)
	if !ok {
		r.cannotLookRefundsUp(ctx, rs, res)
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

// cannotLookRefundsUp counts an error when the ledger holds a refund the
// provider answered pending and the reconciler's provider cannot look it
// up (it would stay processing, its amount held, with nobody told), and
// logs it the first time.
func (r *Reconciler) cannotLookRefundsUp(ctx context.Context, rs RefundSettler, res *RunResult) {
	refunds, _, err := rs.ProcessingRefunds(ctx, ledger.ProcessingCursor{}, 1)
	if err != nil || len(refunds) == 0 {
		return
	}
	res.Errors++
	r.mu.Lock()
	said := r.saidNoRefundLooker
	r.saidNoRefundLooker = true
	r.mu.Unlock()
	if !said {
		r.log.Error("the ledger holds refunds the provider answered pending, and this reconciler's provider cannot look refunds up; they stay processing",
			"looker", fmt.Sprintf("%T", r.looker))
	}
}

// RefundRechecker is what rechecking the refunds an event said the
// provider failed after they succeeded needs of the store; *dedup.Store
// is one. A store without it rechecks none.
type RefundRechecker interface {
	RefundsToRecheck(ctx context.Context, limit int) ([]ledger.Refund, error)
	RecheckRefund(ctx context.Context, merchantID, key string, c ledger.RefundCompletion) (reversed bool, status string, err error)
}

// recheckRefunds looks up up to BatchSize refunds recorded succeeded that
// an event said the provider failed (stamped by the webhook): the event
// is only a hint, the lookup decides. Failed at the provider, the refund
// moves to failed (the customer has not got the money back; its amount is
// free again) with one refund_failed event, logged at error level for an
// operator; still succeeded, only its stamp is cleared. A lookup that
// fails, or finds no such refund, leaves the stamp for the next pass.
func (r *Reconciler) recheckRefunds(ctx context.Context, res *RunResult) {
	rs, ok := r.store.(RefundRechecker)
	if !ok {
		return
	}
	refunds, err := rs.RefundsToRecheck(ctx, r.cfg.BatchSize)
	if err != nil {
		res.Errors++
		r.log.Error("list refunds to recheck", "error", err)
		return
	}
	rl, ok := r.looker.(RefundLooker)
	if !ok {
		if len(refunds) > 0 {
			res.Errors++
			r.log.Error("refunds wait for a recheck, and this reconciler's provider cannot look refunds up", "refunds", len(refunds))
		}
		return
	}
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
			log.Warn("lookup of a refund to recheck failed; left succeeded", "error", err)
			continue
		case !found.Found || found.Outcome == nil || found.Outcome.RefundID != rf.RefundID:
			res.Errors++
			log.Error("lookup of a refund to recheck found no such refund; left succeeded")
			continue
		}
		c := ledger.RefundCompletionOf(found.Outcome)
		if c.Status != ledger.RefundSucceeded && c.Status != ledger.RefundFailed {
			res.Errors++
			log.Error("provider reports a succeeded refund neither succeeded nor failed; left succeeded", "provider_status", c.Status)
			continue
		}
		reversed, status, err := rs.RecheckRefund(context.WithoutCancel(ctx), rf.MerchantID, rf.IdempotencyKey, c)
		switch {
		case err != nil:
			res.Errors++
			log.Error("could not record a refund's recheck", "provider_status", c.Status, "error", err)
		case reversed:
			res.RefundsReversed++
			log.Error("refund reversed: the provider failed a refund recorded succeeded; the customer was not refunded and its amount is free again",
				"amount", rf.Amount, "currency", rf.Currency, "reason", c.Reason)
		default:
			log.Info("refund rechecked; unchanged", "status", status, "provider_status", c.Status)
		}
	}
}
