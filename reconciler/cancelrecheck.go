package reconciler

import (
	"context"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
)

// CancelRechecker is what confirming the cancels an event reported needs
// of the store; *dedup.Store is one. A store without it confirms none.
type CancelRechecker interface {
	CancelsToRecheck(ctx context.Context, limit int) ([]ledger.Payment, error)
	RecheckCancel(ctx context.Context, merchantID, key, chargeID, providerStatus, reason string) (canceled bool, status string, err error)
}

// recheckCancels retrieves the intent of up to BatchSize authorized
// payments an event said the provider canceled (stamped by the webhook:
// payment_intent.canceled is only a hint, it may be forged or stale); the
// retrieve, which never acts, decides. Canceled at the provider, the
// payment moves to canceled with one canceled event (unless a capture or
// cancel of it holds: that operation's outcome decides); any other
// status (requires_capture, succeeded) clears the stamp and changes
// nothing, logged at error level: the event was wrong. A retrieve that
// fails leaves the stamp for the next pass.
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
			log.Warn("retrieve of an intent reported canceled failed; left authorized", "error", err)
			continue
		case got == nil || got.ChargeID != c.ChargeID || got.Status == "":
			res.Errors++
			log.Error("retrieve of an intent reported canceled answered another intent, or no status; left authorized")
			continue
		}
		canceled, status, err := cs.RecheckCancel(context.WithoutCancel(ctx), c.MerchantID, c.IdempotencyKey, c.ChargeID, got.Status,
			"canceled at the provider")
		switch {
		case err != nil:
			res.Errors++
			log.Error("could not record a cancel's recheck", "provider_status", got.Status, "error", err)
		case canceled:
			res.CancelsConfirmed++
			log.Info("authorized payment canceled by the provider; recorded after its lookup")
		case got.Status != provider.StatusCanceled:
			log.Error("an event said the provider canceled an authorization it does not hold canceled; the ledger is unchanged",
				"provider_status", got.Status, "status", status)
		default:
			log.Info("cancel rechecked; unchanged", "status", status, "provider_status", got.Status)
		}
	}
}
