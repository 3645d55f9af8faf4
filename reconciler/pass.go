package reconciler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
)

// RunResult counts what one pass did. Every examined row ends in exactly one
// of Completed, Declined, Failed, Left and LeaseLost.
type RunResult struct {
	// Examined is how many stuck rows the pass leased.
	Examined int
	// Completed is how many rows were completed with a provider charge
	// (or an authorize's authorization).
	Completed int
	// Declined is how many rows were completed as declined.
	Declined int
	// Failed is how many rows were marked `failed`: the provider has no
	// charge under their key.
	Failed int
	// Left is how many rows were left pending for a later pass.
	Left int
	// LeaseLost is how many rows another holder took or finished first.
	LeaseLost int
	// Errors counts failed lookups and writes; those rows are in Left.
	Errors int
	// LookupErrors is the part of Errors that were failed provider lookups;
	// each backed its row's next lookup off.
	LookupErrors int
	// ForeignIntents is the part of LookupErrors where the provider held an
	// intent under the key that is not the row's (other metadata, amount or
	// currency): the row waits for a person, never completed from it.
	ForeignIntents int
	// Processing is how many rows were completed as processing (money may
	// still move; SettledSucceeded or SettledFailed later).
	Processing int
	// SettledSucceeded and SettledFailed count the processing payments
	// that this pass found finished at the provider and settled in the
	// ledger; StillProcessing those it found still moving.
	SettledSucceeded, SettledFailed, StillProcessing int
	// RefundsSettled counts the refunds the provider held pending
	// (processing) that this pass found finished and settled, succeeded
	// or failed; RefundsStillPending those it found still pending.
	RefundsSettled, RefundsStillPending int
	// RefundsReversed counts the refunds recorded succeeded, stamped for
	// a recheck (an event said the provider failed them), that this
	// pass's lookup found failed and moved to failed.
	RefundsReversed int
	// CancelsConfirmed counts the authorized payments an event said the
	// provider canceled (stamped by the webhook) that this pass's
	// retrieve of their intent found canceled and recorded canceled.
	CancelsConfirmed int
	// Purged is how many expired finished rows were deleted.
	Purged int
	// RefundsResolved is how many stuck refunds (a lease run out, an
	// answer lost) a lookup found and recorded; RefundsLeft those it left
	// unknown (not found: the next delivery of their message sends them;
	// or the lookup or the write failed).
	RefundsResolved, RefundsLeft int
	// PaymentOpsResolved is how many stuck captures and cancels a
	// retrieve of their intent showed done (or never possible) and
	// recorded; PaymentOpsLeft those it left unknown (the intent still
	// requires_capture: the next delivery of their message sends them; or
	// the retrieve or the write failed).
	PaymentOpsResolved, PaymentOpsLeft int
}

func (res RunResult) changed() bool {
	return res.Examined > 0 || res.Purged > 0 || res.Errors > 0 || res.SettledSucceeded > 0 || res.SettledFailed > 0 ||
		res.RefundsResolved > 0 || res.RefundsSettled > 0 || res.RefundsReversed > 0 || res.CancelsConfirmed > 0
}

// fate is what happened to one leased row.
type fate int

const (
	left fate = iota
	completed
	declined
	processing
	failed
	leaseLost
)

// verdict is one row's fate, whether an error was met on the way (and
// whether it was the provider lookup's), and whether the database stopped
// answering (the rest of the pass is skipped).
type verdict struct {
	fate         fate
	errored      bool
	lookupFailed bool
	foreign      bool
	dbDown       bool
}

func (res *RunResult) add(v verdict) {
	switch v.fate {
	case completed:
		res.Completed++
	case declined:
		res.Declined++
	case processing:
		res.Completed++
		res.Processing++
	case failed:
		res.Failed++
	case leaseLost:
		res.LeaseLost++
	default:
		res.Left++
	}
	if v.errored {
		res.Errors++
	}
	if v.lookupFailed {
		res.LookupErrors++
	}
	if v.foreign {
		res.ForeignIntents++
	}
}

// RunOnce runs one pass: it leases up to BatchSize stuck rows, resolves each
// with a provider lookup, then purges expired finished rows. It returns an
// error only when the pass could not run at all; failures on single rows are
// counted in the result and logged.
func (r *Reconciler) RunOnce(ctx context.Context) (res RunResult, err error) {
	if r.cfg.Metrics != nil {
		defer func() { r.cfg.Metrics.ObserveRun(res, err) }()
	}
	// The leases' end, by our own clock: the store sets them from the
	// database's clock, from a moment after this one, so only the elapsed
	// time since now counts and a skewed host clock cannot matter.
	leasedUntil := r.cfg.Clock.Now().Add(r.cfg.Lease)
	stuck, err := r.store.AcquireStuck(ctx, r.cfg.Holder, r.acquireAfter, r.cfg.Lease, r.cfg.BatchSize)
	if err != nil {
		return res, fmt.Errorf("lease stuck payments: %w", err)
	}
	res.Examined = len(stuck)
	dbDown := false
	for _, s := range stuck {
		var v verdict
		switch {
		case dbDown:
			v = verdict{fate: left} // its lease lapses by itself
		case ctx.Err() != nil:
			v = r.release(ctx, s, "reconciler stopped before the lookup")
		default:
			v = r.resolve(ctx, s, leasedUntil)
		}
		dbDown = dbDown || v.dbDown
		res.add(v)
	}
	if !dbDown && ctx.Err() == nil {
		r.resolveRefunds(ctx, &res)
	}
	if !dbDown && ctx.Err() == nil {
		r.resolvePaymentOps(ctx, &res)
	}
	if !dbDown && ctx.Err() == nil {
		r.settleProcessing(ctx, &res)
	}
	if !dbDown && ctx.Err() == nil {
		r.settleRefunds(ctx, &res)
	}
	if !dbDown && ctx.Err() == nil {
		r.recheckRefunds(ctx, &res)
	}
	if !dbDown && ctx.Err() == nil {
		r.recheckCancels(ctx, &res)
	}
	if !dbDown && ctx.Err() == nil {
		r.purge(ctx, &res)
	}
	if res.changed() {
		r.log.Info("reconciler pass",
			"examined", res.Examined, "completed", res.Completed, "declined", res.Declined, "processing", res.Processing,
			"failed", res.Failed, "left", res.Left, "lease_lost", res.LeaseLost,
			"errors", res.Errors, "lookup_errors", res.LookupErrors, "foreign_intents", res.ForeignIntents,
			"settled_succeeded", res.SettledSucceeded, "settled_failed", res.SettledFailed, "still_processing", res.StillProcessing,
			"refunds_resolved", res.RefundsResolved, "refunds_left", res.RefundsLeft, "refunds_settled", res.RefundsSettled,
			"refunds_still_pending", res.RefundsStillPending, "refunds_reversed", res.RefundsReversed, "cancels_confirmed", res.CancelsConfirmed, "purged", res.Purged)
	}
	return res, nil
}

// resolve looks one leased row up at the provider and records the answer.
// leasedUntil is when its lease ends by the reconciler's clock.
func (r *Reconciler) resolve(ctx context.Context, s ledger.Stuck, leasedUntil time.Time) verdict {
	l := s.Lease
	log := r.log.With("merchant_id", l.MerchantID, "idempotency_key", l.IdempotencyKey,
		"provider_key", l.ProviderKey, "attempt", l.Attempt)

	// A long batch could outlast the lease taken at its start; a lapsed
	// lease would let a redelivery take the row while we look it up.
	if leasedUntil.Sub(r.cfg.Clock.Now()) < r.renewBelow {
		renewed, err := r.store.Heartbeat(ctx, l, r.cfg.Lease)
		if err != nil {
			return r.writeFailed(ctx, s, "renew lease", err)
		}
		l = renewed
		s.Lease = l
	}

	lctx, cancel := context.WithTimeout(ctx, r.cfg.LookupTimeout)
	found, err := r.looker.Lookup(lctx, provider.LookupRequest{
		ProviderKey:    l.ProviderKey,
		MerchantID:     l.MerchantID,
		IdempotencyKey: l.IdempotencyKey,
		ChargeID:       s.Record.ChargeID,
		Amount:         s.Record.Amount,
		Currency:       s.Record.Currency,
	})
	cancel()
	if err == nil && found.Found && found.Outcome == nil {
		err = errors.New("lookup found a charge without an outcome")
	}
	if err != nil {
		if ctx.Err() != nil {
			return r.release(ctx, s, "provider lookup: "+err.Error()) // stopping: not the provider's failure
		}
		return r.deferLookup(ctx, s, err, log)
	}

	// Once the provider has answered, the answer is recorded even if the
	// pass is being stopped: the write is short and bounded by the store.
	wctx := context.WithoutCancel(ctx)
	if !found.Found {
		// Every row this pass leased had its lease expire more than
		// SearchLag ago: long enough for a request the provider was still
		// executing then to have finished, and for its search to show the
		// charge (see the package documentation).
		err := r.store.ResolveNotCharged(wctx, l, "reconciler: provider has no charge under the key")
		if err != nil {
			return r.writeFailed(ctx, s, "mark not charged", err)
		}
		log.Info("stuck payment resolved: not charged")
		return verdict{fate: failed}
	}

	out := found.Outcome
	// Only the provider's body is stored: a charge found without one is
	// refused by the store and left pending for a person.
	// The kind is the claim's, read back from the provider key it stored:
	// an intent held for capture is an authorize's outcome, and a
	// charge's processing (ledger.CompletionFor).
	c := ledger.CompletionFor(ledger.KindOfProviderKey(l.ProviderKey), out, ledger.ProviderBodyOnly)
	if err := r.store.Complete(wctx, l, c); err != nil {
		return r.writeFailed(ctx, s, "complete", err)
	}
	switch {
	case c.Declined:
		log.Info("stuck payment resolved: declined", "charge_id", out.ChargeID, "decline_code", out.DeclineCode)
		return verdict{fate: declined}
	case c.Processing:
		log.Info("stuck payment resolved: processing at the provider", "charge_id", out.ChargeID, "status", out.Status)
		return verdict{fate: processing}
	case c.Authorized:
		log.Info("stuck payment resolved: authorized", "charge_id", out.ChargeID)
		return verdict{fate: completed}
	}
	log.Info("stuck payment resolved: charged", "charge_id", out.ChargeID)
	return verdict{fate: completed}
}

// writeFailed classifies a failed store write on a leased row.
func (r *Reconciler) writeFailed(ctx context.Context, s ledger.Stuck, op string, err error) verdict {
	log := r.log.With("merchant_id", s.Lease.MerchantID, "idempotency_key", s.Lease.IdempotencyKey,
		"provider_key", s.Lease.ProviderKey)
	switch {
	case errors.Is(err, ledger.ErrLeaseLost):
		log.Debug("lease lost; another holder resolved the payment", "op", op)
		return verdict{fate: leaseLost}
	case errors.Is(err, ledger.ErrUnavailable):
		log.Error("database unavailable; pass cut short", "op", op, "error", err)
		return verdict{fate: left, errored: true, dbDown: true}
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		return r.release(ctx, s, "reconciler stopped")
	}
	// A ledger conflict, or a provider answer the store refuses: the row
	// needs a person, and stays pending (and counted) until one looks.
	log.Error("could not record the provider's answer; payment left pending", "op", op, "error", err)
	v := r.release(ctx, s, op+": "+err.Error())
	v.errored = true
	return v
}

// deferLookup gives a row back after its lookup failed, backing its next
// lookup off.
func (r *Reconciler) deferLookup(ctx context.Context, s ledger.Stuck, lookupErr error, log *slog.Logger) verdict {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	foreign := errors.Is(lookupErr, provider.ErrForeignIntent)
	failures, next, err := r.store.DeferLookup(ctx, s.Lease, "provider lookup: "+lookupErr.Error(), r.backoff)
	switch {
	case err == nil && foreign:
		// Someone else's intent carries this key's metadata: completing
		// the row from it could record a payment that is not this one.
		log.Error("provider holds an intent under this key that is not this payment's; left pending for a person",
			"error", lookupErr, "lookup_failures", failures, "next_lookup_at", next)
		return verdict{fate: left, errored: true, lookupFailed: true, foreign: true}
	case err == nil:
		log.Warn("provider lookup failed; payment left pending", "error", lookupErr,
			"lookup_failures", failures, "next_lookup_at", next)
		return verdict{fate: left, errored: true, lookupFailed: true}
	case errors.Is(err, ledger.ErrLeaseLost):
		return verdict{fate: leaseLost, errored: true, lookupFailed: true, foreign: foreign}
	}
	log.Error("could not release a stuck payment after its lookup failed; its lease will lapse",
		"lookup_error", lookupErr, "error", err)
	return verdict{fate: left, errored: true, lookupFailed: true, foreign: foreign, dbDown: errors.Is(err, ledger.ErrUnavailable)}
}

// release gives a leased row back, still pending, even when ctx is done.
func (r *Reconciler) release(ctx context.Context, s ledger.Stuck, reason string) verdict {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	err := r.store.Release(ctx, s.Lease, reason)
	switch {
	case err == nil:
		return verdict{fate: left}
	case errors.Is(err, ledger.ErrLeaseLost):
		return verdict{fate: leaseLost}
	}
	r.log.Error("could not release a stuck payment; its lease will lapse", "merchant_id", s.Lease.MerchantID,
		"idempotency_key", s.Lease.IdempotencyKey, "provider_key", s.Lease.ProviderKey, "error", err)
	return verdict{fate: left, errored: true, dbDown: errors.Is(err, ledger.ErrUnavailable)}
}

// settleProcessing looks up, by intent id, up to BatchSize payments the
// ledger holds as processing, resuming where the last pass stopped, and
// settles those the provider has finished: succeeded, or failed (the
// intent went back to requires_payment_method or was canceled). Several
// reconcilers may run it at once: SettlePayment changes only a row still
// processing.
func (r *Reconciler) settleProcessing(ctx context.Context, res *RunResult) {
	r.mu.Lock()
	cur := r.processingCursor
	r.mu.Unlock()
	payments, next, err := r.store.ProcessingPayments(ctx, cur, r.cfg.BatchSize)
	if err != nil {
		res.Errors++
		r.log.Error("list processing payments", "error", err)
		return
	}
	r.mu.Lock()
	r.processingCursor = next
	r.mu.Unlock()
	for _, p := range payments {
		if ctx.Err() != nil {
			return
		}
		log := r.log.With("merchant_id", p.MerchantID, "idempotency_key", p.IdempotencyKey, "charge_id", p.ChargeID)
		lctx, cancel := context.WithTimeout(ctx, r.cfg.LookupTimeout)
		found, err := r.looker.Lookup(lctx, provider.LookupRequest{ProviderKey: p.ProviderKey, MerchantID: p.MerchantID,
			IdempotencyKey: p.IdempotencyKey, ChargeID: p.ChargeID, Amount: p.Amount, Currency: p.Currency})
		cancel()
		switch {
		case err != nil:
			res.Errors++
			res.LookupErrors++
			if errors.Is(err, provider.ErrForeignIntent) {
				res.ForeignIntents++
			}
			log.Warn("lookup of a processing payment failed; left processing", "error", err)
			continue
		case !found.Found || found.Outcome == nil:
			// Retrieved by id, the intent must exist: its absence is for a
			// person, not a reason to call the payment failed.
			res.Errors++
			log.Error("provider has no intent for a processing payment; left processing")
			continue
		case found.Outcome.ChargeID != p.ChargeID:
			res.Errors++
			log.Error("lookup of a processing payment found another intent; left processing", "found", found.Outcome.ChargeID)
			continue
		}
		out := found.Outcome
		// A charge's intent still held for capture has not moved money:
		// still processing, as one the provider is still processing. An
		// authorize accepted as processing and now held for capture is
		// left processing too: the ledger settles a processing row only
		// to succeeded or failed (migration 00009).
		c := ledger.CompletionFor(ledger.KindOfProviderKey(p.ProviderKey), out, ledger.ProviderBodyOnly)
		if c.Processing || c.Authorized {
			res.StillProcessing++
			continue
		}
		status := c.SettleStatus()
		switch err := r.store.SettlePayment(context.WithoutCancel(ctx), p, status, c.ResponseStatus, c.Response); {
		case errors.Is(err, ledger.ErrNotFound):
			// Another reconciler settled it first.
		case err != nil:
			res.Errors++
			log.Error("could not settle a processing payment", "status", status, "error", err)
		case out.Declined:
			res.SettledFailed++
			log.Info("processing payment failed at the provider", "decline_code", out.DeclineCode)
		default:
			res.SettledSucceeded++
			log.Info("processing payment succeeded")
		}
	}
}

// purge deletes expired finished rows in batches until a batch comes back
// short or MaxPurgeBatches ran.
func (r *Reconciler) purge(ctx context.Context, res *RunResult) {
	for range r.cfg.MaxPurgeBatches {
		n, err := r.store.Purge(ctx, r.cfg.PurgeBatch)
		res.Purged += n
		if err != nil {
			if ctx.Err() == nil {
				res.Errors++
				r.log.Error("purge expired keys", "error", err)
			}
			return
		}
		if n < r.cfg.PurgeBatch {
			return
		}
	}
}

// RefundStore is what resolving stuck refunds needs of the store;
// *dedup.Store is one. A store without it resolves none.
type RefundStore interface {
	AcquireStuckRefunds(ctx context.Context, holder string, grace, lease time.Duration, limit int) ([]ledger.Refund, error)
	CompleteRefund(ctx context.Context, l ledger.Lease, c ledger.RefundCompletion) error
	ReleaseRefund(ctx context.Context, l ledger.Lease, reason string) error
}

// RefundLooker is the provider's refund lookup, which never refunds;
// *stripe.Client and the budget's Provider are ones.
type RefundLooker interface {
	LookupRefund(ctx context.Context, req provider.RefundLookupRequest) (provider.RefundLookupResult, error)
}

// resolveRefunds leases up to BatchSize refunds that may have been made
// and that nobody resolves (AcquireStuckRefunds), looks each up among its
// payment's refunds, and records the one found; one not found is given
// back unknown, still holding its amount, for its message's next delivery
// to send (after its own lookup). It never refunds.
func (r *Reconciler) resolveRefunds(ctx context.Context, res *RunResult) {
	rs, ok := r.store.(RefundStore)
	rl, ok2 := r.looker.(RefundLooker)
	if !ok || !ok2 {
		return
	}
	stuck, err := rs.AcquireStuckRefunds(ctx, r.cfg.Holder, r.acquireAfter, r.cfg.Lease, r.cfg.BatchSize)
	if err != nil {
		res.Errors++
		r.log.Error("lease stuck refunds", "error", err)
		return
	}
	for _, rf := range stuck {
		l := rf.Lease()
		log := r.log.With("merchant_id", rf.MerchantID, "idempotency_key", rf.IdempotencyKey, "payment_key", rf.PaymentKey)
		lctx, cancel := context.WithTimeout(ctx, r.cfg.LookupTimeout)
		found, err := rl.LookupRefund(lctx, provider.RefundLookupRequest{ChargeID: rf.ChargeID, MerchantID: rf.MerchantID,
			IdempotencyKey: rf.IdempotencyKey, Amount: rf.Amount})
		cancel()
		wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		switch {
		case err != nil:
			res.Errors++
			res.LookupErrors++
			res.RefundsLeft++
			log.Warn("lookup of a stuck refund failed; left unknown", "error", err)
			r.releaseRefund(wctx, rs, l, "reconciler: lookup failed: "+err.Error(), log)
		case !found.Found:
			res.RefundsLeft++
			log.Info("stuck refund not made at the provider; left unknown for its next delivery")
			r.releaseRefund(wctx, rs, l, "reconciler: the provider has no refund under the key", log)
		default:
			c := ledger.RefundCompletionOf(found.Outcome)
			if err := rs.CompleteRefund(wctx, l, c); err != nil {
				res.Errors++
				res.RefundsLeft++
				log.Error("could not record a stuck refund found by lookup", "refund_id", c.RefundID, "error", err)
			} else {
				res.RefundsResolved++
				log.Info("stuck refund resolved by lookup", "refund_id", c.RefundID, "status", c.Status)
			}
		}
		wcancel()
	}
}

// releaseRefund gives a stuck refund back unknown.
func (r *Reconciler) releaseRefund(ctx context.Context, rs RefundStore, l ledger.Lease, reason string, log *slog.Logger) {
	if err := rs.ReleaseRefund(ctx, l, reason); err != nil && !errors.Is(err, ledger.ErrLeaseLost) {
		log.Warn("could not release a stuck refund; its lease will run out", "error", err)
	}
}

// PaymentOpStore is what resolving stuck captures and cancels needs of the
// store; *dedup.Store is one. A store without it resolves none.
type PaymentOpStore interface {
	AcquireStuckPaymentOps(ctx context.Context, holder string, grace, lease time.Duration, limit int) ([]ledger.PaymentOp, error)
	CompletePaymentOp(ctx context.Context, l ledger.Lease, c ledger.PaymentOpCompletion) error
	ReleasePaymentOp(ctx context.Context, l ledger.Lease, reason string) error
}

// IntentRetriever is the provider's retrieve of an intent, which never
// acts; *stripe.Client and the budget's Provider are ones.
type IntentRetriever interface {
	RetrieveIntent(ctx context.Context, req provider.RetrieveIntentRequest) (*provider.IntentOutcome, error)
}

// resolvePaymentOps leases up to BatchSize captures and cancels that may
// have been made and that nobody resolves (AcquireStuckPaymentOps),
// retrieves each one's intent, and records the ones it shows done, or
// never possible (ledger.PaymentOpCompletionOf); one whose intent still
// requires_capture is given back unknown, still holding its payment, for
// its message's next delivery to send (after its own retrieve). It never
// captures or cancels.
func (r *Reconciler) resolvePaymentOps(ctx context.Context, res *RunResult) {
	ps, ok := r.store.(PaymentOpStore)
	ir, ok2 := r.looker.(IntentRetriever)
	if !ok || !ok2 {
		return
	}
	stuck, err := ps.AcquireStuckPaymentOps(ctx, r.cfg.Holder, r.acquireAfter, r.cfg.Lease, r.cfg.BatchSize)
	if err != nil {
		res.Errors++
		r.log.Error("lease stuck captures and cancels", "error", err)
		return
	}
	for _, o := range stuck {
		l := o.Lease()
		log := r.log.With("merchant_id", o.MerchantID, "idempotency_key", o.IdempotencyKey, "payment_key", o.PaymentKey, "kind", o.Kind)
		release := func(ctx context.Context, reason string) {
			if err := ps.ReleasePaymentOp(ctx, l, reason); err != nil && !errors.Is(err, ledger.ErrLeaseLost) {
				log.Warn("could not release a stuck "+o.Kind+"; its lease will run out", "error", err)
			}
		}
		lctx, cancel := context.WithTimeout(ctx, r.cfg.LookupTimeout)
		got, err := ir.RetrieveIntent(lctx, provider.RetrieveIntentRequest{ChargeID: o.ChargeID, MerchantID: o.MerchantID})
		cancel()
		wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		var (
			c    ledger.PaymentOpCompletion
			done bool
		)
		if err == nil {
			c, done = ledger.PaymentOpCompletionOf(o.Kind, got)
		}
		switch {
		case err != nil:
			res.Errors++
			res.LookupErrors++
			res.PaymentOpsLeft++
			log.Warn("retrieve of a stuck "+o.Kind+"'s intent failed; left unknown", "error", err)
			release(wctx, "reconciler: retrieve failed: "+err.Error())
		case !done:
			res.PaymentOpsLeft++
			log.Info("stuck "+o.Kind+" not made at the provider; left unknown for its next delivery", "status", got.Status)
			release(wctx, "reconciler: the intent is "+got.Status)
		default:
			if err := ps.CompletePaymentOp(wctx, l, c); err != nil {
				res.Errors++
				res.PaymentOpsLeft++
				log.Error("could not record a stuck "+o.Kind+" found by retrieve", "error", err)
			} else {
				res.PaymentOpsResolved++
				log.Info("stuck "+o.Kind+" resolved by retrieve", "status", c.Status, "amount_received", c.AmountReceived)
			}
		}
		wcancel()
	}
}
