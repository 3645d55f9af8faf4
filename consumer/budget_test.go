package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/paydedup/paydedup/budget"
	budgetstore "github.com/paydedup/paydedup/budget/pgstore"
	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/provider"
)

// counted counts the calls that reach the provider.
type counted struct {
	provider.Provider
	calls *atomic.Int32
}

func (c counted) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	c.calls.Add(1)
	return c.Provider.Charge(ctx, req)
}

func (c counted) Lookup(ctx context.Context, req provider.LookupRequest) (provider.LookupResult, error) {
	c.calls.Add(1)
	return c.Provider.Lookup(ctx, req)
}

// TestTwoWorkersBehindTheFleetBudget: two workers, each with its own
// budget on the one PostgreSQL row, against an account limited to 40/s
// (burst 10) that answers the rest 429. With PAYDEDUP_PROVIDER_RATE at 90 %
// of the limit, every payment is charged once with almost no 429; with
// none configured, the budget learns the limit from the 429s. Either way
// no row is failed or released, no worker pauses, and each payment is
// claimed once: a payment whose batch's deadline passes while the call
// slots are held by calls waiting for the budget waits for a slot under
// its lease rather than spend a delivery.
func TestTwoWorkersBehindTheFleetBudget(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		rate     float64
		maxShare float64
	}{
		{"configured", 36, 0.05},
		{"learned", 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			outageConfig(e)
			store := newWatchedStore(e.store)
			calls := new(atomic.Int32)
			lim := limited{Provider: counted{Provider: e.stripe, calls: calls}, lim: rate.NewLimiter(40, 10), refused: new(atomic.Int32)}
			var procs []*consumer.Processor
			for _, holder := range []string{"w1", "w2"} {
				bs, err := budgetstore.New(e.pool, budgetstore.Config{})
				if err != nil {
					t.Fatal(err)
				}
				b, err := budget.New(bs, budget.Config{Rate: tc.rate})
				if err != nil {
					t.Fatal(err)
				}
				proc, _ := e.runPausable(holder, store, b.Wrap(lim))
				procs = append(procs, proc)
			}
			var keys []string
			for i := range 120 {
				keys = append(keys, fmt.Sprintf("fleet-%d", i))
				e.publish("m_1", body("m_1", keys[i], 100), "", nil)
			}
			start := time.Now()
			e.eventually("all completed", func() bool {
				for _, proc := range procs {
					if err := proc.Paused(e.ctx); err != nil {
						t.Fatalf("worker paused: %v", err)
					}
				}
				if spent := store.spentDelivery(); spent != "" {
					t.Fatalf("%s: a payment waiting for the budget spent a delivery", spent)
				}
				return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == len(keys)
			})
			took := time.Since(start)
			e.quiescent()
			e.chargedOnceEach(keys)
			store.noFailsNorReleases(t)
			store.mu.Lock()
			for _, k := range keys {
				if n := store.claims[k]; n != 1 {
					t.Errorf("%s claimed %d times, want once: no delivery spent waiting for the budget", k, n)
				}
			}
			store.mu.Unlock()
			refused, sent := lim.refused.Load(), lim.refused.Load()+calls.Load()
			share := float64(refused) / float64(sent)
			t.Logf("%d payments in %v (%.0f/s against a limit of 40/s), %d of %d requests answered 429 (%.1f %%)",
				len(keys), took.Round(10*time.Millisecond), float64(len(keys))/took.Seconds(), refused, sent, 100*share)
			if share > tc.maxShare {
				t.Fatalf("%.1f %% of the requests answered 429, want at most %.0f %%", 100*share, 100*tc.maxShare)
			}
		})
	}
}

// instantProvider answers every charge at once; its lookups find nothing.
type instantProvider struct{ instantCharger }

func (instantProvider) Lookup(context.Context, provider.LookupRequest) (provider.LookupResult, error) {
	return provider.LookupResult{}, nil
}

// pacedStore is a budget.Store that grants nothing limits the fleet
// until paced is set, then 10 tokens per 20 ms (500/s): a caller that
// finds none waits up to 20 ms for the budget.
type pacedStore struct {
	mu    sync.Mutex
	paced bool
	last  time.Time
}

func (s *pacedStore) pace() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.paced = true
}

func (s *pacedStore) Take(_ context.Context, t budget.Take) (budget.Grant, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.paced {
		return budget.Grant{Tokens: t.Want}, nil
	}
	const every = 20 * time.Millisecond
	if since := time.Since(s.last); since < every {
		return budget.Grant{Rate: 500, RetryIn: every - since}, nil
	}
	s.last = time.Now()
	return budget.Grant{Tokens: min(t.Want, 10), Rate: 500}, nil
}

func (s *pacedStore) Slow(context.Context, budget.Slow) (float64, bool, error) { return 0, false, nil }

// TestBudgetWaitIsNotProviderLatency: a worker learns its no-load latency
// against a provider that answers at once and a budget that limits
// nothing; then the budget paces it (waits of up to 20 ms before a call)
// while the provider still answers at once. The call limit must not read
// the waits as latency: a wait for the budget is not the provider queueing
// the calls. (The limit may come down, to 1.5 times the calls the budget
// lets through and not below its floor, which still passes all the budget
// allows: see callLimit's held windows.)
func TestBudgetWaitIsNotProviderLatency(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.cfg.Concurrency = 256 // the limit starts at 64, above its floor
	store := &pacedStore{}
	b, err := budget.New(store, budget.Config{})
	if err != nil {
		t.Fatal(err)
	}
	proc, _ := e.runPausable("w1", e.store, b.Wrap(instantProvider{}))
	start := proc.CallLimit().Limit
	for phase, n := range []int{400, 400} {
		if phase == 1 {
			store.pace()
		}
		for i := range n {
			e.publish("m_1", body("m_1", fmt.Sprintf("wait-%d-%d", phase, i), 100), "", nil)
		}
		least := start
		e.eventually("all completed", func() bool {
			least = min(least, proc.CallLimit().Limit)
			return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == (phase+1)*n
		})
		cl := proc.CallLimit()
		t.Logf("phase %d: limit %d (least %d, started at %d), latency %v, no-load %v", phase, cl.Limit, least, start, cl.Latency, cl.NoLoad)
		if phase == 1 && cl.Latency > 3*time.Millisecond {
			t.Fatalf("the call limit measured a latency of %v (no-load %v) from a provider that answers at once: it counted the budget's waits (limit %d, least %d, started at %d)", cl.Latency, cl.NoLoad, cl.Limit, least, start)
		}
	}
}
