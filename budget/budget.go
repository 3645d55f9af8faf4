// Package budget is the provider budget every process of a deployment
// shares: the requests per second the fleet (every worker, its reconciler,
// audit) may send to the provider's account, kept as one token bucket that
// a Store shares between processes (budget/pgstore: a row in PostgreSQL),
// and learned from the provider's 429s.
//
// Why PostgreSQL and not NATS: every process that calls the provider
// already holds a PostgreSQL pool and takes its leases' time from the
// database, so the bucket needs no new dependency, no new failure mode and
// no clock of the pods; a grant is one statement that reads and updates
// the row under its lock, atomically, which a JetStream key-value store
// offers only as a compare-and-swap loop that contends under load. The
// cost is one round trip per grant, not per request: a process takes a
// few tokens at a time (a tenth of a second of the fleet's rate at most)
// and spends them locally.
//
// Learning: a 429 whose Stripe-Rate-Limited-Reason ends in "-rate" (or
// none) lowers the fleet's rate multiplicatively, once per interval for
// the whole fleet however many 429s arrive; a Retry-After stops the whole
// fleet until then; the rate recovers additively towards the configured
// ceiling (PAYDEDUP_PROVIDER_RATE). A "-concurrency" 429 says too many
// calls at once, not too many per second: it is left to the concurrency
// limit and only its Retry-After is honoured here.
package budget

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/paydedup/paydedup/internal/fair"
	"github.com/paydedup/paydedup/provider"
)

// Defaults of Config.
const (
	DefaultName        = "default"
	DefaultGrantPeriod = 100 * time.Millisecond
	DefaultGrantTTL    = time.Second
	DefaultBurst       = 250 * time.Millisecond
	DefaultDecrease    = 0.7
	DefaultInterval    = time.Second
	DefaultFloor       = 1.0
	// DefaultRecovery is how long the rate takes to climb back from
	// nothing to the ceiling: the additive increase is ceiling/recovery
	// per second.
	DefaultRecovery = 30 * time.Second
	// DefaultIncrease is the additive increase, in requests/s per second,
	// when no ceiling is configured.
	DefaultIncrease = 2.0
	// DefaultStoreBackoff is how long the process leaves the store alone
	// after a failed grant, doubled on each failure in a row up to
	// DefaultStoreBackoffMax: a store that is down costs a caller its
	// statement timeout, so only one probe per backoff pays it.
	DefaultStoreBackoff    = time.Second
	DefaultStoreBackoffMax = 30 * time.Second
)

// shareWindow is the time constant of a process's share of the grants,
// as the row's own average of the fleet's (migration 00020).
const shareWindow = 2.0

// ErrInvalidConfig is wrapped by New's configuration errors.
var ErrInvalidConfig = errors.New("invalid provider budget")

// Take asks the shared bucket for up to Want tokens.
type Take struct {
	Name string
	Want float64
	// Ceiling is the configured rate (requests/s); 0 for none.
	Ceiling float64
	// Increase is the additive recovery, in requests/s per second.
	Increase float64
	// Burst is how many seconds of the rate the bucket holds at most.
	Burst float64
}

// Grant is the bucket's answer.
type Grant struct {
	// Tokens granted: 0 when none was free.
	Tokens float64
	// Rate is the fleet's rate now, 0 while nothing limits it.
	Rate float64
	// RetryIn is how long to wait before asking again when Tokens is 0.
	RetryIn time.Duration
}

// Slow records a 429 in the shared bucket.
type Slow struct {
	Name string
	// Lower asks for a multiplicative decrease (a rate reason, or none).
	Lower    bool
	Factor   float64
	Interval time.Duration
	Floor    float64
	// RetryAfter holds the whole fleet back until then; 0 for none.
	RetryAfter time.Duration
}

// Store is where the fleet's bucket lives; budget/pgstore is the
// PostgreSQL one. Its time is its own (the database's), never the pods'.
type Store interface {
	Take(ctx context.Context, t Take) (Grant, error)
	Slow(ctx context.Context, s Slow) (rate float64, lowered bool, err error)
}

// Config configures a Budget; zero values take the defaults.
type Config struct {
	// Name is the bucket's name: one per provider account.
	Name string
	// Rate is the fleet's ceiling in requests/s (PAYDEDUP_PROVIDER_RATE):
	// the account's limit less what other services use. 0: no configured
	// ceiling; the budget still learns from 429s.
	Rate float64
	// GrantPeriod is how much of the fleet's rate one grant takes at most:
	// a grant of rate × GrantPeriod tokens saves a round trip per request.
	GrantPeriod time.Duration
	// GrantTTL is how long granted tokens may be spent; later they are
	// dropped, so that a process cannot hoard a burst.
	GrantTTL time.Duration
	// Burst is how many seconds of the rate the shared bucket holds.
	Burst time.Duration
	// Decrease is the multiplicative decrease on a 429 (0..1), at most
	// once per Interval for the fleet; Floor is the lowest rate.
	Decrease float64
	Interval time.Duration
	Floor    float64
	// Increase is the additive recovery in requests/s per second; default
	// Rate/DefaultRecovery, or DefaultIncrease without a ceiling.
	Increase float64
	// StoreBackoff and StoreBackoffMax: how long the store is left alone
	// after a failed grant, doubling up to the max, while the process
	// paces itself (see Budget.Wait).
	StoreBackoff    time.Duration
	StoreBackoffMax time.Duration

	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Validate reports a bad setting by the name of its variable.
func (c Config) Validate() error {
	var errs []error
	if c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) {
		errs = append(errs, fmt.Errorf("%w: PAYDEDUP_PROVIDER_RATE must be a positive number of requests per second, or 0 for none (got %v)", ErrInvalidConfig, c.Rate))
	}
	if c.Decrease < 0 || c.Decrease >= 1 {
		errs = append(errs, fmt.Errorf("%w: the decrease must be within 0..1 (got %v)", ErrInvalidConfig, c.Decrease))
	}
	if c.GrantPeriod < 0 || c.GrantTTL < 0 || c.Burst < 0 || c.Interval < 0 || c.Floor < 0 || c.Increase < 0 ||
		c.StoreBackoff < 0 || c.StoreBackoffMax < 0 {
		errs = append(errs, fmt.Errorf("%w: durations, floor and increase must not be negative", ErrInvalidConfig))
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	c.Name = cmp.Or(c.Name, DefaultName)
	c.GrantPeriod = cmp.Or(c.GrantPeriod, DefaultGrantPeriod)
	c.GrantTTL = cmp.Or(c.GrantTTL, DefaultGrantTTL)
	c.Burst = cmp.Or(c.Burst, DefaultBurst)
	c.Decrease = cmp.Or(c.Decrease, DefaultDecrease)
	c.Interval = cmp.Or(c.Interval, DefaultInterval)
	c.Floor = cmp.Or(c.Floor, DefaultFloor)
	c.StoreBackoff = cmp.Or(c.StoreBackoff, DefaultStoreBackoff)
	c.StoreBackoffMax = max(c.StoreBackoff, cmp.Or(c.StoreBackoffMax, DefaultStoreBackoffMax))
	if c.Increase == 0 {
		c.Increase = DefaultIncrease
		if c.Rate > 0 {
			c.Increase = c.Rate / DefaultRecovery.Seconds()
		}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Budget is one process's view of the fleet's budget: it takes grants
// from the Store and spends them on the provider calls of this process.
// It is safe for concurrent use.
type Budget struct {
	cfg     Config
	store   Store
	metrics *metrics

	mu        sync.Mutex
	tokens    float64
	until     time.Time     // the grant's tokens may be spent until then
	unlimited bool          // the last grant said nothing limits the fleet
	rate      float64       // the fleet's rate at the last grant
	taking    chan struct{} // closed when the grant under way ends
	// waiters are the callers waiting for a token, served round robin by
	// merchant.
	waiters fair.Queue
	slowed  time.Time // the last 429 sent to the store
	// notBefore: the last grant was empty; no caller asks again before
	// then, so that a starved process asks once per RetryIn, not once per
	// caller.
	notBefore time.Time
	// share is this process's grants, tokens/s averaged over shareWindow
	// as of shareAt: its part of the fleet's rate, which it keeps while
	// the store is down.
	share   float64
	shareAt time.Time

	fallback  *rate.Limiter // while the store cannot be reached
	storeDown bool
	downUntil time.Time     // the store is left alone until then
	backoff   time.Duration // the last backoff, doubled on each failure
}

// New returns a budget on store.
func New(store Store, cfg Config) (*Budget, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidConfig)
	}
	cfg = cfg.withDefaults()
	b := &Budget{cfg: cfg, store: store, metrics: newMetrics(cfg.Registerer), rate: cfg.Rate}
	b.metrics.rate.Set(cfg.Rate)
	return b, nil
}

// Wait takes one token of the fleet's budget for a call of merchant,
// waiting for it as long as ctx allows. The callers that wait are served
// round robin by merchant, FIFO within one (fair.Queue), as the worker's
// call slots are: a merchant whose calls fill the wait does not stand in
// front of another's few. When the token cannot come before ctx's
// deadline it returns at once a rate-limit *provider.Error
// (RateLimitReason ReasonBudget, ClassRetryable: nothing was sent) whose
// RetryAfter says when to ask again; the caller waits that out as it
// waits out a provider's 429. The time it waited is added to ctx's
// recorder (WithWaitRecorder).
func (b *Budget) Wait(ctx context.Context, merchant string) error {
	start := time.Now()
	err := b.wait(ctx, merchant)
	end := time.Now()
	b.metrics.waited.Observe(end.Sub(start).Seconds())
	record(ctx, start, end, err != nil)
	return err
}

func (b *Budget) wait(ctx context.Context, merchant string) error {
	b.mu.Lock()
	if b.waiters.Len() == 0 && b.spendLocked(time.Now()) {
		b.mu.Unlock()
		return nil
	}
	// In line: tokens go to the callers in line by handOutLocked, in turn.
	ready := make(chan struct{})
	b.waiters.Push(merchant, ready)
	leave := func() bool { return b.waiters.Remove(merchant, ready) }
	// The line's order is the oldest first: a caller waits for its token
	// (in line, asking the store, or at the local limiter) half the time
	// its deadline leaves at most, until giveUpAt, then is refused
	// (nothing sent), rather than be served late and have its request
	// time out, an unknown outcome.
	var giveUp <-chan time.Time
	var giveUpAt time.Time // zero: no deadline
	if dl, ok := ctx.Deadline(); ok {
		now := time.Now()
		giveUpAt = now.Add(dl.Sub(now) / 2)
		t := time.NewTimer(giveUpAt.Sub(now))
		defer t.Stop()
		giveUp = t.C
	}
	for {
		now := time.Now()
		if !giveUpAt.IsZero() && !now.Before(giveUpAt) {
			if !leave() && !b.unlimited {
				// Granted after its giveUp: the token goes to the next
				// in line, which has the time to spend it.
				b.tokens++
			}
			b.handOutLocked(now)
			retry := b.retryInLocked(now)
			b.mu.Unlock()
			return budgetError(retry, nil)
		}
		b.handOutLocked(now)
		select {
		case <-ready:
			b.mu.Unlock()
			return nil
		default:
		}
		if now.Before(b.downUntil) || (b.storeDown && b.taking != nil) {
			// The store failed lately, or one caller probes it: the
			// others spend from the local limiter rather than each pay
			// a statement timeout.
			leave()
			lim := b.fallback
			b.mu.Unlock()
			return waitLimiter(ctx, lim, giveUpAt)
		}
		var wake <-chan struct{} // the grant under way ends
		var sleep time.Duration
		switch {
		case now.Before(b.notBefore):
			// The last grant was empty: nobody asks again before then.
			sleep = b.notBefore.Sub(now)
			if !giveUpAt.IsZero() && b.notBefore.After(giveUpAt) {
				// A wait that left the call too little of its timeout
				// would turn a request never sent into a timeout, an
				// unknown outcome.
				leave()
				b.mu.Unlock()
				return budgetError(sleep, nil)
			}
		case b.taking != nil:
			wake = b.taking
		default:
			if err := ctx.Err(); err != nil {
				// Gone: no grant for a caller that would not spend it.
				leave()
				b.mu.Unlock()
				return budgetError(0, err)
			}
			if lim, err := b.takeLocked(ctx, giveUpAt); err != nil {
				if !leave() {
					// Granted meanwhile from what was left: the top of
					// the loop hands it over, or back after giveUpAt.
					continue
				}
				b.mu.Unlock()
				return waitLimiter(ctx, lim, giveUpAt)
			}
			// The grant may have come after giveUpAt: the top of the
			// loop hands it to the line then.
			continue
		}
		b.mu.Unlock()
		var timer *time.Timer
		var fired <-chan time.Time
		if sleep > 0 {
			timer = time.NewTimer(sleep)
			fired = timer.C
		}
		select {
		case <-ready:
			stopTimer(timer)
			if giveUpAt.IsZero() || time.Now().Before(giveUpAt) {
				return nil
			}
			// Granted after its giveUp: given back at the top of the loop.
		case <-wake:
		case <-fired:
		case <-giveUp: // refused at the top of the loop
		case <-ctx.Done():
			stopTimer(timer)
			b.mu.Lock()
			if !leave() && !b.unlimited {
				// Granted as ctx ended: the token goes to the next in line.
				b.tokens++
				b.handOutLocked(time.Now())
			}
			b.mu.Unlock()
			return budgetError(0, ctx.Err())
		}
		stopTimer(timer)
		b.mu.Lock()
	}
}

// retryInLocked is when a caller refused for its deadline may ask
// again: when the store may be asked again, or the time the fleet's rate
// takes to serve the line.
func (b *Budget) retryInLocked(now time.Time) time.Duration {
	if now.Before(b.notBefore) {
		return b.notBefore.Sub(now)
	}
	if b.rate > 0 {
		return time.Duration(float64(b.waiters.Len()+1) / b.rate * float64(time.Second))
	}
	return time.Millisecond
}

// spendLocked takes a token of the last grant if one is left, or passes
// while nothing limits the fleet.
func (b *Budget) spendLocked(now time.Time) bool {
	if !now.Before(b.until) {
		return false
	}
	if b.unlimited {
		return true
	}
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	return false
}

// handOutLocked gives the tokens left to the callers in line, in turn.
func (b *Budget) handOutLocked(now time.Time) {
	for b.waiters.Len() > 0 && b.spendLocked(now) {
		w, _ := b.waiters.Pop()
		close(w)
	}
}

// takeLocked asks the store for a grant, with mu released meanwhile and
// every other caller waiting for its end. The asking caller is held to
// its giveUp (when not zero) as the callers in line are: a grant slower
// than that is cut, and counts as the store's failure (the next caller
// would wait as long). On the store's failure it returns the local
// limiter to pace the caller with.
func (b *Budget) takeLocked(ctx context.Context, giveUp time.Time) (*rate.Limiter, error) {
	ch := make(chan struct{})
	b.taking = ch
	want := b.wantLocked()
	b.mu.Unlock()

	tctx := ctx
	if !giveUp.IsZero() {
		var cancel context.CancelFunc
		tctx, cancel = context.WithDeadline(ctx, giveUp)
		defer cancel()
	}
	g, err := b.store.Take(tctx, Take{Name: b.cfg.Name, Want: want, Ceiling: b.cfg.Rate,
		Increase: b.cfg.Increase, Burst: b.cfg.Burst.Seconds()})

	b.mu.Lock()
	b.taking = nil
	close(ch)
	if err != nil {
		return b.fallbackLocked(err), err
	}
	if b.storeDown {
		b.storeDown = false
		b.cfg.Logger.Info("provider budget: store reachable again")
	}
	b.backoff, b.downUntil = 0, time.Time{}
	b.unlimited = g.Rate == 0 && g.Tokens > 0
	b.rate = g.Rate
	b.metrics.rate.Set(g.Rate)
	now := time.Now()
	b.share = b.shareLocked(now) + g.Tokens/shareWindow
	b.shareAt = now
	b.tokens, b.until = g.Tokens, now.Add(b.cfg.GrantTTL)
	if b.unlimited {
		// Nothing limits the fleet until a 429 anywhere lowers the
		// rate: ask again soon, so that every process hears of it.
		b.until = now.Add(min(b.cfg.GrantTTL, b.cfg.GrantPeriod))
	}
	if g.Tokens == 0 {
		b.notBefore = now.Add(max(g.RetryIn, time.Millisecond))
	}
	return nil, nil
}

func stopTimer(t *time.Timer) {
	if t != nil {
		t.Stop()
	}
}

// waitLimiter takes a token of the local limiter, or returns at once the
// budget's rate limit when the token would come after giveUp (when not
// zero). It reserves nothing it does not wait for: a reservation
// cancelled gives its token back only approximately, and callers near
// their deadline would cancel one per try.
func waitLimiter(ctx context.Context, lim *rate.Limiter, giveUp time.Time) error {
	wctx := ctx
	if !giveUp.IsZero() {
		var cancel context.CancelFunc
		wctx, cancel = context.WithDeadline(ctx, giveUp)
		defer cancel()
	}
	if err := lim.Wait(wctx); err != nil {
		if ctx.Err() != nil {
			return budgetError(0, ctx.Err())
		}
		retry := time.Second
		if l := float64(lim.Limit()); l > 0 {
			retry = time.Duration(max(0, 1-lim.Tokens()) / l * float64(time.Second))
		}
		return budgetError(retry, nil)
	}
	return nil
}

// shareLocked is this process's share of the grants at now.
func (b *Budget) shareLocked(now time.Time) float64 {
	if b.shareAt.IsZero() {
		return 0
	}
	return b.share * math.Exp(-now.Sub(b.shareAt).Seconds()/shareWindow)
}

// wantLocked is the size of the next grant: a token per caller in line,
// at most GrantPeriod of the fleet's rate (with no rate known, a few).
func (b *Budget) wantLocked() float64 {
	limit := 8.0
	if b.rate > 0 {
		limit = max(1, math.Floor(b.rate*b.cfg.GrantPeriod.Seconds()))
	}
	return min(float64(max(1, b.waiters.Len())), limit)
}

// fallbackLocked is the limiter used while the store cannot be reached,
// and leaves the store alone for the next backoff. The provider's limit
// does not pause with PostgreSQL, but this process no longer hears of the
// others: it keeps its own part of the fleet's last rate, the tokens it
// was granted lately (averaged over shareWindow), and never more than
// half that rate, so that the fleet stays near its budget rather than
// send the whole rate from every process. Half is a margin for what a
// process cannot know alone: the row does not count the processes (one
// that took the whole rate lately may share it with one that was idle),
// and granted tokens may have lapsed unspent. Without any rate known
// (nothing limited the fleet) it lets calls through.
func (b *Budget) fallbackLocked(err error) *rate.Limiter {
	now := time.Now()
	b.backoff = min(b.cfg.StoreBackoffMax, max(b.cfg.StoreBackoff, 2*b.backoff))
	b.downUntil = now.Add(b.backoff)
	b.metrics.storeErrors.Inc()
	if b.storeDown {
		// The pace was set when the store went down: what this process
		// was granted since is nothing.
		return b.fallback
	}
	b.storeDown = true
	r := rate.Inf
	if b.rate > 0 {
		r = rate.Limit(max(b.cfg.Floor, min(b.rate/2, b.shareLocked(now))))
	}
	burst := 1 // unused by an infinite limit
	if r != rate.Inf {
		burst = max(1, int(float64(r)*b.cfg.Burst.Seconds()))
	}
	if b.fallback == nil {
		b.fallback = rate.NewLimiter(r, burst)
	} else {
		b.fallback.SetLimit(r)
		b.fallback.SetBurst(burst)
	}
	b.cfg.Logger.Warn("provider budget: store unreachable; pacing this process alone at its share of the last known rate",
		"rate", b.rate, "share", float64(r), "retry_in", b.backoff.String(), "error", err)
	return b.fallback
}

// budgetError is the rate limit of the budget itself: nothing was sent.
func budgetError(retryAfter time.Duration, err error) error {
	return &provider.Error{Class: provider.ClassRetryable, Code: "rate_limit", RateLimitReason: provider.ReasonBudget,
		RetryAfter: retryAfter, Message: "provider budget: no token before the deadline", Err: err}
}

// Observe learns from a provider call's error: a provider's 429 is
// counted by reason, and a rate reason (or none) lowers the fleet's rate,
// a Retry-After holds the fleet back. The store is told at most once per
// Interval by this process (the store itself lowers at most once per
// Interval for the fleet), except for a Retry-After, always passed on.
func (b *Budget) Observe(ctx context.Context, err error) {
	rl := provider.RateLimitOf(err)
	if rl == nil || rl.RateLimitReason == provider.ReasonBudget {
		return
	}
	reason := cmp.Or(rl.RateLimitReason, "none")
	b.metrics.limited.WithLabelValues(reasonLabel(reason)).Inc()
	if rl.RateLimitReason == "" {
		// Not known to be one of the account's limiters: Stripe names the
		// limiter of every rate-limit 429 (Stripe-Rate-Limited-Reason). The
		// payment waits its own Retry-After under its lease; the fleet keeps
		// its pace, or 429s that come whatever the rate (an injected fault,
		// a proxy's) would slow it to its floor and hold it there.
		return
	}
	lower := !strings.HasSuffix(rl.RateLimitReason, "-concurrency")
	b.mu.Lock()
	now := time.Now()
	tell := rl.RetryAfter > 0 || (lower && now.Sub(b.slowed) >= b.cfg.Interval)
	if tell {
		b.slowed = now
		// This process's tokens were granted at the old rate.
		b.tokens = min(b.tokens, 1)
	}
	if tell && now.Before(b.downUntil) {
		// The store is left alone: the process lowers its own pace
		// instead, as the store would the fleet's.
		if lower && b.fallback.Limit() != rate.Inf {
			b.fallback.SetLimit(rate.Limit(max(b.cfg.Floor, float64(b.fallback.Limit())*b.cfg.Decrease)))
		}
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	if !tell {
		return
	}
	r, lowered, serr := b.store.Slow(context.WithoutCancel(ctx), Slow{Name: b.cfg.Name, Lower: lower, Factor: b.cfg.Decrease,
		Interval: b.cfg.Interval, Floor: b.cfg.Floor, RetryAfter: rl.RetryAfter})
	if serr != nil {
		b.cfg.Logger.Warn("provider budget: could not record a 429", "reason", reason, "error", serr)
		return
	}
	if lowered {
		b.mu.Lock()
		b.rate = r
		b.unlimited = false
		b.mu.Unlock()
		b.metrics.rate.Set(r)
		b.cfg.Logger.Info("provider budget: rate lowered after a 429", "reason", reason, "rate", r, "retry_after", rl.RetryAfter.String())
	}
}

// reasonLabel bounds the reason label to Stripe's documented reasons.
func reasonLabel(r string) string {
	switch r {
	case provider.ReasonGlobalRate, provider.ReasonGlobalConcurrency, provider.ReasonEndpointRate,
		provider.ReasonEndpointConcurrency, provider.ReasonResourceSpecific, "none":
		return r
	}
	return "other"
}

// Waiting is how many calls of this process wait for a token.
func (b *Budget) Waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waiters.Len()
}

// Rate is the fleet's rate as this process last learned it; 0 while
// nothing limits the fleet.
func (b *Budget) Rate() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rate
}
