package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
)

// Pauses after the provider refuses the API key, and the defaults of
// Config.PauseFirst and Config.PauseLongest: the first pause, doubling on
// each failed probe up to the longest.
const (
	AuthPauseFirst   = 5 * time.Second
	AuthPauseLongest = 5 * time.Minute
)

// The rule that tells an outage from one message's failure: OutageAnswers
// provider calls in a row ended unavailable (429, 5xx, a refused or
// unanswered connection), for at least OutageKeys different keys, with no
// other answer between them. A key that fails alone while others are
// charged never pauses the worker: it keeps its naks and its
// max_deliveries dead letter.
const (
	OutageAnswers = 5
	OutageKeys    = 3
)

// The causes of a pause, the values of paydedup_worker_paused's cause
// label.
const (
	PauseProviderAuth        = "provider_auth"
	PauseProviderUnavailable = "provider_unavailable"
	PauseStoreUnavailable    = "postgres_unavailable"
)

// PauseCauses lists every cause of a pause.
var PauseCauses = []string{PauseProviderAuth, PauseProviderUnavailable, PauseStoreUnavailable}

// ErrProviderUnauthorized is the readiness error while the provider refuses
// the worker's API key.
var ErrProviderUnauthorized = errors.New("provider refused the API key")

// ErrProviderUnavailable is the readiness error while the provider answers
// every call 429 or 5xx, or cannot be reached.
var ErrProviderUnavailable = errors.New("provider unavailable")

// ErrStoreUnavailable is the readiness error while PostgreSQL cannot be
// reached from the worker.
var ErrStoreUnavailable = errors.New("postgres unavailable")

// gate pauses the worker while something every payment needs is out: the
// provider refuses the API key (401/403), the provider is unavailable (see
// OutageAnswers), or PostgreSQL is. While it is closed the worker fetches
// nothing, and the messages in hand whose work the outage cut short are
// held, not nakked (Worker.hold): a nak brings a redelivery, and each
// delivery spends one of MaxDeliver. When a pause ends one held message
// probes (runs again); an answer that shows the cause gone opens the gate
// and the held messages run again; a failed probe doubles the pause.
type gate struct {
	first, longest time.Duration
	now            func() time.Time // the worker's clock (Config.Clock)

	closed atomic.Bool  // fast path of the per-payment calls
	fails  atomic.Int64 // provider calls in a row that ended unavailable

	mu       sync.Mutex
	cause    string // "" while open
	err      error
	since    time.Time // start of the current pause
	until    time.Time // end of the current pause
	streak   int       // pauses in a row
	probing  bool
	held     int
	opened   chan struct{} // closed when the gate opens
	failKeys map[string]struct{}
}

func newGate(first, longest time.Duration, now func() time.Time) *gate {
	opened := make(chan struct{})
	close(opened)
	return &gate{first: first, longest: longest, now: now, opened: opened}
}

// pauseLocked is the length of the streak-th pause.
func (g *gate) pauseLocked() time.Duration {
	pause := g.first
	for range min(max(g.streak-1, 0), 20) {
		pause = min(2*pause, g.longest)
	}
	return pause
}

// close pauses the worker for cause; when it is already paused only the
// cause and the error are updated. It returns how long the pause lasts.
func (g *gate) close(cause string, err error) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closeLocked(cause, err)
}

func (g *gate) closeLocked(cause string, err error) time.Duration {
	g.err = err
	if g.cause != "" {
		g.cause = cause
		return g.until.Sub(g.now())
	}
	now := g.now()
	g.cause, g.streak, g.since = cause, 1, now
	pause := g.pauseLocked()
	g.until = now.Add(pause)
	g.opened = make(chan struct{})
	g.closed.Store(true)
	return pause
}

// openLocked opens the gate when it is closed for one of causes.
func (g *gate) openLocked(causes ...string) {
	for _, c := range causes {
		if g.cause == c {
			g.cause, g.err, g.streak, g.since, g.until, g.probing = "", nil, 0, time.Time{}, time.Time{}, false
			g.closed.Store(false)
			close(g.opened)
			return
		}
	}
}

// answered records a provider answer that is neither unavailable nor a
// refusal of the API key: the provider works.
func (g *gate) answered() {
	if !g.closed.Load() && g.fails.Load() == 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.fails.Store(0)
	clear(g.failKeys)
	g.openLocked(PauseProviderAuth, PauseProviderUnavailable)
}

// keyWorks records an answer of the provider that is not a refusal of the
// API key (a 429 or a 5xx too): the key works again.
func (g *gate) keyWorks() {
	if !g.closed.Load() {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.openLocked(PauseProviderAuth)
}

// unavailable records a provider call of key that ended unavailable and
// reports whether the worker is paused, by this call (see OutageAnswers)
// or already.
func (g *gate) unavailable(key string, err error) bool {
	fails := g.fails.Add(1)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cause != "" {
		return true
	}
	if len(g.failKeys) < OutageKeys {
		if g.failKeys == nil {
			g.failKeys = make(map[string]struct{}, OutageKeys)
		}
		g.failKeys[key] = struct{}{}
	}
	if fails < OutageAnswers || len(g.failKeys) < OutageKeys {
		return false
	}
	g.closeLocked(PauseProviderUnavailable, err)
	return true
}

// storeWorks records a statement that reached PostgreSQL.
func (g *gate) storeWorks() {
	if !g.closed.Load() {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.openLocked(PauseStoreUnavailable)
}

// storeFailed pauses the worker when err says PostgreSQL is unreachable,
// and returns the cause ("" for any other error).
func (g *gate) storeFailed(err error) string {
	if !errors.Is(err, ledger.ErrUnavailable) {
		return ""
	}
	g.close(PauseStoreUnavailable, err)
	return PauseStoreUnavailable
}

// probe makes the caller the prober when a pause is over and nobody
// probes yet. It returns whether the gate is open, whether the caller
// probes, and otherwise how long to wait before asking again and a channel
// closed when the gate opens.
func (g *gate) probe() (open, probing bool, wait time.Duration, opened <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cause == "" {
		return true, false, 0, nil
	}
	wait = g.until.Sub(g.now())
	if wait <= 0 && !g.probing {
		g.probing = true
		return false, true, 0, nil
	}
	if wait <= 0 {
		wait = g.first // the probe under way decides
	}
	return false, false, wait, g.opened
}

// probed ends a probe: after a failed one (failed) the next pause is
// twice as long; after one that showed nothing (the message needed no
// provider call) the next held message probes at once.
func (g *gate) probed(failed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.probing = false
	if g.cause == "" {
		return
	}
	if failed {
		g.streak++
		g.until = g.now().Add(g.pauseLocked())
	} else {
		g.until = g.now()
	}
}

// fetchWait is how long the fetch loop waits before it fetches, and a
// channel closed when the gate opens. While messages are held they probe;
// with none held, the first fetch after a pause is the probe.
func (g *gate) fetchWait() (time.Duration, <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cause == "" {
		return 0, nil
	}
	wait := g.until.Sub(g.now())
	if wait <= 0 && (g.held > 0 || g.probing) {
		wait = g.first
	}
	return wait, g.opened
}

// hold counts the messages held (delta ±1).
func (g *gate) hold(delta int) {
	g.mu.Lock()
	g.held += delta
	g.mu.Unlock()
}

// state returns the cause of the pause ("" when open) and its details.
//
//lint:ignore ST1008 err is the error that caused the pause, not a failure of state
func (g *gate) state() (cause string, err error, streak, held int, until time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cause, g.err, g.streak, g.held, g.until
}

// retryAt is when a paused worker next tries the provider (or
// PostgreSQL) again: its next probe, or about now while one is under way
// or due (a probe waits for no timer then). Zero when open.
func (g *gate) retryAt() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cause == "" {
		return time.Time{}
	}
	if now := g.now(); g.until.Before(now) {
		return now
	}
	return g.until
}

// pausedSince returns the cause of the pause ("" when open) and when it
// began.
func (g *gate) pausedSince() (cause string, since time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cause, g.since
}

// providerUnavailable reports whether a provider call's error shows the
// provider, not this request, failing: a 5xx, a connection refused or a
// call that got no answer. A 409 (another request under the key is
// running), a rate limit (429: the account asks for fewer requests; see
// Processor.rateLimited) and every answer about the request itself are
// not.
func providerUnavailable(err error) bool {
	var perr *provider.Error
	if !errors.As(err, &perr) || perr.RateLimited() {
		// A rate limit is the account's budget speaking, never an outage.
		return false
	}
	switch perr.Class {
	case provider.ClassRetryable:
		return true
	case provider.ClassUnknown:
		return perr.HTTPStatus == 0 || perr.HTTPStatus == 429 || perr.HTTPStatus >= 500
	}
	return false
}

// PauseCause is the cause of the worker's pause, one of PauseCauses, or ""
// while it works.
func (p *Processor) PauseCause() string {
	cause, _, _, _, _ := p.gate.state()
	return cause
}

// Held is how many messages the worker holds through a pause.
func (p *Processor) Held() int {
	_, _, _, held, _ := p.gate.state()
	return held
}

// Paused is a readiness check: nil while the worker works, and while it
// is paused an error wrapping ErrProviderUnauthorized,
// ErrProviderUnavailable or ErrStoreUnavailable that says why, how many
// messages it holds and when it probes next.
func (p *Processor) Paused(context.Context) error {
	cause, err, streak, held, until := p.gate.state()
	var sentinel error
	switch cause {
	case "":
		return nil
	case PauseProviderAuth:
		sentinel = ErrProviderUnauthorized
	case PauseProviderUnavailable:
		sentinel = ErrProviderUnavailable
	default:
		sentinel = ErrStoreUnavailable
	}
	return fmt.Errorf("%w: paused, not fetching (%d pause(s) in a row, %d message(s) held, next probe after %s): %v",
		sentinel, streak, held, until.UTC().Format(time.RFC3339), err)
}
