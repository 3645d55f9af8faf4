package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/paydedup/paydedup/lab/storehook"
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

func TestGroupCommitFailureRetriesItsPayments(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.waitStreamsCreate()
	const n = 60
	for i := range n {
		e.publish("m_1", body("m_1", fmt.Sprintf("g-%d", i), 100), "", nil)
	}
	// The first group commit of several rows fails as a whole, as a lost
	// connection would: every payment in it must be retried, none acked.
	var (
		mu      sync.Mutex
		victims []string
	)
	fs := storehook.Wrap(e.store).Before(storehook.CompleteBatch, func(_ context.Context, c *storehook.Call) error {
		mu.Lock()
		defer mu.Unlock()
		if len(c.Items) < 2 || victims != nil {
			return nil
		}
		for _, it := range c.Items {
			victims = append(victims, it.Lease.IdempotencyKey)
		}
		return fmt.Errorf("complete keys: %w: connection reset", ledger.ErrUnavailable)
	})
	e.startWorkerOn("w1", fs)
	e.eventually("all completed", func() bool {
		// Every message settled (its commit came first) with rows not
		// completed: a payment whose commit failed was acked. Said at
		// once, not when the wait times out.
		settled := e.settled()
		done := e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`)
		if settled && done < n {
			t.Fatalf("every message settled with %d of %d rows completed: a failed commit was acked", done, n)
		}
		return done == n
	})
	e.quiescent()
	mu.Lock()
	defer mu.Unlock()
	if len(victims) < 2 {
		t.Fatalf("no group commit of several rows failed (victims %v): the test proves nothing", victims)
	}
	for i := range n {
		if c := e.charges("m_1", fmt.Sprintf("g-%d", i)); c != 1 {
			t.Errorf("g-%d charged %d times", i, c)
		}
	}
	for _, k := range victims {
		rec, err := e.store.Get(e.ctx, "m_1", k)
		if err != nil || rec.Attempts < 2 {
			t.Errorf("%s: attempts %d (%v): a payment of the failed commit must have been retried", k, rec.Attempts, err)
		}
	}
	if n2 := e.count(`SELECT count(*) FROM payments`); n2 != n {
		t.Fatalf("%d ledger rows, want %d", n2, n)
	}
}

// settled reports whether the worker's consumer has nothing pending nor
// unacked: every message acked or terminated (a nakked one is unacked until
// it is redelivered and settles).
func (e *env) settled() bool {
	e.t.Helper()
	c, err := e.js.Consumer(e.ctx, e.cfg.Stream.Name, e.cfg.Stream.Durable)
	if err != nil {
		return false
	}
	info, err := c.Info(e.ctx)
	return err == nil && info.NumPending == 0 && info.NumAckPending == 0
}
