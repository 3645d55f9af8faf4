package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/provider"
)

// deadlineCharger records how far each call's deadline was when it came.
type deadlineCharger struct {
	consumer.Charger
	mu   sync.Mutex
	left []time.Duration // -1: no deadline
}

func (c *deadlineCharger) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	left := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	c.mu.Lock()
	c.left = append(c.left, left)
	c.mu.Unlock()
	return c.Charger.Charge(ctx, req)
}

// A worker's provider call ends a tenth of the lease before the lease
// runs out even when one attempt may take longer: the batch's deadline
// bounds it, from before the claim took the lease.
func TestWorkerCallEndsWithinTheLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// One attempt of nearly the whole lease: only the call's own bound
	// (0.9 of the lease) keeps it short of the lease.
	e.cfg.ProviderTry = provider.RetryPolicy{MaxTries: 1, AttemptTimeout: e.cfg.Lease - e.cfg.Lease/20}
	ch := &deadlineCharger{Charger: e.stripe}
	e.startWorker("w", ch)
	for _, k := range []string{"a", "b", "c"} {
		e.publish("m_1", body("m_1", k, 100), "", nil)
	}
	e.eventually("all charged", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == 3
	})
	ch.mu.Lock()
	defer ch.mu.Unlock()
	budget := e.cfg.Lease - e.cfg.Lease/10
	for i, left := range ch.left {
		if left < 0 || left > budget {
			t.Errorf("call %d had %v left before its deadline (-1: none), want at most %v (0.9 of the lease)", i, left, budget)
		}
	}
}
