package storetest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/storetest"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
)

// doubleClaim is a store that breaks the claim's one-winner rule: a claim
// that finds the key in flight reports it claimed, with a lease of its own.
type doubleClaim struct{ storetest.Store }

func (s doubleClaim) steal(holder string, lease time.Duration, r ledger.ClaimResult) ledger.ClaimResult {
	if r.Outcome == ledger.InFlight {
		r.Outcome = ledger.Claimed
		r.Lease = &ledger.Lease{MerchantID: r.Record.MerchantID, IdempotencyKey: r.Record.IdempotencyKey,
			ProviderKey: r.Record.ProviderKey, Holder: holder, Attempt: r.Record.Attempts, Until: time.Now().Add(lease)}
	}
	return r
}

func (s doubleClaim) Claim(ctx context.Context, holder string, lease time.Duration, req ledger.ClaimRequest) (ledger.ClaimResult, error) {
	r, err := s.Store.Claim(ctx, holder, lease, req)
	return s.steal(holder, lease, r), err
}

func (s doubleClaim) ClaimBatch(ctx context.Context, holder string, lease time.Duration, reqs []ledger.ClaimRequest) ([]ledger.ClaimResult, error) {
	res, err := s.Store.ClaimBatch(ctx, holder, lease, reqs)
	for i := range res {
		res[i] = s.steal(holder, lease, res[i])
	}
	return res, err
}

// unfenced is a store whose completion ignores a lost lease: it reports a
// stale holder's completion recorded.
type unfenced struct{ storetest.Store }

func (s unfenced) Complete(ctx context.Context, l ledger.Lease, c ledger.Completion) error {
	if err := s.Store.Complete(ctx, l, c); !errors.Is(err, ledger.ErrLeaseLost) {
		return err
	}
	return nil
}

var broken = map[string]struct {
	wrap func(storetest.Store) storetest.Store
	// fail are checks the breakage must fail.
	fail []string
}{
	"double_claim": {
		wrap: func(s storetest.Store) storetest.Store { return doubleClaim{s} },
		fail: []string{"ClaimRaceOneWinner", "LeaseExpiryOneReacquires", "BatchClaimRaceAcrossBatches"},
	},
	"unfenced": {
		wrap: func(s storetest.Store) storetest.Store { return unfenced{s} },
		fail: []string{"Fencing", "StaleCompleteFencedByAttempt", "CompleteRaceOneOutcome", "AcquireStuckDisjoint"},
	},
}

const brokenEnv = "STORETEST_BROKEN"

// TestSuiteCatchesBrokenStores proves the suite can fail: it runs this
// test binary again against the PostgreSQL store with a breakage wrapped
// around it (a second winner of a claim, a completion that ignores a lost
// lease) and wants each check the breakage breaks to fail. In that child
// run (brokenEnv set) the test is the suite's run against the broken store.
func TestSuiteCatchesBrokenStores(t *testing.T) {
	if name := os.Getenv(brokenEnv); name != "" {
		b := broken[name]
		storetest.Run(t, func(t *testing.T, clk *clock.Fake) storetest.Store {
			s, err := dedup.New(testenv.Pool(t), dedup.Config{Clock: clk})
			if err != nil {
				t.Fatal(err)
			}
			return b.wrap(s)
		})
		return
	}
	t.Parallel()
	for name, b := range broken {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			run := "^TestSuiteCatchesBrokenStores$/^(" + strings.Join(b.fail, "|") + ")$"
			cmd := exec.Command(os.Args[0], "-test.run", run, "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), brokenEnv+"="+name)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) {
				t.Fatalf("the suite passed a store that breaks %s (err %v):\n%s", name, err, out)
			}
			for _, check := range b.fail {
				if !strings.Contains(string(out), "--- FAIL: TestSuiteCatchesBrokenStores/"+check+" ") {
					t.Errorf("%s: check %s did not fail:\n%s", name, check, out)
				}
			}
		})
	}
}
