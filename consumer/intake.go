package consumer

import (
	"context"
	"log/slog"
	"math"
	"strings"

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

// deadLetteredIntake tells the gateway's intake of a command it published
// that the worker dead-lettered it, so the gateway answers the reason
// instead of "queued" and stops republishing. The store marks only the
// intake that published this very stream sequence; commands published
// straight on the queue have none. The message is already dead-lettered:
// a failure here is logged and changes nothing of its fate.
//
// Only a dead letter that is final for the client reaches the intake: bad
// input and a reused key, which a replay would dead-letter again. A letter
// that waits for an operator (max_deliveries, a ledger conflict, a provider
// idempotency mismatch) may still end in a charge, or stand beside one: the
// gateway keeps answering from the idempotency record, never "final, send
// it again under a new key".
func (w *Worker) deadLetteredIntake(ctx context.Context, in *inbound, reason string, cause error, log *slog.Logger) {
	if !finalForClient(reason) {
		return
	}
	if w.intake == nil || in.meta == nil || in.meta.Sequence.Stream == 0 || in.meta.Sequence.Stream > math.MaxInt64 {
		return
	}
	var merchant, key string
	if in.cmd != nil {
		merchant, key = in.cmd.MerchantID, in.cmd.IdempotencyKey
	} else {
		merchant, _ = strings.CutPrefix(in.msg.Subject(), w.cfg.Stream.SubjectPrefix+".")
		key = in.msg.Headers().Get(stream.HeaderIdempotencyKey)
	}
	if payment.ValidateMerchant(merchant) != nil || payment.ValidateKey(key) != nil {
		return
	}
	marked, err := w.intake.MarkIntakeDeadLettered(ctx, merchant, key, in.meta.Sequence.Stream, reason, stream.SanitizeHeader(errString(cause)))
	switch {
	case err != nil:
		log.Warn("could not record the dead letter on the gateway's intake; the gateway shows the payment queued", "reason", reason, "error", err)
	case marked:
		log.Info("gateway intake marked dead-lettered", "reason", reason)
	}
}

// finalForClient reports whether a dead letter's reason settles the payment
// for its client: nothing was charged and a replay would not change that.
func finalForClient(reason string) bool {
	return reason == stream.ReasonKeyReused || payment.IsInputReason(reason)
}
