package consumer

import (
	"cmp"
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// recordRefusal writes the outcome event of a message the worker refuses
// (dead-lettered for bad input or a reused key: finalForClient; or a
// refund, capture or cancel the ledger's rules refuse:
// ledger.IsLedgerRefusal), so a
// publisher on the stream learns it was refused. It runs once the dead
// letter is filed and before the message is termed: it returns false when
// the store did not take the event, and the message is then left for its
// redelivery, which files the letter again (the DLQ stores one) and writes
// the event under the same id (the store keeps one). A message whose
// event cannot be told (refusalOf) writes none.
func (w *Worker) recordRefusal(ctx context.Context, in *inbound, reason string, filedAt time.Time, log *slog.Logger) bool {
	r, ok := w.refusalOf(in, reason, filedAt)
	if !ok {
		return true
	}
	if _, err := w.proc.store.RecordRefusal(ctx, r); err != nil {
		log.Error("refusal event not written; message nakked, its redelivery writes it", "reason", reason, "error", err)
		return false
	}
	return true
}

// refusalOf is the refusal event of a message refused for reason: its
// merchant (the decoded command's, else the subject's), its key (the
// decoded command's, else the Idempotency-Key header, else the body's),
// and its amount and currency as far as the body decodes (0 and "" when
// not, the amount only within the limit, the currency only when it is a
// valid code). ok is false when the
// reason is not a refusal, the message has no stream sequence, the
// merchant or the key cannot be read as valid ones, or one of the values
// holds what looks like a card number (redact.ContainsPAN): an event never
// carries one.
func (w *Worker) refusalOf(in *inbound, reason string, filedAt time.Time) (ledger.Refusal, bool) {
	if !(finalForClient(reason) || ledger.IsLedgerRefusal(reason)) || in.meta == nil || in.meta.Sequence.Stream == 0 {
		return ledger.Refusal{}, false
	}
	r := ledger.Refusal{StreamSeq: in.meta.Sequence.Stream, Reason: reason, FiledAt: filedAt}
	if in.cmd != nil {
		r.MerchantID, r.IdempotencyKey, r.Amount, r.Currency = in.cmd.MerchantID, in.cmd.IdempotencyKey, in.cmd.Amount, in.cmd.Currency
	} else {
		r.MerchantID, _ = strings.CutPrefix(in.msg.Subject(), w.cfg.Stream.SubjectPrefix+".")
		r.IdempotencyKey = in.msg.Headers().Get(stream.HeaderIdempotencyKey)
		if sent := payment.DecodeAsSent(in.msg.Data(), w.cfg.Stream.Limits); sent != nil {
			if r.IdempotencyKey == "" {
				r.IdempotencyKey = sent.IdempotencyKey
			}
			r.Amount = sent.Amount
			if payment.ValidCurrency(sent.Currency) {
				r.Currency = sent.Currency
			}
		}
	}
	// An amount past the limit is the refusal's own reason and never
	// reported: a card number typed as the amount is such a one (the door
	// reads strings, not numbers).
	if limit := cmp.Or(w.cfg.Stream.Limits.MaxAmount, payment.DefaultMaxAmount); r.Amount > limit || r.Amount < -limit {
		r.Amount = 0
	}
	if payment.ValidateMerchant(r.MerchantID) != nil || payment.ValidateKey(r.IdempotencyKey) != nil ||
		redact.ContainsPAN(r.MerchantID) || redact.ContainsPAN(r.IdempotencyKey) || redact.ContainsPAN(r.Currency) {
		return ledger.Refusal{}, false
	}
	return r, true
}
