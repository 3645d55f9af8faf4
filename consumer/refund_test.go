package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paydedup/paydedup/budget"
	budgetstore "github.com/paydedup/paydedup/budget/pgstore"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
	"github.com/paydedup/paydedup/reconciler"
	"github.com/paydedup/paydedup/stream"
)

// refundBody is a refund command: amount 0 leaves it out (the rest).
func refundBody(merchant, key, pay string, amount int64) []byte {
	b, _ := json.Marshal(payment.Command{MerchantID: merchant, IdempotencyKey: key, Kind: payment.KindRefund, PaymentKey: pay, Amount: amount})
	return b
}

// charged publishes a charge and waits for its completion; it returns
// the payment's intent.
func (e *env) charged(merchant, key string, amount int64) string {
	e.t.Helper()
	e.publish(merchant, body(merchant, key, amount), "", nil)
	e.eventually("charge completed", func() bool {
		rec, err := e.store.Get(e.ctx, merchant, key)
		return err == nil && rec.Status == ledger.StatusCompleted
	})
	rec, _ := e.store.Get(e.ctx, merchant, key)
	return rec.ChargeID
}

// refundsAt are the provider's refunds of the intent.
func (e *env) refundsAt(chargeID string) []stripesim.Refund {
	var out []stripesim.Refund
	for _, r := range e.sim.Refunds() {
		if r.PaymentIntent == chargeID {
			out = append(out, r)
		}
	}
	return out
}

// countingProvider is the provider, counting the refunds the workers ask
// it to make (a lookup is not one).
type countingProvider struct {
	*stripe.Client
	refunds atomic.Int64
}

func (c *countingProvider) Refund(ctx context.Context, req provider.RefundRequest) (*provider.RefundOutcome, error) {
	c.refunds.Add(1)
	return c.Client.Refund(ctx, req)
}

// refundDone waits for the refund's row to be final.
func (e *env) refundDone(merchant, key string) ledger.Refund {
	e.t.Helper()
	e.eventually("refund "+key+" final", func() bool {
		r, err := e.store.GetRefund(e.ctx, merchant, key)
		return err == nil && r.Final()
	})
	r, _ := e.store.GetRefund(e.ctx, merchant, key)
	return r
}

// deadLetter is the dead letter of the message whose key is key.
func (e *env) deadLetterOf(key string) *stream.ParsedDeadLetter {
	e.t.Helper()
	var info *stream.ParsedDeadLetter
	e.eventually("dead letter of "+key, func() bool {
		for _, m := range e.deadLetters() {
			var c payment.Command
			if json.Unmarshal(m.Data, &c) == nil && c.IdempotencyKey == key {
				p, err := stream.ParseDeadLetter(m.Header)
				if err != nil {
					e.t.Fatal(err)
				}
				info = &p
				return true
			}
		}
		return false
	})
	return info
}

// TestRefundOnTheStream: refunds of a charged payment go through the
// claim, the provider (behind the fleet's budget, as the binary wires it)
// and the commit: a part, then the rest (no amount); a duplicate is acked
// without a second refund; one more cent and a refund of an unknown
// payment are dead-lettered with their reasons and never sent.
func TestRefundOnTheStream(t *testing.T) {
	t.Parallel()
	e := setup(t)
	bs, err := budgetstore.New(e.pool, budgetstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := budget.New(bs, budget.Config{Rate: 1000})
	if err != nil {
		t.Fatal(err)
	}
	e.startWorker("w1", b.Wrap(e.stripe))
	pi := e.charged("m_1", "pay", 100)

	e.publish("m_1", refundBody("m_1", "r-1", "pay", 40), "", nil)
	if r := e.refundDone("m_1", "r-1"); r.Status != ledger.RefundSucceeded || r.Amount != 40 || r.RefundID == "" {
		t.Fatalf("first refund %+v", r)
	}
	e.publish("m_1", refundBody("m_1", "r-1", "pay", 40), "", nil) // a duplicate
	e.publish("m_1", refundBody("m_1", "r-2", "pay", 0), "", nil)  // the rest
	if r := e.refundDone("m_1", "r-2"); r.Status != ledger.RefundSucceeded || r.Amount != 60 {
		t.Fatalf("refund of the rest %+v", r)
	}
	e.publish("m_1", refundBody("m_1", "r-3", "pay", 1), "", nil)
	e.publish("m_1", refundBody("m_1", "r-4", "nope", 10), "", nil)
	if d := e.deadLetterOf("r-3"); d.Reason != ledger.RefuseOverRefundable || d.Error == "" {
		t.Fatalf("one cent more: dead letter %+v", d)
	}
	if d := e.deadLetterOf("r-4"); d.Reason != ledger.RefuseNoPayment {
		t.Fatalf("unknown payment: dead letter %+v", d)
	}
	e.quiescent()
	refunds := e.refundsAt(pi)
	if len(refunds) != 2 || refunds[0].Amount+refunds[1].Amount != 100 {
		t.Fatalf("provider's refunds %+v, want 40 and 60", refunds)
	}
	if n := e.count(`SELECT count(*) FROM refunds`); n != 2 {
		t.Fatalf("%d refund rows, want 2", n)
	}
}

// TestTwoWorkersRaceRefundsOfTheLast100: two workers take two refunds of
// all of a 100 payment, for several payments: for each, exactly one
// refund reaches the provider and succeeds, the other is dead-lettered
// over_refundable, never sent.
func TestTwoWorkersRaceRefundsOfTheLast100(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cp := &countingProvider{Client: e.stripe}
	e.startWorker("w1", cp)
	e.startWorker("w2", cp)
	const n = 8
	pis := make([]string, n)
	for i := range n {
		pis[i] = e.charged("m_1", fmt.Sprintf("pay-%d", i), 100)
	}
	for i := range n {
		e.publish("m_1", refundBody("m_1", fmt.Sprintf("a-%d", i), fmt.Sprintf("pay-%d", i), 100), "", nil)
		e.publish("m_1", refundBody("m_1", fmt.Sprintf("b-%d", i), fmt.Sprintf("pay-%d", i), 100), "", nil)
	}
	e.eventually("every refund decided", func() bool {
		return e.count(`SELECT count(*) FROM refunds WHERE status = 'succeeded'`)+len(e.deadLetters()) == 2*n
	})
	e.quiescent()
	for i, pi := range pis {
		if got := e.refundsAt(pi); len(got) != 1 || got[0].Amount != 100 {
			t.Errorf("payment %d: provider's refunds %+v, want exactly one of 100", i, got)
		}
	}
	if got := e.count(`SELECT count(*) FROM refunds WHERE status = 'succeeded'`); got != n {
		t.Fatalf("%d refunds succeeded, want %d", got, n)
	}
	if calls := cp.refunds.Load(); calls != n {
		t.Fatalf("%d refund calls reached the provider, want %d: a refused refund is never sent", calls, n)
	}
	for _, m := range e.deadLetters() {
		if p, err := stream.ParseDeadLetter(m.Header); err != nil || p.Reason != ledger.RefuseOverRefundable {
			t.Fatalf("dead letter %+v %v, want over_refundable", p, err)
		}
	}
}

// TestRefundMadeThenWorkerDiedLookedUp: a worker claimed a refund, the
// provider refunded, and the worker died before its commit. The
// redelivery's worker, once the lease ran out, finds the refund by lookup
// and records it: the provider refunded once.
func TestRefundMadeThenWorkerDiedLookedUp(t *testing.T) {
	t.Parallel()
	e := setup(t)
	stop := e.startWorker("w1", nil)
	pi := e.charged("m_1", "pay", 100)
	stop()
	cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: "r-1", Kind: payment.KindRefund, PaymentKey: "pay", Amount: 70}
	claim, err := e.store.ClaimRefund(e.ctx, "dead-worker", time.Second, ledger.NewRefundRequest(cmd))
	if err != nil || claim.Outcome != ledger.Claimed {
		t.Fatalf("claim %+v %v", claim, err)
	}
	made, err := e.stripe.Refund(e.ctx, provider.RefundRequest{ProviderKey: claim.Lease.ProviderKey, ChargeID: pi, Amount: 70,
		MerchantID: "m_1", IdempotencyKey: "r-1"})
	if err != nil || made.Status != provider.RefundSucceeded {
		t.Fatalf("refund %+v %v", made, err)
	}
	// Died here. Its message is redelivered to a healthy worker.
	cp := &countingProvider{Client: e.stripe}
	e.startWorker("healthy", cp)
	e.publish("m_1", refundBody("m_1", "r-1", "pay", 70), "", nil)
	r := e.refundDone("m_1", "r-1")
	if r.Status != ledger.RefundSucceeded || r.RefundID != made.RefundID || r.LockedBy != "healthy" || r.Attempts != 2 {
		t.Fatalf("refund %+v, want the dead worker's refund %s recorded by the healthy one", r, made.RefundID)
	}
	e.quiescent()
	if got := e.refundsAt(pi); len(got) != 1 {
		t.Fatalf("provider's refunds %+v, want exactly one", got)
	}
	if calls := cp.refunds.Load(); calls != 0 {
		t.Fatalf("the healthy worker asked for %d refunds, want none: it looks up, it never re-calls", calls)
	}
}

// TestRefundAnswerLostAfterProviderActed: the provider refunds and the
// connection drops before its answer: the refund's row is unknown, still
// holding its amount; the redelivery looks it up before any re-call and
// records the one refund.
func TestRefundAnswerLostAfterProviderActed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cp := &countingProvider{Client: e.stripe}
	e.startWorker("w1", cp)
	pi := e.charged("m_1", "pay", 100)
	if err := e.sim.SetFaults(stripesim.Faults{RateDropAfterCharge: 1}); err != nil {
		t.Fatal(err)
	}
	e.publish("m_1", refundBody("m_1", "r-1", "pay", 100), "", nil)
	e.eventually("refunded at the provider, answer lost", func() bool {
		r, err := e.store.GetRefund(e.ctx, "m_1", "r-1")
		return err == nil && r.Status == ledger.RefundUnknown && len(e.refundsAt(pi)) == 1
	})
	e.publish("m_1", refundBody("m_1", "r-2", "pay", 1), "", nil)
	if d := e.deadLetterOf("r-2"); d.Reason != ledger.RefuseOverRefundable {
		t.Fatalf("a refund of unknown outcome must hold its amount: dead letter %+v", d)
	}
	if err := e.sim.SetFaults(stripesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	r := e.refundDone("m_1", "r-1")
	e.quiescent()
	got := e.refundsAt(pi)
	if r.Status != ledger.RefundSucceeded || len(got) != 1 || r.RefundID != got[0].ID {
		t.Fatalf("refund %+v, provider's %+v: want the one refund recorded", r, got)
	}
	if calls := cp.refunds.Load(); calls != 1 {
		t.Fatalf("the worker asked for %d refunds, want one: the redelivery looks up, it never re-calls", calls)
	}
}

// TestReconcilerResolvesAbandonedRefunds: two refunds whose worker died
// with their messages gone, one made at the provider and one not. The
// reconciler, once their leases ran out, looks both up, records the one
// made, and leaves the other unknown, still holding its amount, without
// refunding; that one's next delivery looks it up, finds nothing and
// sends it.
func TestReconcilerResolvesAbandonedRefunds(t *testing.T) {
	t.Parallel()
	e := setup(t)
	stop := e.startWorker("w1", nil)
	pi := e.charged("m_1", "pay", 100)
	stop()
	claim := func(key string, amount int64) ledger.RefundClaim {
		cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: key, Kind: payment.KindRefund, PaymentKey: "pay", Amount: amount}
		c, err := e.store.ClaimRefund(e.ctx, "dead-worker", time.Second, ledger.NewRefundRequest(cmd))
		if err != nil || c.Outcome != ledger.Claimed {
			t.Fatalf("claim %s: %+v %v", key, c, err)
		}
		return c
	}
	made := claim("r-1", 70)
	claim("r-2", 30)
	out, err := e.stripe.Refund(e.ctx, provider.RefundRequest{ProviderKey: made.Lease.ProviderKey, ChargeID: pi, Amount: 70,
		MerchantID: "m_1", IdempotencyKey: "r-1"})
	if err != nil {
		t.Fatal(err)
	}
	cp := &countingProvider{Client: e.stripe}
	rec, err := reconciler.New(e.store, cp, reconciler.Config{Grace: time.Millisecond, SearchLag: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	resolved, left := 0, 0
	e.eventually("both leases ran out and were looked up", func() bool {
		r, err := rec.RunOnce(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		resolved, left = resolved+r.RefundsResolved, left+r.RefundsLeft
		return resolved == 1 && left >= 1
	})
	if r := e.refundDone("m_1", "r-1"); r.Status != ledger.RefundSucceeded || r.RefundID != out.RefundID {
		t.Fatalf("r-1 %+v, want the refund made, %s", r, out.RefundID)
	}
	if r, _ := e.store.GetRefund(e.ctx, "m_1", "r-2"); r.Status != ledger.RefundUnknown {
		t.Fatalf("r-2 %s, want unknown", r.Status)
	}
	if cp.refunds.Load() != 0 || len(e.refundsAt(pi)) != 1 {
		t.Fatalf("the reconciler asked for %d refunds, provider holds %d: want none asked, one made", cp.refunds.Load(), len(e.refundsAt(pi)))
	}
	e.startWorker("w2", nil)
	e.publish("m_1", refundBody("m_1", "r-2", "pay", 30), "", nil)
	if r := e.refundDone("m_1", "r-2"); r.Status != ledger.RefundSucceeded {
		t.Fatalf("r-2 %+v", r)
	}
	if got := e.refundsAt(pi); len(got) != 2 {
		t.Fatalf("provider's refunds %+v, want two", got)
	}
}
