package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/stream"
)

// PaymentOpStore is what a capture or a cancel needs from the store: its
// claim under the payment's lock, and the writes under its lease.
type PaymentOpStore interface {
	ClaimPaymentOp(ctx context.Context, holder string, lease time.Duration, req ledger.PaymentOpRequest) (ledger.PaymentOpClaim, error)
	CompletePaymentOp(ctx context.Context, l ledger.Lease, c ledger.PaymentOpCompletion) error
	ReleasePaymentOp(ctx context.Context, l ledger.Lease, reason string) error
}

// IntentMover is what a capture or a cancel needs from the provider: the
// capture, the cancel, and the intent's retrieval, which never acts.
type IntentMover interface {
	Capture(ctx context.Context, req provider.CaptureRequest) (*provider.IntentOutcome, error)
	Cancel(ctx context.Context, req provider.CancelRequest) (*provider.IntentOutcome, error)
	RetrieveIntent(ctx context.Context, req provider.RetrieveIntentRequest) (*provider.IntentOutcome, error)
}

// actOnPayment handles a command that acts on a payment (ActsOnPayment):
// a refund, a capture or a cancel, each claimed on its own under the
// payment's lock.
func (p *Processor) actOnPayment(ctx context.Context, cmd *payment.Command, log *slog.Logger) Result {
	if cmd.Kind == payment.KindRefund {
		return p.refund(ctx, cmd, log)
	}
	return p.paymentOp(ctx, cmd, log)
}

// claimsAlone reports whether cmd is claimed on its own rather than in
// its batch's one claim: a command that acts on a payment (a refund, a
// capture, a cancel: its claim locks the payment). runAlone runs such a
// command from its claim to its result, for its first run (Worker.refunds)
// and for its runs after a hold (Worker.rerun); its result goes through
// the pause gate's path (providerAnswered) as a charge's does.
func claimsAlone(cmd *payment.Command) bool { return cmd.ActsOnPayment() }

// runAlone runs a command that claimsAlone.
func (p *Processor) runAlone(ctx context.Context, cmd *payment.Command, log *slog.Logger) Result {
	if claimsAlone(cmd) {
		return p.actOnPayment(ctx, cmd, log)
	}
	return Result{Kind: DeadLetter, Reason: string(payment.ReasonInvalidKind), Err: fmt.Errorf("%s is not claimed on its own", cmd.Kind)}
}

// paymentOp claims, sends and records one capture or cancel, by a refund's
// rules (refund): the claim (PaymentOpStore.ClaimPaymentOp) before the
// call, under its own provider key stored with it; the ledger's refusal
// dead-lettered with its reason and never sent; an outcome that may have
// happened (a lease run out, an answer lost) looked up (RetrieveIntent)
// before any re-call; the message acked only after the outcome's commit.
func (p *Processor) paymentOp(ctx context.Context, cmd *payment.Command, log *slog.Logger) Result {
	ps, okStore := p.store.(PaymentOpStore)
	im, okProvider := p.charger.(IntentMover)
	if !okStore || !okProvider {
		return Result{Kind: DeadLetter, Reason: string(payment.ReasonInvalidKind),
			Err: fmt.Errorf("this worker's store or provider does not take a %s", cmd.Kind)}
	}
	claim, err := ps.ClaimPaymentOp(ctx, p.cfg.Holder, p.cfg.Lease, ledger.NewPaymentOpRequest(cmd))
	if err != nil {
		return Result{Kind: Retry, Delay: 2 * time.Second, Err: fmt.Errorf("claim %s: %w", cmd.Kind, err), pause: p.gate.storeFailed(err)}
	}
	p.gate.storeWorks()
	switch claim.Outcome {
	case ledger.Refused:
		return Result{Kind: DeadLetter, Reason: claim.Reason,
			Err: fmt.Errorf("%s of %q refused, never sent: %s (amount %d, authorized %d)", cmd.Kind, cmd.PaymentKey, claim.Reason, cmd.Amount, claim.Capturable)}
	case ledger.Mismatch:
		return Result{Kind: DeadLetter, Reason: stream.ReasonKeyReused,
			Err: fmt.Errorf("idempotency key reused with a different request: the key holds another %s, or a refund", cmd.Kind)}
	case ledger.Duplicate:
		return Result{Kind: Duplicate, Attempt: claim.Op.Attempts}
	case ledger.InFlight:
		return Result{Kind: InFlight, Delay: claim.RetryIn, Err: fmt.Errorf("another worker holds the %s's lease", cmd.Kind)}
	case ledger.Claimed, ledger.NeedsLookup:
		return p.paymentOpUnderLease(ctx, cmd, claim, ps, im, log.With("attempt", claim.Lease.Attempt))
	}
	return Result{Kind: Retry, Err: fmt.Errorf("unexpected %s claim outcome %v", cmd.Kind, claim.Outcome)}
}

// paymentOpUnderLease retrieves the intent first when the operation may
// have been sent (NeedsLookup): an intent that shows it happened (or can
// never happen) is recorded, and only one still requires_capture is sent
// (again, under the same provider key). The answer is recorded under the
// lease.
func (p *Processor) paymentOpUnderLease(ctx context.Context, cmd *payment.Command, claim ledger.PaymentOpClaim, ps PaymentOpStore, im IntentMover, log *slog.Logger) Result {
	l, o := *claim.Lease, claim.Op
	callCtx, cancel := context.WithTimeout(ctx, p.callBudget())
	defer cancel()
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer scancel()
	release := func(err error) Result {
		return p.leaseUnknown(sctx, cmd, func(ctx context.Context, reason string) error { return ps.ReleasePaymentOp(ctx, l, reason) }, l, err, log)
	}
	var (
		c     ledger.PaymentOpCompletion
		known bool
	)
	if claim.Outcome == ledger.NeedsLookup {
		got, err := im.RetrieveIntent(callCtx, provider.RetrieveIntentRequest{ChargeID: o.ChargeID, MerchantID: o.MerchantID})
		if err != nil {
			return release(fmt.Errorf("retrieve the intent: %w", err))
		}
		p.providerAnswered(cmd, nil)
		if c, known = ledger.PaymentOpCompletionOf(o.Kind, got); known {
			log.Info(o.Kind+" settled by lookup", "charge_id", o.ChargeID, "status", got.Status)
		}
	}
	if !known {
		var (
			out *provider.IntentOutcome
			err error
		)
		if o.Kind == payment.KindCapture {
			out, err = im.Capture(callCtx, provider.CaptureRequest{ProviderKey: l.ProviderKey, ChargeID: o.ChargeID, Amount: o.Amount,
				MerchantID: o.MerchantID})
		} else {
			out, err = im.Cancel(callCtx, provider.CancelRequest{ProviderKey: l.ProviderKey, ChargeID: o.ChargeID, MerchantID: o.MerchantID})
		}
		if err != nil {
			return p.opFailed(sctx, cmd, ps, l, o.Kind, err, release, log)
		}
		p.providerAnswered(cmd, nil)
		if c, known = ledger.PaymentOpCompletionOf(o.Kind, out); !known {
			return release(fmt.Errorf("%s answered with the intent %s: not done; looked up before any re-call", o.Kind, out.Status))
		}
	}
	if res, ok := p.recordUnderLease(ps.CompletePaymentOp(sctx, l, c), l, o.Kind, log); !ok {
		return res
	}
	log.LogAttrs(ctx, slog.LevelInfo, o.Kind+" completed", slog.String("charge_id", o.ChargeID), slog.String("status", c.Status),
		slog.Int64("amount", o.Amount), slog.Int64("amount_received", c.AmountReceived), slog.String("reason", c.Reason))
	return Result{Kind: Completed, Attempt: l.Attempt}
}

// opFailed answers a capture's or a cancel's call that ended in err. A
// definitive no of a request the provider wrote nothing for (rejected, or
// one never sent) is recorded refused with the provider's reason, so it
// no longer holds the payment (payment_ops_once): another capture or
// cancel may be claimed, and nothing is looked up again; it is
// dead-lettered for a person. An idempotency_error (the provider key
// holds a request with other parameters, which may have moved the
// intent) and any other failure are released unknown, looked up before
// any re-call; the definitive ones are dead-lettered too.
func (p *Processor) opFailed(sctx context.Context, cmd *payment.Command, ps PaymentOpStore, l ledger.Lease, kind string, err error,
	release func(error) Result, log *slog.Logger) Result {
	err = fmt.Errorf("%s: %w", kind, err)
	class := provider.ClassOf(err)
	if c, ok := refusedOp(class, err); ok {
		if res, ok := p.recordUnderLease(ps.CompletePaymentOp(sctx, l, c), l, kind, log); !ok {
			return res
		}
		p.providerAnswered(cmd, nil)
		log.Error(kind+" refused by the provider; recorded refused and dead-lettered for a person", "reason", c.Reason, "error", err)
		res := Result{Kind: DeadLetter, Reason: stream.ReasonProviderRejected, Err: err, Attempt: l.Attempt}
		if class == provider.ClassMismatch {
			res.Reason = stream.ReasonProviderMismatch
		}
		return res
	}
	res := release(err)
	switch class {
	case provider.ClassRejected:
		res.Kind, res.Reason = DeadLetter, stream.ReasonProviderRejected
	case provider.ClassMismatch:
		res.Kind, res.Reason = DeadLetter, stream.ReasonProviderMismatch
	}
	return res
}

// refusedOp is the refused record of a capture's or a cancel's call the
// provider wrote nothing for: rejected (a 400 invalid_request_error, a
// 404), or a request that could not be sent as it is. Its reason is the
// provider's error code (else the class), its response the provider's
// error fields.
func refusedOp(class provider.Class, err error) (ledger.PaymentOpCompletion, bool) {
	if class != provider.ClassRejected && (class != provider.ClassMismatch || !errors.Is(err, provider.ErrInvalidRequest)) {
		return ledger.PaymentOpCompletion{}, false
	}
	var pe *provider.Error
	if !errors.As(err, &pe) {
		return ledger.PaymentOpCompletion{}, false
	}
	reason := pe.Code
	if reason == "" {
		reason = class.String()
	}
	body, jerr := json.Marshal(map[string]any{"error": map[string]string{"type": pe.Type, "code": pe.Code, "message": pe.Message}})
	if jerr != nil {
		return ledger.PaymentOpCompletion{}, false
	}
	return ledger.PaymentOpCompletion{Status: ledger.OpRefused, Reason: reason, ResponseStatus: pe.HTTPStatus, Response: body}, true
}
