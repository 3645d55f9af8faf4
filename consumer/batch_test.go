package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/ledger"
)

func TestBatchWithSameKeyTwice(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// Both copies are in the stream before the worker starts, so they
	// arrive in one fetch and are claimed in one statement.
	e.waitStreamsCreate()
	b := body("m_1", "twice", 300)
	e.publish("m_1", b, "", nil)
	e.publish("m_1", b, "", nil)
	e.publish("m_1", body("m_1", "other", 300), "", nil)
	e.startWorker("w1", nil)
	e.eventually("both keys completed", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == 2
	})
	e.quiescent()
	if e.charges("m_1", "twice") != 1 || e.charges("m_1", "other") != 1 {
		t.Fatalf("charges %v, want one each", e.sim.ChargesByKey())
	}
}

// failingCommits fails the first group commit as a whole, as a lost
// connection would: every payment in it must be retried, none acked.
type failingCommits struct {
	*dedup.Store
	failed  atomic.Bool
	mu      sync.Mutex
	victims []string
}

func (f *failingCommits) CompleteBatch(ctx context.Context, items []ledger.CompleteItem) ([]error, error) {
	if len(items) > 1 && f.failed.CompareAndSwap(false, true) {
		f.mu.Lock()
		for _, it := range items {
			f.victims = append(f.victims, it.Lease.IdempotencyKey)
		}
		f.mu.Unlock()
		return nil, fmt.Errorf("complete keys: %w: connection reset", ledger.ErrUnavailable)
	}
	return f.Store.CompleteBatch(ctx, items)
}

func TestGroupCommitFailureRetriesItsPayments(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.waitStreamsCreate()
	const n = 60
	for i := range n {
		e.publish("m_1", body("m_1", fmt.Sprintf("g-%d", i), 100), "", nil)
	}
	fs := &failingCommits{Store: e.store}
	e.startWorkerOn("w1", fs)
	e.eventually("all completed", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == n
	})
	e.quiescent()
	if !fs.failed.Load() || len(fs.victims) < 2 {
		t.Fatalf("no group commit of several rows failed (victims %v): the test proves nothing", fs.victims)
	}
	for i := range n {
		if c := e.charges("m_1", fmt.Sprintf("g-%d", i)); c != 1 {
			t.Errorf("g-%d charged %d times", i, c)
		}
	}
	for _, k := range fs.victims {
		rec, err := e.store.Get(e.ctx, "m_1", k)
		if err != nil || rec.Attempts < 2 {
			t.Errorf("%s: attempts %d (%v): a payment of the failed commit must have been retried", k, rec.Attempts, err)
		}
	}
	if n2 := e.count(`SELECT count(*) FROM payments`); n2 != n {
		t.Fatalf("%d ledger rows, want %d", n2, n)
	}
}
