package reconciler

import (
	"context"
	"log/slog"
	"time"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
)

// CancelRechecker is what confirming the cancels an event reported needs
// of the store; *dedup.Store is one. A store without it confirms none.
type CancelRechecker interface {
	CancelsToRecheck(ctx context.Context, limit int) ([]ledger.CancelRecheck, error)
	RecheckCancel(ctx context.Context, merchantID, key, chargeID string, requestedAt time.Time, providerStatus, reason string) (canceled bool, status string, err error)
	PostponeCancelRecheck(ctx context.Context, merchantID, key string, requestedAt time.Time, after time.Duration) (attempts int, err error)
}

// Backoff of a cancel's recheck that got no answer (a failed retrieve,
// an operation of the payment in flight): cancelRecheckBackoff doubled
// per attempt, at most cancelRecheckMaxBackoff; from
// cancelRecheckLoudAttempts on, each is logged at error level.
const (
	cancelRecheckBackoff      = 10 * time.Second
	cancelRecheckMaxBackoff   = time.Hour
	cancelRecheckLoudAttempts = 5
)

// cancelRecheckDelay is how long a stamp that failed attempts times waits.
func cancelRecheckDelay(attempts int) time.Duration {
	d := cancelRecheckBackoff
	for i := 0; i < attempts && d < cancelRecheckMaxBackoff; i++ {
		d *= 2
	}
	return min(d, cancelRecheckMaxBackoff)
}

// recheckCancels retrieves the intent of up to BatchSize authorized
// payments an event said the provider canceled (stamped by the webhook:
// payment_intent.canceled is only a hint, it may be forged or stale); the
// retrieve, which never acts, decides. Canceled at the provider, the
// payment moves to canceled with one canceled event (unless a capture or
// cancel of it holds: that operation's outcome decides); any other
// status (requires_capture, succeeded) clears the stamp and changes
// nothing, logged at error level: the event was wrong. A retrieve that
// fails, or a cancel confirmed while a capture or cancel of the payment
// is in flight, keeps the stamp and pushes it back (backoff), so newer
// stamps get their turn.
func (r *Reconciler) recheckCancels(ctx context.Context, res *RunResult) {
	cs, ok := r.store.(CancelRechecker)
	if !ok {
		return
	}
	stamped, err := cs.CancelsToRecheck(ctx, r.cfg.BatchSize)
	if err != nil {
		res.Errors++
		r.log.Error("list cancels to recheck", "error", err)
		return
	}
	if len(stamped) == 0 {
		return
	}
	ir, ok := r.looker.(IntentRetriever)
	if !ok {
		res.Errors++
		r.log.Error("payments reported canceled wait for a lookup, and this reconciler's provider cannot retrieve intents", "payments", len(stamped))
		return
	}
	for _, c := range stamped {
		if ctx.Err() != nil {
			return
		}
		log := r.log.With("merchant_id", c.MerchantID, "idempotency_key", c.IdempotencyKey, "charge_id", c.ChargeID)
		lctx, cancel := context.WithTimeout(ctx, r.cfg.LookupTimeout)
		got, err := ir.RetrieveIntent(lctx, provider.RetrieveIntentRequest{ChargeID: c.ChargeID, MerchantID: c.MerchantID})
		cancel()
		switch {
		case err != nil:
			res.Errors++
			res.LookupErrors++
			log.Warn("retrieve of an intent reported canceled failed; left authorized", "error", err, "attempts", c.Attempts+1)
			r.postponeCancelRecheck(ctx, cs, c, log)
			continue
		case got == nil || got.ChargeID != c.ChargeID || got.Status == "":
			res.Errors++
			log.Error("retrieve of an intent reported canceled answered another intent, or no status; left authorized", "attempts", c.Attempts+1)
			r.postponeCancelRecheck(ctx, cs, c, log)
			continue
		}
		canceled, status, err := cs.RecheckCancel(context.WithoutCancel(ctx), c.MerchantID, c.IdempotencyKey, c.ChargeID, c.RequestedAt,
			got.Status, "canceled at the provider")
		switch {
		case err != nil:
			res.Errors++
			log.Error("could not record a cancel's recheck", "provider_status", got.Status, "error", err)
		case canceled:
			res.CancelsConfirmed++
			log.Info("authorized payment canceled by the provider; recorded after its lookup")
		case got.Status != provider.StatusCanceled:
			log.Error("the provider does not hold canceled an authorization reported canceled (an event, or an operation refused payment_intent_unexpected_state); the ledger is unchanged",
				"provider_status", got.Status, "status", status)
		case status == ledger.PaymentAuthorized:
			log.Info("cancel confirmed by the provider while a capture or cancel of the payment is in flight; kept for a later pass",
				"attempts", c.Attempts+1)
			r.postponeCancelRecheck(ctx, cs, c, log)
		default:
			log.Info("cancel rechecked; unchanged", "status", status, "provider_status", got.Status)
		}
	}
}

// postponeCancelRecheck pushes c's stamp back after a pass that got no
// answer for it; logged at error level from cancelRecheckLoudAttempts on.
func (r *Reconciler) postponeCancelRecheck(ctx context.Context, cs CancelRechecker, c ledger.CancelRecheck, log *slog.Logger) {
	n, err := cs.PostponeCancelRecheck(context.WithoutCancel(ctx), c.MerchantID, c.IdempotencyKey, c.RequestedAt, cancelRecheckDelay(c.Attempts))
	switch {
	case err != nil:
		log.Error("could not push back a cancel's recheck", "error", err)
	case n >= cancelRecheckLoudAttempts:
		log.Error("a cancel's recheck still has no answer; an operator may look the intent up", "attempts", n)
	}
}
