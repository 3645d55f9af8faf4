package consumer

import (
	"context"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// IntakeMarker records on the gateway's intake that the worker
// dead-lettered a command the gateway published, with the dead letter's
// reason and error text (the gateway's store implements it). The worker is
// given one at construction.
type IntakeMarker interface {
	MarkIntakeDeadLettered(ctx context.Context, merchantID, key string, seq uint64, reason, errText string) (bool, error)
}

// OperatorMarker is the optional part of an IntakeMarker that records a
// dead letter that waits for an operator (the gateway's store implements
// it): not final, the gateway shows the payment waiting for an operator
// until a worker claims the key again.
type OperatorMarker interface {
	MarkIntakeForOperator(ctx context.Context, merchantID, key, reason, errText string) (bool, error)
}

// PauseNoter is the optional part of an IntakeMarker that records the
// worker's pauses where the gateway reads them (the gateway's store
// implements it), so a client asking about a payment that waits is told
// the workers are paused, and why. cause "" clears the worker's note.
type PauseNoter interface {
	NotePause(ctx context.Context, holder, cause string, since, retryAt time.Time) error
}

// PauseNoteEvery is how often a paused worker writes its pause again; the
// gateway counts a note for a few of these (pgstore.PauseFresh), so a
// worker killed while paused stops counting soon after.
const PauseNoteEvery = 5 * time.Second

// notePauses writes the worker's pause through the intake's PauseNoter
// every PauseNoteEvery while the worker is paused, and clears it once the
// worker works again or stops, until ctx ends. A failed write is logged at
// debug and tried at the next tick: the note only informs clients (the
// pause itself, its metric and /readyz do not depend on it).
func (w *Worker) notePauses(ctx context.Context) {
	pn, ok := w.intake.(PauseNoter)
	if !ok {
		return
	}
	noted := ""
	write := func(ctx context.Context, cause string, since, retryAt time.Time) {
		wctx, cancel := context.WithTimeout(ctx, PauseNoteEvery)
		defer cancel()
		if err := pn.NotePause(wctx, w.cfg.Holder, cause, since, retryAt); err != nil {
			w.logger.Debug("could not record the worker's pause for the gateway", "cause", cause, "error", err)
			return
		}
		noted = cause
	}
	t := time.NewTicker(PauseNoteEvery)
	defer t.Stop()
	var behindSince time.Time // when a look first saw payments behind another merchant's
	for {
		cause, since := w.proc.gate.pausedSince()
		if !w.behindMerchant() {
			behindSince = time.Time{}
		} else if behindSince.IsZero() {
			behindSince = w.proc.cfg.Clock.Now()
		}
		switch n, s := w.proc.RateLimited(); {
		case cause != "":
		case n > 0:
			// Not paused, but payments wait for the provider's rate
			// limit or the fleet's budget: say so too.
			cause, since = WaitRateLimited, s
		case !behindSince.IsZero():
			cause, since = WaitBehindMerchant, behindSince
		}
		if cause != "" || noted != "" {
			write(ctx, cause, since, w.proc.gate.retryAt())
		}
		select {
		case <-ctx.Done():
			if noted != "" {
				write(context.WithoutCancel(ctx), "", time.Time{}, time.Time{})
			}
			return
		case <-t.C:
		}
	}
}

// behindMerchant reports whether the worker's payments wait behind
// another merchant's (WaitBehindMerchant), as far as it can know: payments
// of two merchants or more wait for a call slot, or lanes are open for
// merchants whose commands are stored behind another's backlog.
func (w *Worker) behindMerchant() bool {
	return w.proc.calls.merchantsWaiting() >= 2 || w.Lanes() > 0
}

// deadLetteredIntake tells the gateway's intake of a command it published
// that the worker dead-lettered it, so the gateway answers the reason
// instead of "queued" and stops republishing. The store marks only the
// intake that published this very stream sequence; commands published
// straight on the queue have none. The message is already dead-lettered:
// a failure here is logged and changes nothing of its fate.
//
// Only a dead letter that is final for the client is recorded as final:
// bad input and a reused key, which a replay would dead-letter again. A
// letter that waits for an operator (max_deliveries, provider_rejected, a
// ledger conflict, a provider idempotency mismatch) may still end in a
// charge, or stand beside one: it is recorded apart (OperatorMarker), and
// the gateway answers "waiting for an operator" beside the idempotency
// record, never "final, send it again under a new key".
//
// The letter of a refund, a capture or a cancel marks only the door's
// intake of that very operation (operationLetter): its key may be a
// payment's too, published straight on the queue.
func (w *Worker) deadLetteredIntake(ctx context.Context, in *inbound, reason string, cause error, log *slog.Logger) {
	var body []byte
	if in.cmd == nil && in.msg != nil {
		body = in.msg.Data()
	}
	if actsOnPayment(in.cmd, body, w.cfg.Stream.Limits) {
		w.operationLetter(ctx, in, reason, cause, log)
		return
	}
	final := finalForClient(reason)
	op, canWait := w.intake.(OperatorMarker)
	if !final && !canWait {
		return
	}
	if w.intake == nil || in.meta == nil || in.meta.Sequence.Stream == 0 || in.meta.Sequence.Stream > math.MaxInt64 {
		return
	}
	var merchant, key string
	if in.cmd != nil {
		merchant, key = letterKey(w.cfg.Stream, in.cmd, "", nil)
	} else {
		merchant, key = letterKey(w.cfg.Stream, nil, in.msg.Subject(), in.msg.Headers())
	}
	if merchant == "" {
		return
	}
	errText := stream.SanitizeHeader(errString(cause))
	if !final {
		marked, err := op.MarkIntakeForOperator(ctx, merchant, key, reason, errText)
		switch {
		case err != nil:
			log.Warn("could not record on the gateway's intake that the payment waits for an operator; the gateway shows the record's state", "reason", reason, "error", err)
		case marked:
			log.Info("gateway intake marked waiting for an operator", "reason", reason)
		}
		return
	}
	marked, err := w.intake.MarkIntakeDeadLettered(ctx, merchant, key, in.meta.Sequence.Stream, reason, errText)
	switch {
	case err != nil:
		log.Warn("could not record the dead letter on the gateway's intake; the gateway shows the payment queued", "reason", reason, "error", err)
	case marked:
		log.Info("gateway intake marked dead-lettered", "reason", reason)
	}
}

// operationLetter tells the door's intake of a refund, a capture or a
// cancel (OperationMarker) that the worker dead-lettered it: final when
// the ledger's rules refused it (over_refundable, payment_not_charged...)
// or its input was bad, so a retry of the same operation is answered the
// refusal for as long as the intake lives and is never published and
// judged again; else waiting for an operator. A command that did not
// decode has no fingerprint to match and marks nothing (the door
// publishes only commands that decode).
func (w *Worker) operationLetter(ctx context.Context, in *inbound, reason string, cause error, log *slog.Logger) {
	om, ok := w.intake.(OperationMarker)
	if !ok || in.cmd == nil || in.meta == nil || in.meta.Sequence.Stream == 0 || in.meta.Sequence.Stream > math.MaxInt64 {
		return
	}
	merchant, key := letterKey(w.cfg.Stream, in.cmd, "", nil)
	if merchant == "" {
		return
	}
	fp, errText := ledger.Fingerprint(in.cmd), stream.SanitizeHeader(errString(cause))
	if !finalForClient(reason) && !ledger.IsLedgerRefusal(reason) {
		marked, err := om.MarkOperationForOperator(ctx, merchant, key, fp, reason, errText)
		switch {
		case err != nil:
			log.Warn("could not record on the gateway's intake that the operation waits for an operator", "reason", reason, "error", err)
		case marked:
			log.Info("gateway intake of the operation marked waiting for an operator", "reason", reason)
		}
		return
	}
	marked, err := om.MarkOperationDeadLettered(ctx, merchant, key, fp, in.meta.Sequence.Stream, reason, errText)
	switch {
	case err != nil:
		log.Warn("could not record the operation's refusal on the gateway's intake; the gateway reads its refused event", "reason", reason, "error", err)
	case marked:
		log.Info("gateway intake of the operation marked dead-lettered", "reason", reason)
	}
}

// letterKey is the merchant and idempotency key of a dead-lettered
// message: its decoded command's, else read from its subject and header
// as the gateway publishes them. Both are "" when they are not valid.
func letterKey(cfg stream.Config, cmd *payment.Command, subject string, header nats.Header) (merchant, key string) {
	if cmd != nil {
		merchant, key = cmd.MerchantID, cmd.IdempotencyKey
	} else {
		merchant, _ = strings.CutPrefix(subject, cfg.SubjectPrefix+".")
		key = header.Get(stream.HeaderIdempotencyKey)
	}
	if payment.ValidateMerchant(merchant) != nil || payment.ValidateKey(key) != nil {
		return "", ""
	}
	return merchant, key
}
