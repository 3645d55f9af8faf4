package consumer

import (
	"context"
	"log/slog"
	"time"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/stream"
)

// recordRefusal writes the outcome event of a message the worker
// dead-letters: refused (bad input or a reused key: finalForClient; or a
// refund, capture or cancel the ledger's rules refuse:
// ledger.IsLedgerRefusal), or waiting
// for an operator (every other reason), so a publisher on the stream
// learns why. It runs once the dead
// letter d is filed and before the message is termed, and returns true
// when the message is to be termed now: the event is written, or none can
// be told (refusalOf). Otherwise it settles the message itself:
//
//   - PostgreSQL unreachable: the worker pauses (the gate's storeFailed,
//     as for a claim) and the message is held through the outage like a
//     claim (holdRefusal), then termed once its event is written. Nakked,
//     an outage longer than the nak schedule spent its deliveries and the
//     net filed it max_deliveries, with no event.
//   - any other failure: nakked; its redelivery files the letter again (the
//     DLQ stores one) and writes the event under the same id (the store
//     keeps one).
func (w *Worker) recordRefusal(ctx context.Context, b *batchRefs, in *inbound, act Action, res Result, d stream.Letter, log *slog.Logger) bool {
	r, ok := w.refusalOf(in, act.Reason, d.FailedAt)
	if !ok {
		return true
	}
	_, err := w.proc.store.RecordRefusal(ctx, r)
	if err == nil {
		w.proc.gate.storeWorks()
		return true
	}
	if w.proc.gate.storeFailed(err) == "" {
		log.Error("outcome event not written; message nakked, its redelivery writes it", "reason", act.Reason, "error", err)
		_ = in.msg.NakWithDelay(w.cfg.RetryBase)
		return false
	}
	log.Error("outcome event not written: PostgreSQL unreachable; message held until it answers", "reason", act.Reason, "error", err)
	// A copy: in may be reused by its batch once this returns.
	held := *in
	held.log.init(w.logger, held.meta, held.traceID, held.cmd, res.Attempt)
	b.add()
	go func() {
		defer func() {
			b.release()
			b.wg.Done()
		}()
		if !w.holdRefusal(b.settle, &held, r) {
			_ = held.msg.NakWithDelay(w.cfg.RetryBase)
			return
		}
		sctx, cancel := context.WithTimeout(b.settle, settleTimeout)
		defer cancel()
		w.termLetter(sctx, &held, act.Reason, d.Err, held.log.logger())
		w.settled(&held, res, act)
	}()
	return false
}

// refusalOf is the refusal event of a message refused for reason
// (refusalFor), under its first copy's stream sequence.
func (w *Worker) refusalOf(in *inbound, reason string, filedAt time.Time) (ledger.Refusal, bool) {
	if in.meta == nil {
		return ledger.Refusal{}, false
	}
	return refusalFor(w.cfg.Stream, in.cmd, in.msg.Subject(), in.msg.Headers(), in.msg.Data(), in.meta.Sequence.Stream, reason, filedAt)
}
