package consumer

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/paydedup/paydedup/internal/fair"
	"github.com/paydedup/paydedup/provider"
)

// The call limit's constants (see callLimit).
const (
	// MinConcurrency is the floor of the call limit (or the ceiling, when
	// Concurrency is set lower): what the limit shrinks to at most.
	MinConcurrency = 16
	// initialLimit is the limit a worker starts with (or the ceiling, when
	// lower): the old fixed default, from which it grows.
	initialLimit = 64
	// limitTolerance is how far the window's mean latency may rise above
	// the no-load latency before the limit shrinks (the provider queues our
	// calls); limitSlack is added to it so that a provider answering in
	// microseconds (the in-process bench) is not read as queueing on
	// scheduling noise.
	limitTolerance = 1.5
	limitSlack     = 2 * time.Millisecond
	// limitBackoff is the multiplicative decrease on a timeout, an unknown
	// outcome or a concurrency 429, at most once for the calls in flight at
	// the last cut.
	limitBackoff = 0.75
	// A window lasts at least the no-load latency and minWindow, and holds
	// at least minSamples answers: the mean of fewer is too noisy, with the
	// long tail a provider's latency has, to tell queueing from chance.
	minWindow  = 100 * time.Millisecond
	minSamples = 128
	// noLoadEpoch is how long a minimum of window latencies stands as the
	// no-load latency: it is the least of the current and the last epoch's.
	// Long, so that it does not creep up with a queue the limit keeps; a
	// provider that became slower for everyone is accepted sooner, when a
	// cut of the limit did not bring its latency down.
	noLoadEpoch = 5 * time.Minute
	// fastAgain is how long after the last cut the limit may grow fast
	// again past it: the provider may have changed.
	fastAgain = time.Minute
)

// WaitBehindMerchant is the cause a worker notes for the gateway (beside
// the pauses' and WaitRateLimited, see PauseNoter) while it works but its
// payments wait behind another merchant's: payments of more than one
// merchant wait for a call slot, each served in turn while the others'
// calls are granted, or lanes are open, so merchants' commands are stored
// behind another merchant's backlog. It is no pause.
const WaitBehindMerchant = "behind_another_merchant"

// errLimitWait is returned by acquire when its context ended first.
var errLimitWait = errors.New("no provider call slot")

// callLimit is the adaptive number of provider calls in flight, between a
// floor and a ceiling (Concurrency). It is a gradient limit in the manner of
// Netflix's Gradient2 and Envoy's adaptive concurrency, measured per window
// of about one round trip, with TCP's slow start and AIMD around it: while
// the window's mean latency stays within 1.5 times the no-load latency (the
// least window mean of the last 5–10 minutes, as TCP Vegas's base RTT and
// BBR's min RTT) and calls waited for a slot, it grows (doubling up to the
// last cut, by its square root past it); when latency climbs past that, it
// shrinks back to where the provider does not queue; on a timeout, an
// unknown outcome or a concurrency 429 it is cut by a quarter at once. Not
// a library: none of the Go ports of concurrency-limits is kept here, and
// this is small. Windows, not single samples: a provider's latency has a
// long tail (p99 three times the median), and one slow answer is no sign of
// queueing while a window's mean is.
//
// Its wait is fair between merchants (fair.Queue): the payments waiting for
// a slot are served round robin by merchant, FIFO within one, so that one
// merchant's backlog does not stand in front of another's few payments.
// Its state is behind one mutex taken twice a call.
type callLimit struct {
	floor, ceiling int
	now            func() time.Time

	mu       sync.Mutex
	limit    float64
	inflight int
	waiters  fair.Queue
	room     chan struct{} // closed when at most roomFor calls wait (waitRoom)
	roomFor  int
	peak     int // most calls in flight at once since the start

	win struct {
		start  time.Time
		sum    time.Duration
		n      int
		waited bool // a call waited for a slot, or found none free
		// held: a call waited for the fleet's budget or a rate limit while
		// holding its slot. More slots would only add waiters there, ahead
		// of the payments waiting fairly for a slot: the limit does not
		// grow, and comes down to 1.5 times the calls the budget lets through.
		held   bool
		settle bool // the limit changed as it started: no decision on it
	}
	cutAt           time.Time     // the last cut (on latency or a drop)
	threshold       float64       // the limit after the last cut
	cutMean         time.Duration // the latency that made the last decision a cut; 0 if it was none
	curMin, prevMin time.Duration // least window means of this and the last epoch
	epochStart      time.Time
	latency         time.Duration // the last window's mean
}

// newCallLimit returns a limit between min(MinConcurrency, ceiling) and
// ceiling, starting at min(initialLimit, ceiling). now is the clock windows
// are measured with (time.Now in production; tests drive a fake one).
func newCallLimit(ceiling int, now func() time.Time) *callLimit {
	ceiling = max(ceiling, 1)
	l := &callLimit{floor: min(MinConcurrency, ceiling), ceiling: ceiling, now: now,
		limit: float64(min(initialLimit, ceiling))}
	t := now()
	l.win.start, l.epochStart = t, t
	return l
}

// acquire takes a call slot for a payment of merchant, waiting in the
// merchant's line for one while the limit is reached; it returns
// errLimitWait (wrapping ctx's error) if ctx ends first.
func (l *callLimit) acquire(ctx context.Context, merchant string) error {
	l.mu.Lock()
	if l.take() {
		l.mu.Unlock()
		return nil
	}
	ready := make(chan struct{})
	l.waiters.Push(merchant, ready)
	l.mu.Unlock()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.waiters.Remove(merchant, ready) {
		l.grant()
		return errors.Join(errLimitWait, ctx.Err())
	}
	// Granted as ctx ended: the slot is ours, so give it back.
	l.inflight--
	l.grant()
	return errors.Join(errLimitWait, ctx.Err())
}

// take takes a free slot if there is one and no call waits for it, and
// otherwise marks the window as one where calls waited. Call with mu held.
func (l *callLimit) take() bool {
	if l.waiters.Len() == 0 && l.inflight < int(l.limit) {
		l.inflight++
		l.peak = max(l.peak, l.inflight)
		return true
	}
	l.win.waited = true
	return false
}

// callSignal is what one call's end tells the limit.
type callSignal int

const (
	// signalIgnore: the call says nothing about the provider's load (a
	// rate 429, a refusal, a call cut short by us).
	signalIgnore callSignal = iota
	// signalAnswer: the provider answered; its latency is a sample.
	signalAnswer
	// signalDrop: a timeout, an unknown outcome or a concurrency 429.
	signalDrop
)

// signalOf is what a call that ended with err tells the limit. A call
// whose context was cancelled was cut short by us (a drain, a lost lease),
// which says nothing; one whose deadline passed timed out.
func signalOf(ctx context.Context, err error) callSignal {
	if err == nil {
		return signalAnswer
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return signalIgnore
	}
	var perr *provider.Error
	if errors.As(err, &perr) && perr.HTTPStatus == 429 {
		// Stripe's concurrency limiter (…-concurrency): too many calls at
		// once. A rate 429 is the rate budget's business, not ours.
		if strings.HasSuffix(perr.RateLimitReason, "-concurrency") {
			return signalDrop
		}
		return signalIgnore
	}
	if provider.ClassOf(err) == provider.ClassUnknown {
		return signalDrop
	}
	return signalIgnore
}

// release gives back a slot taken by acquire, telling the limit how the
// call ended and how long it took.
func (l *callLimit) release(took time.Duration, s callSignal) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight--
	switch s {
	case signalAnswer:
		l.win.sum += took
		l.win.n++
		l.endWindow(l.now())
	case signalDrop:
		// At once, and once for the calls in flight at the last cut (as
		// TCP's once a round trip): a concurrency 429 comes back fast, and
		// each would free a slot for the next call to be refused too.
		if now := l.now(); !now.Add(-took).Before(l.cutAt) {
			l.set(l.limit * limitBackoff)
			l.cutAt, l.threshold = now, l.limit
			l.newWindow(now, true)
		}
	}
	l.grant()
}

// heldBack tells the limit a call held its slot while the fleet's budget
// or a provider's rate limit held it back for waited (all of it, for a
// rate-limited call: waited < 0). A wait longer than a quarter of the
// no-load latency (and limitSlack, the grant's own round trip) marks the
// window: the budget, not the provider's concurrency, bounds the calls,
// and the limit stays where it is. Grown past what the budget serves, it
// would let the calls of a merchant with a backlog wait at the budget in
// slots, where the wait is a free-for-all, rather than in the fair line
// for a slot.
func (l *callLimit) heldBack(waited time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if waited < 0 || waited > max(limitSlack, l.noLoad()/4) {
		l.win.held = true
	}
}

// grant hands free slots to the waiters in line. Call with mu held.
func (l *callLimit) grant() {
	for l.waiters.Len() > 0 && l.inflight < int(l.limit) {
		w, _ := l.waiters.Pop()
		close(w)
		l.inflight++
		l.peak = max(l.peak, l.inflight)
	}
	if l.room != nil && l.waiters.Len() <= l.roomFor {
		close(l.room)
		l.room = nil
	}
}

// waitRoom waits while more than most claimed payments wait for a call
// slot, or until ctx ends. The worker fetches no more meanwhile: its
// messages would only wait in line, their leases held, and past the call
// budget be released and nakked, a delivery spent. One caller at a time.
func (l *callLimit) waitRoom(ctx context.Context, most int) {
	l.mu.Lock()
	for l.waiters.Len() > most {
		if l.room == nil {
			l.room = make(chan struct{})
		}
		room := l.room
		l.roomFor = most
		l.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return
		}
		l.mu.Lock()
	}
	l.mu.Unlock()
}

// set sets the limit within its floor and ceiling. Call with mu held.
func (l *callLimit) set(limit float64) {
	l.limit = min(max(limit, float64(l.floor)), float64(l.ceiling))
}

// newWindow starts a window; settle makes it one that only measures (the
// calls it sees ran partly under the limit before). Call with mu held.
func (l *callLimit) newWindow(now time.Time, settle bool) {
	l.win.start, l.win.sum, l.win.n, l.win.waited, l.win.held, l.win.settle = now, 0, 0, false, false, settle
}

// endWindow closes the window if it is long and full enough, and moves the
// limit by what it saw. Call with mu held.
func (l *callLimit) endWindow(now time.Time) {
	since := now.Sub(l.win.start)
	if since < max(minWindow, l.noLoad()) {
		return
	}
	if l.win.settle {
		// It lasts until the calls started under the limit before have
		// ended (most within one and a half of the last mean latency):
		// then the next window measures the limit now.
		if since < l.latency*3/2 {
			return
		}
		if l.win.n < minSamples {
			l.newWindow(now, false)
			return
		}
	}
	if l.win.n < minSamples {
		return
	}
	mean := l.win.sum / time.Duration(l.win.n)
	l.latency = mean
	if now.Sub(l.epochStart) >= noLoadEpoch {
		l.prevMin, l.curMin, l.epochStart = l.curMin, 0, now
	}
	if l.curMin == 0 || mean < l.curMin {
		l.curMin = mean
	}
	noLoad := l.noLoad()
	limit := l.limit
	bound := time.Duration(float64(noLoad)*limitTolerance) + limitSlack
	// Fast growth only up to the limit of the last cut (TCP's slow-start
	// threshold), or a minute after it: past it the limit stands near what
	// the provider takes, and grows by its square root, so that each probe
	// above it costs few queued or refused calls.
	fast := limit < l.threshold || now.Sub(l.cutAt) >= fastAgain
	switch {
	case l.win.settle:
	case mean > bound && l.cutMean > 0 && mean >= l.cutMean*9/10:
		// The last cut did not bring latency down: the provider is slower
		// for everyone, not queueing our calls. Its latency now is the
		// no-load one.
		l.curMin, l.prevMin, l.epochStart, l.cutMean = mean, 0, now, 0
	case mean > bound:
		// Back to where the provider does not queue (not to the bound): a
		// limit held at the bound would never show the no-load latency
		// again.
		limit *= max(0.5, float64(noLoad+limitSlack)/float64(mean))
		l.cutAt, l.threshold, l.cutMean = now, limit, mean
	case l.win.held:
		// The budget lets through what the window's answers show: by
		// Little's law they kept win.sum/since calls at the provider.
		// Half again as many (and the floor) keep the budget the bound, and no
		// more payments than that wait for it in slots.
		l.cutMean = 0
		limit = min(limit, max(1.5*float64(l.win.sum)/float64(since)+1, float64(l.floor)))
	case l.win.waited && fast && mean <= noLoad+(bound-noLoad)/2:
		l.cutMean = 0
		limit *= 2
	case l.win.waited:
		l.cutMean = 0
		limit += math.Sqrt(limit)
	default:
		l.cutMean = 0
	}
	old := l.limit
	l.set(limit)
	l.newWindow(now, l.limit != old)
}

// noLoad is the no-load latency: the least window mean of this epoch and
// the last. Call with mu held.
func (l *callLimit) noLoad() time.Duration {
	switch {
	case l.prevMin == 0:
		return l.curMin
	case l.curMin == 0:
		return l.prevMin
	}
	return min(l.curMin, l.prevMin)
}

// merchantsWaiting is the number of merchants with payments waiting for
// a call slot.
func (l *callLimit) merchantsWaiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiters.Merchants()
}

// CallLimit is a snapshot of the adaptive provider call limit.
type CallLimit struct {
	Limit, Floor, Ceiling int
	InFlight              int           // provider calls in flight now
	Peak                  int           // most calls in flight at once since the start
	Waiting               int           // claimed payments waiting for a call slot
	MerchantsWaiting      int           // merchants with payments waiting for a call slot
	Latency               time.Duration // the last window's mean call latency
	NoLoad                time.Duration // the no-load latency the limit compares it with
}

func (l *callLimit) snapshot() CallLimit {
	l.mu.Lock()
	defer l.mu.Unlock()
	return CallLimit{Limit: int(l.limit), Floor: l.floor, Ceiling: l.ceiling, InFlight: l.inflight, Peak: l.peak,
		Waiting: l.waiters.Len(), MerchantsWaiting: l.waiters.Merchants(), Latency: l.latency, NoLoad: l.noLoad()}
}

// CallLimit reports the provider call limit: where it stands, the calls in
// flight and the latencies it moves by.
func (p *Processor) CallLimit() CallLimit { return p.calls.snapshot() }
