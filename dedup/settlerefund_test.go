package dedup_test

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
)

// processingRefund records a refund of amount of the payment under pay
// that the provider answered pending (id).
func (b *bundle) processingRefund(t *testing.T, key, pay string, amount int64, id string) {
	t.Helper()
	c := b.claimRefund(t, "w", refundReq("m_1", key, pay, amount))
	if c.Outcome != ledger.Claimed {
		t.Fatalf("claim refund %s: %+v", key, c)
	}
	if err := b.store.CompleteRefund(b.ctx, *c.Lease, ledger.RefundCompletion{Status: ledger.RefundProcessing, RefundID: id,
		ResponseStatus: 200, Response: json.RawMessage(`{"id":"` + id + `","status":"pending"}`)}); err != nil {
		t.Fatal(err)
	}
}

func refundFailed(id string) ledger.RefundCompletion {
	return ledger.RefundCompletion{Status: ledger.RefundFailed, RefundID: id, Reason: "expired_or_canceled_card", ResponseStatus: 200,
		Response: json.RawMessage(`{"id":"` + id + `","status":"failed"}`)}
}

// TestSettleRefundOnceUnderRace: the reconciler and the webhook (and a
// redelivery) settling one pending refund at once settle it once and write
// one event; a failed refund frees its amount; a settle of another refund
// id, or of an unknown refund, changes nothing.
func TestSettleRefundOnceUnderRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.chargedPayment(t, "m_1", "pay", 100)
	b.processingRefund(t, "r-1", "pay", 100, "re_1")

	if _, _, err := b.store.SettleRefund(b.ctx, "m_1", "r-1", refundFailed("re_other")); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("settle under another refund id: %v, want ErrNotFound", err)
	}
	if _, _, err := b.store.SettleRefund(b.ctx, "m_1", "r-9", refundFailed("re_1")); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("settle of an unknown refund: %v, want ErrNotFound", err)
	}
	if _, _, err := b.store.SettleRefund(b.ctx, "m_1", "r-1", ledger.RefundCompletion{Status: ledger.RefundProcessing, RefundID: "re_1",
		ResponseStatus: 200, Response: json.RawMessage(`{}`)}); err == nil {
		t.Fatal("settle to processing accepted")
	}

	const settlers = 8
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		settled int
	)
	for range settlers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, status, err := b.store.SettleRefund(b.ctx, "m_1", "r-1", refundFailed("re_1"))
			if err != nil || status != ledger.RefundFailed {
				t.Errorf("settle: %v %s %v", ok, status, err)
			}
			mu.Lock()
			defer mu.Unlock()
			if ok {
				settled++
			}
		}()
	}
	wg.Wait()
	if settled != 1 {
		t.Fatalf("%d settles of one refund, want 1", settled)
	}
	var events int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outcome_events WHERE merchant_id = 'm_1' AND idempotency_key = 'r-1'`).
		Scan(&events); err != nil {
		t.Fatal(err)
	}
	if events != 1 {
		t.Fatalf("%d events, want 1", events)
	}
	r, err := b.store.GetRefund(b.ctx, "m_1", "r-1")
	if err != nil || r.Status != ledger.RefundFailed || r.Reason != "expired_or_canceled_card" || !r.Final() {
		t.Fatalf("refund %+v %v", r, err)
	}
	// A later, disagreeing answer changes nothing and says what stands.
	if ok, status, err := b.store.SettleRefund(b.ctx, "m_1", "r-1", refunded("re_1")); ok || status != ledger.RefundFailed || err != nil {
		t.Fatalf("settle of a settled refund: %v %s %v, want not settled, failed", ok, status, err)
	}
	if got := b.claimRefund(t, "w", refundReq("m_1", "r-2", "pay", 100)); got.Outcome != ledger.Claimed {
		t.Fatalf("a refund of the failed refund's amount: %+v, want claimed", got)
	}
	if rs, _, err := b.store.ProcessingRefunds(b.ctx, ledger.ProcessingCursor{}, 10); err != nil || len(rs) != 0 {
		t.Fatalf("processing refunds after the settle: %+v %v", rs, err)
	}
}

// TestRolesSettleRefunds: the worker (the reconciler) settles a pending
// refund through settle_refund, the gateway (the webhook) to succeeded
// only through settle_refund_succeeded, with no right to write the
// refunds table itself.
func TestRolesSettleRefunds(t *testing.T) {
	t.Parallel()
	ownerURL := testenv.PostgresURL(t)
	worker, err := dedup.New(asWorker(t, ownerURL), dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	gwPool := testenv.AsRole(t, ownerURL, "paydedup_gateway")
	gateway, err := dedup.New(gwPool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{store: worker, ctx: t.Context()}
	b.chargedPayment(t, "m_1", "pay", 100)
	b.processingRefund(t, "r-1", "pay", 60, "re_1")
	b.processingRefund(t, "r-2", "pay", 40, "re_2")
	if ok, status, err := gateway.SettleRefundSucceeded(b.ctx, "m_1", "r-1", refunded("re_1")); !ok || status != ledger.RefundSucceeded || err != nil {
		t.Fatalf("settle as the gateway: %v %s %v", ok, status, err)
	}
	if ok, status, err := worker.SettleRefund(b.ctx, "m_1", "r-2", refundFailed("re_2")); !ok || status != ledger.RefundFailed || err != nil {
		t.Fatalf("settle as the worker: %v %s %v", ok, status, err)
	}
	if _, err := gwPool.Exec(b.ctx, `UPDATE refunds SET status = 'failed' WHERE refund_id = 're_2'`); err == nil {
		t.Fatal("the gateway updated refunds itself")
	}
	// It may read them (migration 00030: the door shows a payment's
	// refunds), never write them.
	if _, err := gwPool.Exec(b.ctx, `INSERT INTO refunds SELECT * FROM refunds LIMIT 1`); err == nil {
		t.Fatal("the gateway inserted into refunds itself")
	}
}
