package consumer

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// holdInFlight bounds how many times a held message that, run again, meets
// a live lease on its key (its own, from a commit the outage cut short,
// until that lease expires) waits for the lease and runs again, before it
// is settled as any in-flight key: nakked.
const holdInFlight = 3

// hold keeps a message whose work an outage cut short (res.pause: the
// worker is paused) instead of settling it: a nak would bring a
// redelivery, and every delivery spends one of MaxDeliver, so an outage
// longer than the nak schedule would dead-letter every message in hand.
// The message stays in hand (InProgress every third of the lease keeps
// its AckWait from running out; it counts against MaxAckPending like any
// message in hand) until the gate opens or this message is the one to
// probe; then it runs again, from its claim. It returns the result to
// settle: the first that is not cut short by an outage, or the last one
// when the worker stops (a stop settles it as it is: nakked, never acked).
//
// Nothing of the lease nesting changes: a held message holds no lease (its
// row was failed or released, or its lease runs out), and each run takes
// a new claim and a new call budget inside a fresh AckWait.
func (w *Worker) hold(workCtx context.Context, in *inbound, res Result) Result {
	g := w.proc.gate
	g.hold(1)
	defer g.hold(-1)
	log := in.log.logger()
	log.Debug("message held while the worker is paused", "cause", res.pause, "error", errString(res.Err))
	_ = in.msg.InProgress()
	last := time.Now() // the message's AckWait last started
	waits := 0
	for {
		probing := false
		switch {
		case res.held():
			var ok bool
			if ok, probing = w.await(in, &last); !ok {
				return res
			}
		case res.Kind == InFlight && waits < holdInFlight:
			waits++
			if !w.keep(in, &last, res.Delay, nil) {
				return res
			}
		default:
			return res
		}
		res = w.lastDelivery(workCtx, in, w.rerun(workCtx, in))
		last = time.Now()
		if probing {
			g.probed(res.held())
			log.Info("probe after a pause", "cause_after", res.pause, "result", res.Kind.String(), "error", errString(res.Err))
		}
	}
}

// lastDelivery holds the last delivery of a message whose provider call
// ended unavailable while the worker is not paused (too few keys failed
// for the outage rule, see OutageKeys: one payment during an outage) when
// the provider, asked without charging (Processor.providerDown), is down
// too: the worker then pauses, and res is returned cut short by the
// outage, to be held like every message an outage interrupts. An outage
// is no message's fault; settled, res would be dead-lettered
// max_deliveries for an operator to replay. When the provider answers the
// probe the failure is the message's own, and res is returned as it is.
func (w *Worker) lastDelivery(ctx context.Context, in *inbound, res Result) Result {
	if !res.unavailable || res.held() || !lastDelivery(in.meta.NumDelivered, w.cfg.Stream.MaxDeliver) {
		return res
	}
	_ = in.msg.InProgress() // the probe runs inside a fresh AckWait
	down, err := w.proc.providerDown(ctx, in.cmd)
	log := in.log.logger()
	if !down {
		log.Info("last delivery failed while the provider answers a lookup; the failure is the payment's own", "error", errString(res.Err), "lookup_error", errString(err))
		return res
	}
	log.Warn("provider unavailable on a message's last delivery and to a lookup: worker paused, message held", "error", errString(res.Err), "lookup_error", errString(err))
	res.pause = PauseProviderUnavailable
	return res
}

// holdRefusal holds a dead-lettered message whose outcome event r PostgreSQL's
// outage kept from being written, as hold holds a claim cut short by it:
// in hand and in progress until the gate opens or this message is the one
// to probe; then it writes the event again. It returns true once the
// event is written, and false when the worker stops or the write fails
// for another cause (the message is then nakked, as such a failure is at
// once).
func (w *Worker) holdRefusal(ctx context.Context, in *inbound, r ledger.Refusal) bool {
	g := w.proc.gate
	g.hold(1)
	defer g.hold(-1)
	log := in.log.logger()
	_ = in.msg.InProgress()
	last := time.Now()
	for {
		ok, probing := w.await(in, &last)
		if !ok {
			return false
		}
		_ = in.msg.InProgress() // the write runs inside a fresh AckWait
		last = time.Now()
		wctx, cancel := context.WithTimeout(ctx, settleTimeout)
		_, err := w.proc.store.RecordRefusal(wctx, r)
		cancel()
		cause := ""
		if err == nil {
			g.storeWorks()
		} else {
			cause = g.storeFailed(err)
		}
		if probing {
			g.probed(cause != "")
			log.Info("probe after a pause", "cause_after", cause, "result", "refusal_event", "error", errString(err))
		}
		switch {
		case err == nil:
			return true
		case cause == "":
			log.Error("outcome event not written; message nakked, its redelivery writes it", "reason", r.Reason, "error", err)
			return false
		}
	}
}

// await waits while the gate is closed, keeping the message in progress,
// until it opens or the message is the one to probe (probing). It returns
// false when the worker stops.
func (w *Worker) await(in *inbound, last *time.Time) (ok, probing bool) {
	for {
		open, probing, wait, opened := w.proc.gate.probe()
		if open || probing {
			return true, probing
		}
		if !w.keep(in, last, wait, opened) {
			return false, false
		}
	}
}

// keep waits d, or until opened is closed, and tells the server the
// message is in progress every third of the lease. It returns false when
// the worker stops.
//
// d (the rest of a pause, or a lease's Retry-After) is on the worker's
// clock (Config.Clock), as the gate's pauses are: a test moves it. The
// in-progress beat is on the monotonic clock, as the server's AckWait it
// restarts is.
func (w *Worker) keep(in *inbound, last *time.Time, d time.Duration, opened <-chan struct{}) bool {
	every := w.cfg.Lease / 3
	var end clock.Timer
	for {
		now := time.Now()
		if now.Sub(*last) >= every {
			_ = in.msg.InProgress()
			*last = now
		}
		if d <= 0 {
			return true
		}
		if end == nil {
			end = clock.NewTimer(w.cfg.Clock, d)
			defer end.Stop()
		}
		t := time.NewTimer(every - now.Sub(*last))
		select {
		case <-w.stop:
			t.Stop()
			return false
		case <-opened:
			t.Stop()
			return true
		case <-end.C():
			t.Stop()
			return true
		case <-t.C:
		}
	}
}

// rerun runs a held message again from its claim, under a call budget of
// its own (its batch's deadline is long past): its own claim for a kind
// claimed alone (runAlone), the charges' claim for the others.
func (w *Worker) rerun(workCtx context.Context, in *inbound) Result {
	_ = in.msg.InProgress() // the claim's lease nests inside a fresh AckWait
	ctx, cancel := context.WithTimeout(workCtx, w.proc.callBudget())
	defer cancel()
	if in.span != nil {
		ctx = trace.ContextWithSpan(ctx, in.span)
	}
	if claimsAlone(in.cmd) {
		return w.proc.runAlone(ctx, in.cmd, in.log.logger())
	}
	claims, err := w.proc.claim(ctx, []*payment.Command{in.cmd}, []string{in.traceID})
	if err != nil {
		return w.proc.claimFailed(err)
	}
	claim := claims[0]
	if claim.Outcome != ledger.Claimed && claim.Outcome != ledger.Reacquired {
		return w.proc.handle(ctx, in.cmd, claim, nil, in.log.logger())
	}
	w.observer.InFlight(1)
	defer w.observer.InFlight(-1)
	return w.proc.handle(ctx, in.cmd, claim, in.msg, in.log.logger())
}
