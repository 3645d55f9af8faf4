package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/stream"
)

// RefundStore is what a refund needs from the store: its claim under the
// refunded payment's lock, and the writes under its lease.
type RefundStore interface {
	ClaimRefund(ctx context.Context, holder string, lease time.Duration, req ledger.RefundRequest) (ledger.RefundClaim, error)
	CompleteRefund(ctx context.Context, l ledger.Lease, c ledger.RefundCompletion) error
	ReleaseRefund(ctx context.Context, l ledger.Lease, reason string) error
}

// Refunder is what a refund needs from the provider: the refund, and its
// lookup, which never acts.
type Refunder interface {
	Refund(ctx context.Context, req provider.RefundRequest) (*provider.RefundOutcome, error)
	LookupRefund(ctx context.Context, req provider.RefundLookupRequest) (provider.RefundLookupResult, error)
}

// refund claims, sends and records one refund command, by the charge's
// rules: the claim (RefundStore.ClaimRefund) before the call, under the
// refund's own provider key stored with it; the ledger's refusal
// dead-lettered with its reason and never sent; an outcome that may have
// happened (a lease run out, an answer lost) looked up before any re-call;
// the message acked only after the outcome's commit.
func (p *Processor) refund(ctx context.Context, cmd *payment.Command, log *slog.Logger) Result {
	rs, okStore := p.store.(RefundStore)
	rf, okProvider := p.charger.(Refunder)
	if !okStore || !okProvider {
		return Result{Kind: DeadLetter, Reason: string(payment.ReasonInvalidKind),
			Err: errors.New("this worker's store or provider does not take refunds")}
	}
	claim, err := rs.ClaimRefund(ctx, p.cfg.Holder, p.cfg.Lease, ledger.NewRefundRequest(cmd))
	if err != nil {
		return Result{Kind: Retry, Delay: 2 * time.Second, Err: fmt.Errorf("claim refund: %w", err), pause: p.gate.storeFailed(err)}
	}
	p.gate.storeWorks()
	switch claim.Outcome {
	case ledger.Refused:
		return Result{Kind: DeadLetter, Reason: claim.Reason,
			Err: fmt.Errorf("refund of %q refused, never sent: %s (amount %d, refundable %d)", cmd.PaymentKey, claim.Reason, cmd.Amount, claim.Refundable)}
	case ledger.Mismatch:
		return Result{Kind: DeadLetter, Reason: stream.ReasonKeyReused,
			Err: errors.New("idempotency key reused with a different refund: the request fingerprint differs from the stored one")}
	case ledger.Duplicate:
		return Result{Kind: Duplicate, Attempt: claim.Refund.Attempts}
	case ledger.InFlight:
		return Result{Kind: InFlight, Delay: claim.RetryIn, Err: errors.New("another worker holds the refund's lease")}
	case ledger.Claimed, ledger.NeedsLookup:
		return p.refundUnderLease(ctx, cmd, claim, rs, rf, log.With("attempt", claim.Lease.Attempt))
	}
	return Result{Kind: Retry, Err: fmt.Errorf("unexpected refund claim outcome %v", claim.Outcome)}
}

// refundUnderLease looks the refund up first when it may have been sent
// (NeedsLookup), calls the provider only when the lookup found nothing (or
// for a new claim), and records the answer under the lease.
func (p *Processor) refundUnderLease(ctx context.Context, cmd *payment.Command, claim ledger.RefundClaim, rs RefundStore, rf Refunder, log *slog.Logger) Result {
	l, r := *claim.Lease, claim.Refund
	callCtx, cancel := context.WithTimeout(ctx, p.callBudget())
	defer cancel()
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer scancel()
	var out *provider.RefundOutcome
	if claim.Outcome == ledger.NeedsLookup {
		found, err := rf.LookupRefund(callCtx, provider.RefundLookupRequest{ChargeID: r.ChargeID, MerchantID: r.MerchantID,
			IdempotencyKey: r.IdempotencyKey, Amount: r.Amount})
		if err != nil {
			return p.refundUnknown(sctx, cmd, rs, l, fmt.Errorf("look up the refund: %w", err), log)
		}
		p.providerAnswered(cmd, nil)
		if found.Found {
			out = found.Outcome
			log.Info("refund found by lookup", "refund_id", out.RefundID, "status", out.Status)
		}
	}
	if out == nil {
		var err error
		out, err = rf.Refund(callCtx, provider.RefundRequest{ProviderKey: l.ProviderKey, ChargeID: r.ChargeID, Amount: r.Amount,
			MerchantID: r.MerchantID, IdempotencyKey: r.IdempotencyKey, Metadata: cmd.Metadata})
		if err != nil {
			res := p.refundUnknown(sctx, cmd, rs, l, fmt.Errorf("refund: %w", err), log)
			switch provider.ClassOf(err) {
			case provider.ClassRejected:
				res.Kind, res.Reason = DeadLetter, stream.ReasonProviderRejected
			case provider.ClassMismatch:
				res.Kind, res.Reason = DeadLetter, stream.ReasonProviderMismatch
			}
			return res
		}
		p.providerAnswered(cmd, nil)
	}
	c := ledger.RefundCompletionOf(out)
	if res, ok := p.recordUnderLease(rs.CompleteRefund(sctx, l, c), l, "refund", log.With("refund_id", out.RefundID)); !ok {
		return res
	}
	log.LogAttrs(ctx, slog.LevelInfo, "refund completed", slog.String("refund_id", out.RefundID), slog.String("status", c.Status),
		slog.Int64("amount", r.Amount), slog.Bool("replayed", out.Replayed))
	return Result{Kind: Completed, Attempt: l.Attempt}
}

// refundUnknown gives up the lease of a refund whose outcome is not known
// (the row becomes unknown: it holds its amount and is looked up before
// any re-call) and returns the retry.
func (p *Processor) refundUnknown(sctx context.Context, cmd *payment.Command, rs RefundStore, l ledger.Lease, err error, log *slog.Logger) Result {
	return p.leaseUnknown(sctx, cmd, func(ctx context.Context, reason string) error { return rs.ReleaseRefund(ctx, l, reason) }, l, err, log)
}

// leaseUnknown gives up, by release, the lease l of an operation on a
// payment (a refund, a capture, a cancel) whose outcome is not known: its
// row becomes unknown, still holding the payment, and is looked up before
// any re-call. It returns the retry, with what the provider's error shows
// to the pause gate (providerAnswered): an outage's retry is held, not
// nakked.
func (p *Processor) leaseUnknown(sctx context.Context, cmd *payment.Command, release func(ctx context.Context, reason string) error, l ledger.Lease, err error, log *slog.Logger) Result {
	log.Warn("outcome unknown; looked up before any re-call", "error", err)
	if rerr := release(sctx, err.Error()); rerr != nil && !errors.Is(rerr, ledger.ErrLeaseLost) {
		log.Warn("could not release the lease; it will expire", "error", rerr)
	}
	pause, down := p.providerAnswered(cmd, err)
	return Result{Kind: Retry, Err: err, Attempt: l.Attempt, pause: pause, unavailable: down}
}

// recordUnderLease reads err, the record of what (a refund, a capture, a
// cancel) under l: ok when it was recorded, else the retry (a lost lease:
// the next holder looks it up; a store failure: made but not recorded,
// the row stays pending until its lease runs out, then the next delivery
// looks it up).
func (p *Processor) recordUnderLease(err error, l ledger.Lease, what string, log *slog.Logger) (Result, bool) {
	switch {
	case errors.Is(err, ledger.ErrLeaseLost):
		log.Warn(what + "'s lease lost before its record; the next holder looks it up")
		return Result{Kind: Retry, Delay: time.Second, Err: err, Attempt: l.Attempt}, false
	case err != nil:
		log.Error("could not record the "+what+"; the next delivery looks it up", "error", err)
		return Result{Kind: Retry, Err: err, Attempt: l.Attempt, pause: p.gate.storeFailed(err)}, false
	}
	return Result{}, true
}

// actsOnPayment reports whether a message is a command that acts on a
// payment (a refund, a capture, a cancel: payment.Command.ActsOnPayment):
// its decoded command's kind, else its body's as sent (one refused for bad
// input still names its kind).
func actsOnPayment(cmd *payment.Command, body []byte, lim payment.Limits) bool {
	if cmd == nil {
		cmd = payment.DecodeAsSent(body, lim)
	}
	return cmd != nil && cmd.ActsOnPayment()
}
