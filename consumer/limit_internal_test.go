package consumer

import (
	"container/heap"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paydedup/paydedup/provider"
)

// simProvider is a provider model for the limit's simulation: a call's
// latency is base times a log-normal noise (median 1; sigma 0.472 makes
// the p99 three times the median), times the queueing factor when more
// than capacity calls are in flight (0: it never queues). Above
// concurrency calls in flight (0: no such limit) it answers a concurrency
// 429 at once.
type simProvider struct {
	base        time.Duration
	sigma       float64
	capacity    int
	concurrency int
	heldBack    bool    // every call waited for the fleet's budget first
	budget      float64 // calls a second the fleet's budget lets start (0: none); the others wait in their slots
}

// simResult is what a simulation run saw.
type simResult struct {
	limit       int           // at the end
	minLimit    int           // the least after the change (if any)
	throughput  float64       // calls answered per second over the last third
	meanLatency time.Duration // of the answers over the last third
	rejected    float64       // share of calls answered 429
	limitBefore int           // at the change (if any)
}

// call is a provider call in the simulation, ending at end.
type call struct {
	end, start time.Time
	begin      time.Time // when the budget let it go to the provider
	sig        callSignal
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

type calls []call

func (c calls) Len() int           { return len(c) }
func (c calls) Less(i, j int) bool { return c[i].end.Before(c[j].end) }
func (c calls) Swap(i, j int)      { c[i], c[j] = c[j], c[i] }
func (c *calls) Push(x any)        { *c = append(*c, x.(call)) }
func (c *calls) Pop() any {
	old := *c
	x := old[len(old)-1]
	*c = old[:len(old)-1]
	return x
}

// simulate drives l with an endless backlog of calls against p for d of
// fake time; at change (if > 0) the provider becomes after. It checks the
// limit stays within its floor and ceiling, and calls in flight within it,
// at every step.
func simulate(t *testing.T, l *callLimit, clock *time.Time, p simProvider, d, change time.Duration, after simProvider) simResult {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	start := *clock
	var q calls
	var res simResult
	var answered, total, rejected int
	var latSum time.Duration
	changed := false
	var nextToken time.Time
	res.minLimit = math.MaxInt
	for clock.Sub(start) < d {
		if change > 0 && !changed && clock.Sub(start) >= change {
			changed, p = true, after
			res.limitBefore = int(l.limit)
		}
		l.mu.Lock()
		for l.take() {
			inflight := l.inflight
			begin := *clock
			if p.budget > 0 {
				begin = later(begin, nextToken)
				nextToken = begin.Add(time.Duration(float64(time.Second) / p.budget))
			}
			lat := time.Duration(float64(p.base) * math.Exp(p.sigma*rng.NormFloat64()))
			sig := signalAnswer
			if p.capacity > 0 && inflight > p.capacity {
				lat = time.Duration(float64(lat) * float64(inflight) / float64(p.capacity))
			}
			if p.concurrency > 0 && inflight > p.concurrency {
				lat, sig = time.Millisecond, signalDrop
			}
			heap.Push(&q, call{end: begin.Add(lat), start: *clock, begin: begin, sig: sig})
		}
		lim, inflight := int(l.limit), l.inflight
		l.mu.Unlock()
		if lim < l.floor || lim > l.ceiling || inflight > l.ceiling {
			t.Fatalf("at %v: limit %d (floor %d, ceiling %d), %d in flight", clock.Sub(start), lim, l.floor, l.ceiling, inflight)
		}
		c := heap.Pop(&q).(call)
		if traceLimit && c.end.Sub(start)/time.Second != clock.Sub(start)/time.Second {
			t.Logf("%v: limit %d, %d in flight, window latency %v, no-load %v", c.end.Sub(start).Truncate(time.Second), lim, inflight, l.latency, l.noLoad())
		}
		*clock = c.end
		if p.heldBack {
			l.heldBack(time.Second)
		}
		if wait := c.begin.Sub(c.start); wait > 0 {
			l.heldBack(wait)
		}
		l.release(c.end.Sub(c.begin), c.sig)
		if changed {
			res.minLimit = min(res.minLimit, int(l.limit))
		}
		if clock.Sub(start) > 2*d/3 {
			total++
			if c.sig == signalDrop {
				rejected++
			} else {
				answered++
				latSum += c.end.Sub(c.start)
			}
		}
	}
	res.limit = int(l.limit)
	res.throughput = float64(answered) / (d.Seconds() / 3)
	if answered > 0 {
		res.meanLatency = latSum / time.Duration(answered)
	}
	if total > 0 {
		res.rejected = float64(rejected) / float64(total)
	}
	return res
}

// traceLimit logs the limit every simulated second (PAYDEDUP_TRACE_LIMIT=1).
var traceLimit = os.Getenv("PAYDEDUP_TRACE_LIMIT") != ""

func newSimLimit(ceiling int) (*callLimit, *time.Time) {
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return newCallLimit(ceiling, func() time.Time { return clock }), &clock
}

// logNormal is the spread of the provider: p99 three times the median.
var logNormal = math.Log(3) / 2.326

func TestCallLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		ceiling int
		p       simProvider
		d       time.Duration
		change  time.Duration
		after   simProvider
		check   func(t *testing.T, r simResult)
	}{
		{name: "a steady 50 ms provider that never queues: up to the ceiling", ceiling: 1000,
			p: simProvider{base: 50 * time.Millisecond, sigma: logNormal}, d: 15 * time.Second,
			check: func(t *testing.T, r simResult) {
				if r.limit != 1000 {
					t.Errorf("limit %d, want the ceiling 1000", r.limit)
				}
			}},
		{name: "a steady 1 s provider that never queues: up to the ceiling", ceiling: 1000,
			p: simProvider{base: time.Second, sigma: logNormal}, d: 90 * time.Second,
			check: func(t *testing.T, r simResult) {
				if r.limit != 1000 {
					t.Errorf("limit %d, want the ceiling 1000", r.limit)
				}
			}},
		{name: "every call held back by the fleet's budget: it does not grow", ceiling: 1000,
			p: simProvider{base: 300 * time.Millisecond, sigma: logNormal, heldBack: true}, d: 30 * time.Second,
			check: func(t *testing.T, r simResult) {
				if r.limit != initialLimit {
					t.Errorf("limit %d, want it kept at %d: the budget, not the provider, bounds the calls", r.limit, initialLimit)
				}
			}},
		{name: "a budget of 48 calls/s before a 300 ms provider: 1.5 times the calls it lets through", ceiling: 1000,
			p: simProvider{base: 300 * time.Millisecond, sigma: logNormal, budget: 48}, d: 60 * time.Second,
			check: func(t *testing.T, r simResult) {
				// 48/s × 335 ms (the log-normal's mean) is 16 calls at the
				// provider.
				if r.limit > 48 || r.throughput < 0.95*48 {
					t.Errorf("limit %d, %.1f calls/s: want at most 48 slots and the budget's 48/s", r.limit, r.throughput)
				}
			}},
		{name: "a 50 ms provider that queues past 200 calls", ceiling: 4000,
			p: simProvider{base: 50 * time.Millisecond, sigma: logNormal, capacity: 200}, d: 30 * time.Second,
			check: func(t *testing.T, r simResult) {
				// Its best is 200 calls / 56 ms (the mean of the log-normal).
				best := 200 / (56 * time.Millisecond).Seconds()
				if r.throughput < 0.85*best || r.limit > 400 || r.meanLatency > 90*time.Millisecond {
					t.Errorf("limit %d, %.0f calls/s (best %.0f), mean latency %v", r.limit, r.throughput, best, r.meanLatency)
				}
			}},
		{name: "a 1 s provider that queues past 500 calls", ceiling: 4000,
			p: simProvider{base: time.Second, sigma: logNormal, capacity: 500}, d: 240 * time.Second,
			check: func(t *testing.T, r simResult) {
				best := 500 / (1118 * time.Millisecond).Seconds()
				if r.throughput < 0.85*best || r.limit > 1000 || r.meanLatency > 1800*time.Millisecond {
					t.Errorf("limit %d, %.0f calls/s (best %.0f), mean latency %v", r.limit, r.throughput, best, r.meanLatency)
				}
			}},
		{name: "latency doubles: it shrinks", ceiling: 4000,
			p: simProvider{base: 300 * time.Millisecond, sigma: logNormal, capacity: 400}, d: 40 * time.Second,
			change: 30 * time.Second, after: simProvider{base: 600 * time.Millisecond, sigma: logNormal, capacity: 200},
			check: func(t *testing.T, r simResult) {
				if r.minLimit > r.limitBefore*7/10 {
					t.Errorf("limit %d before the latency doubled, never below %d after", r.limitBefore, r.minLimit)
				}
			}},
		{name: "concurrency 429s past 300 calls: it shrinks", ceiling: 1000,
			p: simProvider{base: 300 * time.Millisecond, sigma: logNormal, concurrency: 300}, d: 60 * time.Second,
			check: func(t *testing.T, r simResult) {
				if r.limit > 400 || r.rejected > 0.05 || r.throughput < 0.7*300/0.335 {
					t.Errorf("limit %d, %.1f %% answered 429, %.0f calls/s", r.limit, 100*r.rejected, r.throughput)
				}
			}},
		{name: "every call a concurrency 429: down to the floor", ceiling: 1000,
			p: simProvider{base: 300 * time.Millisecond, concurrency: 1}, d: 10 * time.Second,
			check: func(t *testing.T, r simResult) {
				if r.limit != MinConcurrency {
					t.Errorf("limit %d, want the floor %d", r.limit, MinConcurrency)
				}
			}},
		{name: "a ceiling under the floor is both", ceiling: 4,
			p: simProvider{base: 50 * time.Millisecond, sigma: logNormal, concurrency: 2}, d: 10 * time.Second,
			check: func(t *testing.T, r simResult) {
				if r.limit != 4 {
					t.Errorf("limit %d, want 4", r.limit)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l, clock := newSimLimit(tc.ceiling)
			r := simulate(t, l, clock, tc.p, tc.d, tc.change, tc.after)
			t.Logf("limit %d (before the change %d, least after %d), %.0f calls/s, mean latency %v, no-load %v, %.1f %% 429",
				r.limit, r.limitBefore, r.minLimit, r.throughput, r.meanLatency, l.noLoad(), 100*r.rejected)
			tc.check(t, r)
		})
	}
}

func TestSignalOf(t *testing.T) {
	t.Parallel()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	bg := context.Background()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want callSignal
	}{
		{"answered", bg, nil, signalAnswer},
		{"unknown outcome", bg, &provider.Error{Class: provider.ClassUnknown, HTTPStatus: 500}, signalDrop},
		{"timed out", expired, &provider.Error{Class: provider.ClassUnknown, Err: context.DeadlineExceeded}, signalDrop},
		{"cut short by a drain", cancelled, &provider.Error{Class: provider.ClassUnknown, Err: context.Canceled}, signalIgnore},
		{"concurrency 429", bg, &provider.Error{Class: provider.ClassRetryable, HTTPStatus: 429, RateLimitReason: "global-concurrency"}, signalDrop},
		{"rate 429", bg, &provider.Error{Class: provider.ClassRetryable, HTTPStatus: 429, RateLimitReason: "global-rate"}, signalIgnore},
		{"429 without a reason", bg, &provider.Error{Class: provider.ClassRetryable, HTTPStatus: 429}, signalIgnore},
		{"rejected", bg, &provider.Error{Class: provider.ClassRejected, HTTPStatus: 400}, signalIgnore},
		{"unauthorized", bg, &provider.Error{Class: provider.ClassUnauthorized, HTTPStatus: 401}, signalIgnore},
	} {
		if got := signalOf(tc.ctx, tc.err); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestCallLimitConcurrent runs many callers on a real clock, some giving
// up their wait, and checks the calls in flight never pass the limit's
// ceiling and every slot is given back (run it with -race).
func TestCallLimitConcurrent(t *testing.T) {
	t.Parallel()
	l := newCallLimit(8, time.Now)
	var inflight, peak atomic.Int64
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 50 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(3))*time.Millisecond)
				if i%2 == 0 {
					cancel()
					ctx, cancel = context.WithCancel(context.Background())
				}
				err := l.acquire(ctx, "m")
				cancel()
				if err != nil {
					if !errors.Is(err, errLimitWait) {
						t.Errorf("acquire: %v", err)
					}
					continue
				}
				n := inflight.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(100 * time.Microsecond) // the call
				inflight.Add(-1)
				sig := signalAnswer
				if j%7 == 0 {
					sig = signalDrop
				}
				l.release(100*time.Microsecond, sig)
			}
		}()
	}
	wg.Wait()
	s := l.snapshot()
	if s.InFlight != 0 || s.Waiting != 0 || peak.Load() > 8 || s.Peak > 8 {
		t.Errorf("after all: %+v, peak seen %d", s, peak.Load())
	}
}

// TestCallLimitWaitRoom: the fetch loop's wait ends once few enough calls
// wait for a slot, and when its context ends.
func TestCallLimitWaitRoom(t *testing.T) {
	t.Parallel()
	l := newCallLimit(1, time.Now)
	if err := l.acquire(context.Background(), "m"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	acquired := make(chan error, 3)
	for range 3 {
		go func() { acquired <- l.acquire(ctx, "m") }()
	}
	for deadline := time.Now().Add(5 * time.Second); l.snapshot().Waiting < 3; {
		if time.Now().After(deadline) {
			t.Fatal("the callers never waited")
		}
		time.Sleep(time.Millisecond)
	}
	done := make(chan struct{})
	go func() { l.waitRoom(context.Background(), 1); close(done) }()
	select {
	case <-done:
		t.Fatal("waitRoom returned with 3 calls waiting")
	case <-time.After(20 * time.Millisecond):
	}
	l.release(time.Millisecond, signalIgnore) // one waiter gets the slot: 2 wait
	l.release(time.Millisecond, signalIgnore)
	if err := <-acquired; err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("waitRoom still waiting with 1 call waiting")
	}
	stopped, stop := context.WithCancel(context.Background())
	stop()
	l.waitRoom(stopped, 0) // returns at once: its context ended
	cancel()
	for range 2 {
		<-acquired
	}
}

// TestCallLimitFairBetweenMerchants: with merchant A's 1,000 payments
// waiting for a call slot, a payment of merchant B that comes after them
// is granted the next slot freed, before A's second waiter, and a
// cancelled waiter's place goes to the next in turn. (On the FIFO line it
// replaced, B waited for all of A's thousand.)
func TestCallLimitFairBetweenMerchants(t *testing.T) {
	t.Parallel()
	clock := time.Unix(0, 0)
	l := newCallLimit(MinConcurrency, func() time.Time { return clock })
	for range MinConcurrency {
		if err := l.acquire(context.Background(), "a"); err != nil {
			t.Fatal(err)
		}
	}
	type grant struct {
		merchant string
		i        int
	}
	granted := make(chan grant, 1100)
	var wg sync.WaitGroup
	wait := func(merchant string, i int, ctx context.Context) {
		defer wg.Done()
		if err := l.acquire(ctx, merchant); err == nil {
			granted <- grant{merchant, i}
		}
	}
	waitFor := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); l.snapshot().Waiting < n; {
			if time.Now().After(deadline) {
				t.Fatalf("%d callers waiting, want %d", l.snapshot().Waiting, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	for i := range 1000 {
		wg.Add(1)
		go wait("a", i, context.Background())
		waitFor(i + 1) // in this order
	}
	cancelled, cancel := context.WithCancel(context.Background())
	wg.Add(1)
	go wait("c", 0, cancelled)
	waitFor(1001)
	wg.Add(2)
	go wait("b", 0, context.Background())
	waitFor(1002)
	go wait("b", 1, context.Background())
	waitFor(1003)
	if s := l.snapshot(); s.MerchantsWaiting != 3 {
		t.Errorf("merchants waiting: %d, want 3", s.MerchantsWaiting)
	}
	cancel() // c gives up its place: its turn lapses
	for deadline := time.Now().Add(10 * time.Second); l.snapshot().Waiting != 1002; {
		if time.Now().After(deadline) {
			t.Fatal("the cancelled caller still waits")
		}
		time.Sleep(time.Millisecond)
	}
	// Turns: a (first in line), then b, then a, then b: not a's thousand
	// before b.
	want := []grant{{"a", 0}, {"b", 0}, {"a", 1}, {"b", 1}, {"a", 2}, {"a", 3}}
	for _, w := range want {
		clock = clock.Add(time.Millisecond)
		l.release(time.Millisecond, signalIgnore)
		select {
		case g := <-granted:
			if g != w {
				t.Fatalf("granted %v, want %v", g, w)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("nothing granted; want %v", w)
		}
	}
	for range 1000 - 4 {
		l.release(time.Millisecond, signalIgnore)
	}
	wg.Wait()
	if s := l.snapshot(); s.Waiting != 0 || s.MerchantsWaiting != 0 || s.InFlight != MinConcurrency {
		t.Errorf("after all: %+v", s)
	}
}
