package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/lab/storehook"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/stream"
)

// rateLimitAnswer is a 429 as Stripe sends it for the account's rate.
func rateLimitAnswer() error {
	return &provider.Error{Class: provider.ClassRetryable, HTTPStatus: 429, Type: "invalid_request_error", Code: "rate_limit",
		RateLimitReason: provider.ReasonGlobalRate, ShouldRetry: provider.AdviceRetry, Message: "Too many requests hit the API too quickly."}
}

// throttled answers every charge and lookup 429 rate_limit while closed,
// and passes them on once opened.
type throttled struct {
	provider.Provider
	open    *atomic.Bool
	refused *atomic.Int32
}

func (p throttled) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	if !p.open.Load() {
		p.refused.Add(1)
		return nil, rateLimitAnswer()
	}
	return p.Provider.Charge(ctx, req)
}

func (p throttled) Lookup(ctx context.Context, req provider.LookupRequest) (provider.LookupResult, error) {
	if !p.open.Load() {
		p.refused.Add(1)
		return provider.LookupResult{}, rateLimitAnswer()
	}
	return p.Provider.Lookup(ctx, req)
}

// limited answers 429 rate_limit to every charge and lookup above its
// rate, across every worker that calls it: an account's rate limit.
type limited struct {
	provider.Provider
	lim     *rate.Limiter
	refused *atomic.Int32
}

func (p limited) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	if !p.lim.Allow() {
		p.refused.Add(1)
		return nil, rateLimitAnswer()
	}
	return p.Provider.Charge(ctx, req)
}

func (p limited) Lookup(ctx context.Context, req provider.LookupRequest) (provider.LookupResult, error) {
	if !p.lim.Allow() {
		p.refused.Add(1)
		return provider.LookupResult{}, rateLimitAnswer()
	}
	return p.Provider.Lookup(ctx, req)
}

// watchedStore is the worker's store, recording what the worker writes
// about each key besides its completion: claims, fails and releases.
type watchedStore struct {
	storehook.Wrapper
	mu       sync.Mutex
	claims   map[string]int
	fails    []string
	releases []string
}

func newWatchedStore(s *dedup.Store) *watchedStore {
	w := &watchedStore{claims: map[string]int{}}
	w.Wrapper = storehook.Wrap(s).
		Before(storehook.ClaimBatch, func(_ context.Context, c *storehook.Call) error {
			w.mu.Lock()
			defer w.mu.Unlock()
			for _, r := range c.Reqs {
				w.claims[r.IdempotencyKey]++
			}
			return nil
		}).
		Before(storehook.Fail, func(_ context.Context, c *storehook.Call) error {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.fails = append(w.fails, c.Lease.IdempotencyKey+": "+c.Reason)
			return nil
		}).
		Before(storehook.Release, func(_ context.Context, c *storehook.Call) error {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.releases = append(w.releases, c.Lease.IdempotencyKey+": "+c.Reason)
			return nil
		})
	return w
}

// noFailsNorReleases fails the test if a row was failed or released.
func (s *watchedStore) noFailsNorReleases(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.fails) > 0 || len(s.releases) > 0 {
		t.Fatalf("rows failed %q, released %q: a rate limit must leave the row pending under its lease", s.fails, s.releases)
	}
}

// spentDelivery describes the first sign that a payment spent a delivery
// instead of waiting under its lease (a row failed or released, a key
// claimed twice), or is "": checked while the payments run, it ends a
// broken run at once instead of when its wait for completion times out.
func (s *watchedStore) spentDelivery() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.fails) > 0 || len(s.releases) > 0 {
		return fmt.Sprintf("rows failed %q, released %q", s.fails, s.releases)
	}
	for k, n := range s.claims {
		if n > 1 {
			return fmt.Sprintf("%s claimed %d times", k, n)
		}
	}
	return ""
}

// TestRateLimitWaitsUnderTheLease: the provider answers every call 429
// rate_limit for longer than the lease and the AckWait, then charges. The
// payments wait under their leases: each is charged once on its first
// delivery (one claim, nothing redelivered), no row is ever failed or
// released, the worker never pauses, nothing is dead-lettered.
func TestRateLimitWaitsUnderTheLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	outageConfig(e)
	store := newWatchedStore(e.store)
	p := throttled{Provider: e.stripe, open: new(atomic.Bool), refused: new(atomic.Int32)}
	proc, _ := e.runPausable("w1", store, p)
	var keys []string
	for i := range 8 {
		keys = append(keys, fmt.Sprintf("rl-%d", i))
		e.publish("m_1", body("m_1", keys[i], 100), "", nil)
	}
	// Longer than the AckWait (5 s) and the lease (3 s): only heartbeats
	// keep both alive.
	for end := time.Now().Add(e.cfg.Stream.AckWait + time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if err := proc.Paused(e.ctx); err != nil {
			t.Fatalf("worker paused by a rate limit: %v", err)
		}
		if n := e.count(`SELECT count(*) FROM idempotency_keys WHERE status <> 'pending'`); n != 0 {
			t.Fatalf("%d rows not pending during the rate limit (failed or completed)", n)
		}
		if dls := e.deadLetters(); len(dls) > 0 {
			t.Fatalf("%d dead letters during the rate limit", len(dls))
		}
	}
	if n := p.refused.Load(); n < int32(len(keys)) {
		t.Fatalf("the provider refused %d calls, want every payment refused at least once", n)
	}
	p.open.Store(true)
	e.eventually("all completed after the rate limit", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == len(keys)
	})
	e.quiescent()
	e.chargedOnceEach(keys)
	store.noFailsNorReleases(t)
	store.mu.Lock()
	for _, k := range keys {
		if n := store.claims[k]; n != 1 {
			t.Errorf("%s claimed %d times, want once: one delivery", k, n)
		}
	}
	store.mu.Unlock()
	c := e.workerConsumer()
	info, err := c.Info(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumRedelivered != 0 || info.Delivered.Consumer != uint64(len(keys)) {
		t.Fatalf("consumer delivered %d messages, %d redelivered; want %d, none redelivered", info.Delivered.Consumer, info.NumRedelivered, len(keys))
	}
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters, want 0", n)
	}
	if n := e.exhausted(); n != 0 {
		t.Fatalf("%d messages ran out of deliveries, want 0", n)
	}
}

// TestTwoWorkersAgainstAnAccountRateLimit: two workers, one account
// limited to 40 requests/s (burst 5) that answers the rest 429: every
// payment is charged once, none is failed, released or dead-lettered, and
// neither worker pauses.
func TestTwoWorkersAgainstAnAccountRateLimit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	outageConfig(e)
	store := newWatchedStore(e.store)
	p := limited{Provider: e.stripe, lim: rate.NewLimiter(40, 5), refused: new(atomic.Int32)}
	proc1, _ := e.runPausable("w1", store, p)
	proc2, _ := e.runPausable("w2", store, p)
	var keys []string
	for i := range 80 {
		keys = append(keys, fmt.Sprintf("race-%d", i))
		e.publish("m_1", body("m_1", keys[i], 100), "", nil)
	}
	e.eventually("all completed", func() bool {
		for _, proc := range []*consumer.Processor{proc1, proc2} {
			if err := proc.Paused(e.ctx); err != nil {
				t.Fatalf("worker paused by a rate limit: %v", err)
			}
		}
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == len(keys)
	})
	e.quiescent()
	e.chargedOnceEach(keys)
	store.noFailsNorReleases(t)
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters, want 0", n)
	}
	if p.refused.Load() == 0 {
		t.Fatal("the provider refused nothing: the test did not meet its rate limit")
	}
	t.Logf("%d requests answered 429", p.refused.Load())
}

// limitedFor answers its first n charges 429 rate_limit (with retryAfter
// as Retry-After), then charges.
type limitedFor struct {
	n          int32
	retryAfter time.Duration
	calls      atomic.Int32
}

func (l *limitedFor) Charge(context.Context, provider.ChargeRequest) (*provider.Outcome, error) {
	if l.calls.Add(1) <= l.n {
		err := rateLimitAnswer().(*provider.Error)
		err.RetryAfter = l.retryAfter
		return nil, err
	}
	return &provider.Outcome{ChargeID: "pi_1", HTTPStatus: 200, Response: []byte(`{"id":"pi_1"}`)}, nil
}

// TestProcessorWaitsOutARateLimit: a 429 is waited out under the lease,
// for longer than a whole lease, with the lease extended and progress
// reported meanwhile, and the charge completes: no Fail, no Release. A
// drain that cancels the wait releases the row (pending, for the next
// delivery) and never fails it. A lease lost during the wait ends it with
// no write at all.
func TestProcessorWaitsOutARateLimit(t *testing.T) {
	t.Parallel()
	const lease = 300 * time.Millisecond
	cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: "k", Amount: 100, Currency: "usd", PaymentMethod: "pm_card_visa"}
	run := func(ctx context.Context, st *beats, ch *limitedFor) (consumer.Result, int32) {
		// A wait that never ends (no heartbeat finds the lease lost)
		// fails the test in seconds rather than hang it: cancelled, as a
		// drain does (a deadline does not end the wait).
		ctx, cancel := context.WithCancel(ctx)
		defer time.AfterFunc(5*time.Second, cancel).Stop()
		defer cancel()
		cfg := consumer.Config{Holder: "w", Lease: lease, CommitBatch: 1, RetryBase: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond,
			ProviderTry: provider.RetryPolicy{MaxTries: 1, AttemptTimeout: 100 * time.Millisecond}}
		p := consumer.NewProcessor(st, ch, cfg, nil)
		l := &ledger.Lease{MerchantID: "m_1", IdempotencyKey: "k", ProviderKey: ledger.ProviderKey("m_1", "k"), Holder: "w", Attempt: 1, Until: time.Now().Add(lease)}
		var progress atomic.Int32
		res := p.Handle(ctx, cmd, ledger.ClaimResult{Outcome: ledger.Claimed, Lease: l}, func() { progress.Add(1) })
		return res, progress.Load()
	}
	t.Run("charged", func(t *testing.T) {
		t.Parallel()
		st, ch := &beats{}, &limitedFor{n: 12}
		start := time.Now()
		res, progress := run(context.Background(), st, ch)
		if res.Kind != consumer.Completed || ch.calls.Load() != 13 {
			t.Fatalf("result %v (%v) after %d calls, want completed after 13", res.Kind, res.Err, ch.calls.Load())
		}
		if time.Since(start) < lease || st.n.Load() < 3 || progress < st.n.Load() {
			t.Errorf("waited %v with %d heartbeats and %d progress reports; want over a lease, kept alive", time.Since(start), st.n.Load(), progress)
		}
		if len(st.fail) != 0 || len(st.release) != 0 {
			t.Errorf("store writes: fail %q, release %q; want none", st.fail, st.release)
		}
	})
	t.Run("retry-after", func(t *testing.T) {
		t.Parallel()
		st, ch := &beats{}, &limitedFor{n: 1, retryAfter: 250 * time.Millisecond}
		start := time.Now()
		if res, _ := run(context.Background(), st, ch); res.Kind != consumer.Completed {
			t.Fatalf("result %v (%v), want completed", res.Kind, res.Err)
		}
		if d := time.Since(start); d < 250*time.Millisecond {
			t.Errorf("called again after %v, before the provider's Retry-After of 250ms", d)
		}
	})
	t.Run("drained", func(t *testing.T) {
		t.Parallel()
		st, ch := &beats{}, &limitedFor{n: 1 << 30}
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(200*time.Millisecond, cancel)
		res, _ := run(ctx, st, ch)
		if res.Kind != consumer.Retry || provider.RateLimitOf(res.Err) == nil {
			t.Fatalf("result %v (%v), want a retry with the rate limit", res.Kind, res.Err)
		}
		if len(st.fail) != 0 || len(st.release) != 1 {
			t.Errorf("store writes: fail %q, release %q; want one release", st.fail, st.release)
		}
	})
	t.Run("lost", func(t *testing.T) {
		t.Parallel()
		st, ch := &beats{lostAfter: 2}, &limitedFor{n: 1 << 30}
		res, _ := run(context.Background(), st, ch)
		if res.Kind != consumer.Retry || res.Err == nil || !strings.Contains(res.Err.Error(), "lease lost") {
			t.Fatalf("result %v (%v), want a retry for the lost lease", res.Kind, res.Err)
		}
		if len(st.fail) != 0 || len(st.release) != 0 {
			t.Errorf("the old holder wrote: fail %q, release %q", st.fail, st.release)
		}
	})
}

// TestWaitUnderLeaseIsBounded: a payment waits under one claim, for the
// provider's rate limit or for a call slot held by such a wait, at most
// MaxWaitUnderLease: then its row is released (pending, maybe charged)
// and the message retried, so that the next claim checks the provider key
// window again, and no call starts past the bound. Unbounded, a claim
// re-acquired late in the key window could call after the provider forgot
// the key, and charge again.
func TestWaitUnderLeaseIsBounded(t *testing.T) {
	t.Parallel()
	const (
		lease = 300 * time.Millisecond
		bound = 500 * time.Millisecond
	)
	// A drain's cancel at the end stops the waits (those that see it).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, ch := &beats{}, &limitedFor{n: 1 << 30}
	var lastCall atomic.Int64
	cfg := consumer.Config{Holder: "w", Lease: lease, CommitBatch: 1, Concurrency: 1, MaxWaitUnderLease: bound,
		RetryBase: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond,
		ProviderTry: provider.RetryPolicy{MaxTries: 1, AttemptTimeout: 100 * time.Millisecond}}
	p := consumer.NewProcessor(st, chargeFunc(func(c context.Context, r provider.ChargeRequest) (*provider.Outcome, error) {
		lastCall.Store(time.Now().UnixNano())
		return ch.Charge(c, r)
	}), cfg, nil)
	start := time.Now()
	results := make([]consumer.Result, 2)
	var wg sync.WaitGroup
	for i := range results {
		key := fmt.Sprintf("k%d", i)
		cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: key, Amount: 100, Currency: "usd", PaymentMethod: "pm_card_visa"}
		l := &ledger.Lease{MerchantID: "m_1", IdempotencyKey: key, ProviderKey: ledger.ProviderKey("m_1", key), Holder: "w", Attempt: 1, Until: time.Now().Add(lease)}
		hctx := ctx
		if i == 1 {
			// The second payment's batch deadline passes while the first
			// holds the only slot: it waits for the slot under its lease.
			var c context.CancelFunc
			hctx, c = context.WithTimeout(ctx, 50*time.Millisecond)
			defer c()
			for ch.calls.Load() == 0 { // the first holds the slot
				runtime.Gosched()
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = p.Handle(hctx, cmd, ledger.ClaimResult{Outcome: ledger.Claimed, Lease: l}, nil)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("the waits under the lease outlasted MaxWaitUnderLease %v by far: still waiting after 5s", bound)
	}
	for i, res := range results {
		if res.Kind != consumer.Retry {
			t.Errorf("payment %d: result %v (%v), want a retry", i, res.Kind, res.Err)
		}
	}
	if last := time.Unix(0, lastCall.Load()); last.Sub(start) > bound+100*time.Millisecond {
		t.Errorf("a call started %v after the claim, past the bound %v", last.Sub(start), bound)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.fail) != 0 || len(st.release) != 2 {
		t.Errorf("store writes: fail %q, release %q; want both rows released, none failed", st.fail, st.release)
	}
}

// chargeFunc is a func as a Charger.
type chargeFunc func(context.Context, provider.ChargeRequest) (*provider.Outcome, error)

func (f chargeFunc) Charge(ctx context.Context, r provider.ChargeRequest) (*provider.Outcome, error) {
	return f(ctx, r)
}

// TestUnknownStaysUnknownAcrossRateLimitedCalls: under one claim, the
// first call's attempt times out after sending (unknown: it may have
// charged), its next attempt gets a 429, and the call made after the
// rate-limited wait gets 503s. The row may be charged: it is released
// (pending, for a redelivery or the reconciler), never failed, as
// ChargeWithRetry keeps an unknown outcome within one call.
func TestUnknownStaysUnknownAcrossRateLimitedCalls(t *testing.T) {
	t.Parallel()
	const lease = 300 * time.Millisecond
	var n atomic.Int32
	ch := chargeFunc(func(context.Context, provider.ChargeRequest) (*provider.Outcome, error) {
		switch n.Add(1) {
		case 1:
			return nil, &provider.Error{Class: provider.ClassUnknown, Message: "timeout after the request was sent", Err: context.DeadlineExceeded}
		case 2:
			return nil, rateLimitAnswer()
		default:
			return nil, &provider.Error{Class: provider.ClassRetryable, HTTPStatus: 503, Type: "api_error", Message: "unavailable"}
		}
	})
	st := &beats{}
	cfg := consumer.Config{Holder: "w", Lease: lease, CommitBatch: 1, RetryBase: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond,
		ProviderTry: provider.RetryPolicy{MaxTries: 2, AttemptTimeout: 50 * time.Millisecond, InitialInterval: time.Millisecond, MaxInterval: 10 * time.Millisecond}}
	p := consumer.NewProcessor(st, ch, cfg, nil)
	cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: "k", Amount: 100, Currency: "usd", PaymentMethod: "pm_card_visa"}
	l := &ledger.Lease{MerchantID: "m_1", IdempotencyKey: "k", ProviderKey: ledger.ProviderKey("m_1", "k"), Holder: "w", Attempt: 1, Until: time.Now().Add(lease)}
	res := p.Handle(context.Background(), cmd, ledger.ClaimResult{Outcome: ledger.Claimed, Lease: l}, nil)
	if n.Load() < 3 {
		t.Fatalf("%d calls; the script needs the call after the rate-limited wait", n.Load())
	}
	if res.Kind != consumer.Retry || provider.ClassOf(res.Err) != provider.ClassUnknown {
		t.Errorf("result %v (%v), want a retry with an unknown outcome", res.Kind, res.Err)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.fail) != 0 || len(st.release) != 1 {
		t.Errorf("store writes: fail %q, release %q; want the possibly charged row released, never failed", st.fail, st.release)
	}
}

// downBeats is a store whose heartbeats of keyDown fail as with
// PostgreSQL unreachable.
type downBeats struct {
	writes
	keyDown string
}

func (d *downBeats) Heartbeat(_ context.Context, l ledger.Lease, dur time.Duration) (ledger.Lease, error) {
	if l.IdempotencyKey == d.keyDown {
		return ledger.Lease{}, fmt.Errorf("heartbeat: %w: connection refused", ledger.ErrUnavailable)
	}
	l.Until = time.Now().Add(dur)
	return l, nil
}

// TestStoreOutageDuringWaitUnderLeaseHolds: PostgreSQL becomes
// unreachable while a payment waits under its lease, for the provider's
// rate limit or for a call slot: the heartbeat fails, and the worker
// pauses for the store (the message is held, no delivery spent), as when
// a completion fails alike, rather than nak it.
func TestStoreOutageDuringWaitUnderLeaseHolds(t *testing.T) {
	t.Parallel()
	const lease = 300 * time.Millisecond
	cfg := consumer.Config{Holder: "w", Lease: lease, CommitBatch: 1, Concurrency: 1, RetryBase: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond,
		ProviderTry: provider.RetryPolicy{MaxTries: 1, AttemptTimeout: 100 * time.Millisecond}}
	handle := func(ctx context.Context, p *consumer.Processor, key string) consumer.Result {
		cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: key, Amount: 100, Currency: "usd", PaymentMethod: "pm_card_visa"}
		l := &ledger.Lease{MerchantID: "m_1", IdempotencyKey: key, ProviderKey: ledger.ProviderKey("m_1", key), Holder: "w", Attempt: 1, Until: time.Now().Add(lease)}
		return p.Handle(ctx, cmd, ledger.ClaimResult{Outcome: ledger.Claimed, Lease: l}, nil)
	}
	t.Run("rate-limited", func(t *testing.T) {
		t.Parallel()
		p := consumer.NewProcessor(&downBeats{keyDown: "k"}, &limitedFor{n: 1 << 30}, cfg, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if res := handle(ctx, p, "k"); res.Kind != consumer.Retry {
			t.Fatalf("result %v (%v), want a retry", res.Kind, res.Err)
		}
		if err := p.Paused(ctx); !errors.Is(err, consumer.ErrStoreUnavailable) {
			t.Fatalf("after a heartbeat failed for PostgreSQL in the rate-limited wait: paused %v, want paused for the store", err)
		}
	})
	t.Run("slot", func(t *testing.T) {
		t.Parallel()
		ch := &limitedFor{n: 1 << 30}
		p := consumer.NewProcessor(&downBeats{keyDown: "k1"}, ch, cfg, nil)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		holder := make(chan struct{})
		go func() { defer close(holder); handle(ctx, p, "k0") }() // holds the only slot, rate-limited
		for ch.calls.Load() == 0 {
			runtime.Gosched()
		}
		bctx, bcancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer bcancel()
		if res := handle(bctx, p, "k1"); res.Kind != consumer.Retry {
			t.Fatalf("result %v (%v), want a retry", res.Kind, res.Err)
		}
		if err := p.Paused(ctx); !errors.Is(err, consumer.ErrStoreUnavailable) {
			t.Errorf("after a heartbeat failed for PostgreSQL in the slot wait: paused %v, want paused for the store", err)
		}
		cancel()
		<-holder
	})
}

// TestStopDuringRateLimitedLastDeliveryDoesNotCountARequeue: the worker
// stops while a message's last delivery waits for the provider's rate
// limit under its lease. The stop, no fault of the message, ended it:
// the message is published again without counting a requeue (as a message
// held through an outage), never filed max_deliveries, even with no
// requeues left.
func TestStopDuringRateLimitedLastDeliveryDoesNotCountARequeue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	outageConfig(e)
	e.cfg.Stream.MaxDeliver = 2
	e.cfg.NetRequeues = 0
	// The first delivery's wait ends at the bound; the second, the last,
	// is waiting when the worker stops.
	e.cfg.MaxWaitUnderLease = time.Second
	p := throttled{Provider: e.stripe, open: new(atomic.Bool), refused: new(atomic.Int32)}
	_, stop := e.runPausable("w1", e.store, p)
	e.publish("m_1", body("m_1", "stopped", 100), "", nil)
	c := e.workerConsumer()
	var refusedAt int32
	e.eventually("the last delivery under way", func() bool {
		info, err := c.Info(e.ctx)
		if err != nil || info.Delivered.Consumer < 2 {
			return false
		}
		if refusedAt == 0 {
			refusedAt = p.refused.Load()
		}
		return p.refused.Load() > refusedAt // the last delivery was refused: it waits
	})
	stop()
	if dls := e.deadLetters(); len(dls) != 0 {
		p, _ := stream.ParseDeadLetter(dls[0].Header)
		t.Fatalf("filed %s (%s) after a stop during a rate-limited wait, want the message published again", p.Reason, p.Error)
	}
	copies := 0
	for _, m := range e.streamMsgs(e.cfg) {
		if v := m.Header.Get(stream.HeaderRequeues); v != "" {
			copies++
			if v != "0" {
				t.Errorf("the copy counts %s requeue(s), want 0: a stop is no fault of the message", v)
			}
		}
	}
	if copies != 1 {
		t.Fatalf("%d copies published again, want 1", copies)
	}
}

// limitedThenHung answers 429 rate_limit for its first d, then never
// answers a call until the call's context ends.
type limitedThenHung struct {
	d     time.Duration
	first atomic.Int64
	hung  atomic.Int32
}

func (l *limitedThenHung) Charge(ctx context.Context, _ provider.ChargeRequest) (*provider.Outcome, error) {
	l.first.CompareAndSwap(0, time.Now().UnixNano())
	if time.Since(time.Unix(0, l.first.Load())) < l.d {
		return nil, rateLimitAnswer()
	}
	l.hung.Add(1)
	<-ctx.Done()
	return nil, &provider.Error{Class: provider.ClassUnknown, Err: ctx.Err()}
}

// TestDrainCancelsACallAfterTheBatchDeadline: a payment waits for the
// provider's rate limit past its batch's deadline, then calls and the
// provider does not answer. The worker stops; its drain deadline passes:
// the call is cancelled then (the row released), not left to run its own
// budget out past the drain.
func TestDrainCancelsACallAfterTheBatchDeadline(t *testing.T) {
	t.Parallel()
	e := setup(t)
	outageConfig(e)
	e.cfg.DrainTimeout = 300 * time.Millisecond
	// A call may hang 2.5 s of the 3 s lease; the batch's deadline is the
	// lease less a tenth after the fetch.
	e.cfg.ProviderTry = provider.RetryPolicy{MaxTries: 1, AttemptTimeout: 2500 * time.Millisecond}
	ch := &limitedThenHung{d: e.cfg.Lease}
	_, stop := e.runPausable("w1", e.store, ch)
	e.publish("m_1", body("m_1", "hung", 100), "", nil)
	e.eventually("a call after the batch deadline hangs", func() bool { return ch.hung.Load() > 0 })
	start := time.Now()
	stop()
	if d := time.Since(start); d > e.cfg.DrainTimeout+time.Second {
		t.Fatalf("the worker stopped %v after its stop, past the drain timeout %v: the call begun after the batch deadline was not cancelled", d, e.cfg.DrainTimeout)
	}
	if n := e.count(`SELECT count(*) FROM idempotency_keys WHERE status <> 'pending'`); n != 0 {
		t.Fatalf("%d rows not pending after a drain cut an unanswered call", n)
	}
}
