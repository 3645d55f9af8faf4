package consumer

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
)

// errStopping ends a rate-limited payment's wait when the worker stops.
var errStopping = errors.New("worker stopping")

// WaitRateLimited is the cause a worker notes for the gateway (beside the
// pauses', see PauseNoter) while it works but payments wait for the
// provider's rate limit or the fleet's provider budget. It is no pause:
// the worker fetches, its readiness holds, and paydedup_worker_paused does
// not count it.
const WaitRateLimited = "rate_limited"

// rateWaits counts the payments waiting for a rate limit or the budget,
// and since when some have been.
type rateWaits struct {
	mu    sync.Mutex
	n     int
	since time.Time
}

// add moves the count by delta (±1); now is the worker's clock.
func (r *rateWaits) add(delta int, now func() time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == 0 && delta > 0 {
		r.since = now()
	}
	r.n += delta
}

// RateLimited reports how many payments wait for the provider's rate
// limit or the fleet's budget (under their leases), and since when some
// have been waiting.
func (p *Processor) RateLimited() (n int, since time.Time) {
	p.waits.mu.Lock()
	defer p.waits.mu.Unlock()
	return p.waits.n, p.waits.since
}

// errWaitBounded ends a payment's wait under its lease (for a call slot,
// for a rate limit) at MaxWaitUnderLease after its claim: a call later
// than that could come after the provider forgot the key.
var errWaitBounded = errors.New("waited the longest a payment may under one claim")

// stopping reports whether the worker is stopping.
func (p *Processor) stopping() bool {
	select {
	case <-p.stop:
		return true
	default:
		return false
	}
}

// errLeaseLost is a lease found lost by the heartbeat of a call.
var errLeaseLost = errors.New("lease lost")

// detach returns a context with ctx's values and its cancellation (a
// drain), but not its deadline (the batch's call budget): the waits of a
// payment under its lease outlive the batch. Once ctx's deadline passed,
// ctx can no longer tell a drain: the worker's work context (p.work, the
// batch's parent) still does, so a drain past its deadline cancels the
// calls begun after the batch's deadline too.
func (p *Processor) detach(ctx context.Context) (context.Context, context.CancelFunc) {
	base, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel()
		}
	})
	stopWork := func() bool { return false }
	if p.work != nil {
		stopWork = context.AfterFunc(p.work, cancel)
	}
	return base, func() { stop(); stopWork(); cancel() }
}

// slotUnderLease waits for a provider call slot when the batch's deadline
// passed first: the slots are held by calls waiting for a rate limit or
// the fleet's budget, and this payment's turn comes with theirs. Every
// third of the lease it extends the lease and the message's AckWait, and
// once it has the slot it heartbeats again, so the call that follows has a
// whole call budget inside the lease. It returns holding the slot, or
// ledger.ErrLeaseLost, a store error, errStopping, ctx's error or, once
// until (the claim's bound, MaxWaitUnderLease) passed, errWaitBounded.
func (p *Processor) slotUnderLease(ctx context.Context, lease *ledger.Lease, merchant string, progress progresser, until time.Time) error {
	p.waits.add(1, p.cfg.Clock.Now)
	defer p.waits.add(-1, p.cfg.Clock.Now)
	beat := func() error {
		if progress != nil {
			_ = progress.InProgress()
		}
		l, err := p.extend(ctx, *lease)
		if err == nil {
			*lease = l
		}
		return err
	}
	if err := beat(); err != nil {
		return err
	}
	for {
		left := until.Sub(p.cfg.Clock.Now()) // until is on the worker's clock
		if left <= 0 {
			return errWaitBounded
		}
		// Each wait for a slot lasts a third of the lease at most, then the
		// lease and the message are extended; a stop ends it.
		wctx, cancel := context.WithTimeout(ctx, min(p.cfg.Lease/3, left))
		done := make(chan struct{})
		go func() {
			select {
			case <-p.stop:
				cancel()
			case <-done:
			}
		}()
		err := p.calls.acquire(wctx, merchant)
		close(done)
		cancel()
		if err == nil && p.stopping() {
			// The slot came with the stop: no new call during the drain.
			p.calls.release(0, signalIgnore)
			return errStopping
		}
		if err == nil {
			if err := beat(); err != nil {
				p.calls.release(0, signalIgnore)
				return err
			}
			return nil
		}
		select {
		case <-p.stop:
			return errStopping
		default:
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if !p.cfg.Clock.Now().Before(until) {
			return errWaitBounded
		}
		if err := beat(); err != nil {
			return err
		}
	}
}

// rateLimited calls the provider again, under the same lease, while it
// answers err, a rate limit (provider.RateLimitOf): a 429 proves the
// request was not executed and says nothing against the payment or about
// an outage, only that the account asks for fewer requests. So the row is
// neither failed nor released, no delivery is spent and the worker does
// not pause: the payment waits (the provider's Retry-After, else a backoff
// from RetryBase doubling to RetryMax) and calls again with the same
// provider key.
//
// Nothing of the lease nesting changes: each wait is cut in steps of a
// third of the lease, each followed by a heartbeat that extends the lease
// by a whole lease and the message's AckWait (InProgress); a call starts
// only right after such a heartbeat succeeded, under a call budget of its
// own (the lease less a tenth, as the first call). beat is the first
// call's heartbeat, stopped here; the returned beater is the last call's,
// to be stopped by the caller as the first one would have been.
//
// It returns the first answer that is not a rate limit, or the rate limit
// still in hand when the wait ended without a call: the worker stopping, a
// drain cancelling ctx, a heartbeat failing (the lease is then not known
// to outlast a call), or a wait that would end past until (the claim's
// bound, MaxWaitUnderLease: a later call could meet a provider that forgot
// the key). A lost lease is reported by the returned beater, a heartbeat
// that failed by the last value (the store's error).
func (p *Processor) rateLimited(ctx context.Context, beat *beater, req provider.ChargeRequest, err error, progress progresser, log *slog.Logger, until time.Time) (*provider.Outcome, error, *beater, error) {
	// The rounds outlive the batch's deadline (the first call's budget),
	// never a drain's cancellation.
	base, release := p.detach(ctx)
	defer release()
	p.waits.add(1, p.cfg.Clock.Now)
	defer p.waits.add(-1, p.cfg.Clock.Now)

	// An unknown outcome sticks across the calls under this claim, as
	// within one ChargeWithRetry: a call that may have charged is not
	// undone by a later 5xx or refused dial, so the row must be released,
	// never failed.
	unknown := provider.ClassOf(err) == provider.ClassUnknown
	for n := 1; ; n++ {
		rl := provider.RateLimitOf(err)
		if rl == nil {
			return nil, err, beat, nil
		}
		if beat.stop() {
			return nil, err, beat, nil
		}
		lease := beat.current()
		wait := p.rateLimitWait(rl, n)
		if p.cfg.Clock.Now().Add(wait).After(until) {
			log.LogAttrs(ctx, slog.LevelInfo, "provider rate limit outlasts the longest wait under one claim; not calling again under it",
				slog.String("reason", rl.RateLimitReason), slog.Int("round", n), slog.Duration("max_wait_under_lease", p.cfg.MaxWaitUnderLease))
			return nil, err, beat, nil
		}
		log.LogAttrs(ctx, slog.LevelDebug, "provider rate limit; waiting under the lease", slog.String("reason", rl.RateLimitReason),
			slog.Int("round", n), slog.Duration("wait", wait), slog.String("error", err.Error()))
		if werr := p.waitUnderLease(base, &lease, wait, progress); werr != nil {
			if errors.Is(werr, ledger.ErrLeaseLost) {
				beat.markLost()
				log.Warn("lease lost while waiting for the provider's rate limit")
			} else if !errors.Is(werr, errStopping) && base.Err() == nil {
				log.Warn("lease heartbeat failed while waiting for the provider's rate limit; not calling again under it", "error", werr)
				return nil, err, beat, werr
			}
			return nil, err, beat, nil
		}
		if p.stopping() {
			// Stopped between the last heartbeat and the call: no new call
			// during the drain.
			return nil, err, beat, nil
		}
		callCtx, cancel := context.WithTimeout(base, p.callBudget())
		beat = p.heartbeat(callCtx, cancel, lease, progress, log)
		var out *provider.Outcome
		out, err = provider.ChargeWithRetry(callCtx, p.charger, req, p.cfg.ProviderTry)
		cancel()
		if err == nil {
			return out, nil, beat, nil
		}
		if unknown {
			err = provider.AfterUnknown(err)
		}
		unknown = provider.ClassOf(err) == provider.ClassUnknown
	}
}

// rateLimitWait is how long to wait after the n-th rate-limited call in a
// row: the provider's (or the budget's) Retry-After, else RetryBase
// doubling to RetryMax, with a fifth of jitter so that the payments
// refused together do not come back together.
func (p *Processor) rateLimitWait(rl *provider.Error, n int) time.Duration {
	d := rl.RetryAfter
	if d <= 0 {
		d = backoff(uint64(n), p.cfg.RetryBase, p.cfg.RetryMax)
	}
	return d + time.Duration(rand.Int64N(int64(d)/5+1))
}

// waitUnderLease waits d in steps of a third of the lease, and after each
// step extends the lease by a whole lease and tells the message it is in
// progress; it ends with such a heartbeat, so a call may follow. It
// returns ledger.ErrLeaseLost, a store error, errStopping or ctx's error.
func (p *Processor) waitUnderLease(ctx context.Context, lease *ledger.Lease, d time.Duration, progress progresser) error {
	every := p.cfg.Lease / 3
	for {
		step := min(d, every)
		t := time.NewTimer(step)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-p.stop:
			t.Stop()
			return errStopping
		}
		d -= step
		if progress != nil {
			_ = progress.InProgress()
		}
		l, err := p.extend(ctx, *lease)
		if err != nil {
			return err
		}
		*lease = l
		if d <= 0 {
			return nil
		}
	}
}
