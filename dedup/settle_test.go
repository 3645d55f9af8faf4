package dedup_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/paydedup/paydedup/ledger"
)

// TestProcessingPaymentSettlesOnce: a processing completion completes the
// key (never called again) with a `processing` ledger row; SettlePayment
// moves it to its final status once; the schema refuses every other change
// to the ledger, even by the owner.
func TestProcessingPaymentSettlesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := b.claim(t, "w", req("m_1", "ach", 1000)).Lease
	if err := b.store.Complete(b.ctx, *l, ledger.Completion{ChargeID: "pi_ach", Processing: true, ResponseStatus: 202,
		Response: []byte(`{"id":"pi_ach","status":"processing"}`)}); err != nil {
		t.Fatal(err)
	}
	if res := b.claim(t, "w2", req("m_1", "ach", 1000)); res.Outcome != ledger.Duplicate || res.Record.ResponseStatus != 202 {
		t.Fatalf("claim of a processing key: %v %d, want a duplicate", res.Outcome, res.Record.ResponseStatus)
	}
	list, next, err := b.store.ProcessingPayments(b.ctx, ledger.ProcessingCursor{}, 10)
	if err != nil || len(list) != 1 || list[0].ChargeID != "pi_ach" || list[0].Status != ledger.PaymentProcessing || next != (ledger.ProcessingCursor{}) {
		t.Fatalf("processing payments: %+v %+v %v", list, next, err)
	}
	if err := b.store.SettlePayment(b.ctx, list[0], "declined", 402, []byte(`{}`)); err == nil {
		t.Fatal("settled to declined: only succeeded or failed end a processing payment")
	}
	other := list[0]
	other.ChargeID = "pi_other"
	if err := b.store.SettlePayment(b.ctx, other, ledger.PaymentSucceeded, 200, []byte(`{}`)); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("settling under another intent: %v, want ErrNotFound", err)
	}
	if err := b.store.SettlePayment(b.ctx, list[0], ledger.PaymentFailed, 402, []byte(`{"error":{"type":"card_error"}}`)); err != nil {
		t.Fatal(err)
	}
	p, err := b.store.GetPayment(b.ctx, "m_1", "ach")
	if err != nil || p.Status != ledger.PaymentFailed || p.SettledAt.IsZero() {
		t.Fatalf("ledger %+v %v", p, err)
	}
	if rec, err := b.store.Get(b.ctx, "m_1", "ach"); err != nil || rec.ResponseStatus != 402 {
		t.Fatalf("record %+v %v, want the final answer stored", rec, err)
	}
	if err := b.store.SettlePayment(b.ctx, list[0], ledger.PaymentSucceeded, 200, []byte(`{}`)); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("settling twice: %v, want ErrNotFound", err)
	}
	for _, sql := range []string{
		`UPDATE payments SET status = 'succeeded' WHERE idempotency_key = 'ach'`,
		`UPDATE payments SET amount = 1`,
	} {
		_, err := b.pool.Exec(b.ctx, sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23000" {
			t.Fatalf("%s as the owner: %v, want the ledger's guard", sql, err)
		}
	}
}
