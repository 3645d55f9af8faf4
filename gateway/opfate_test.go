package gateway_test

import (
	"net/http"
	"testing"

	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/ledger"
)

// TestRefusedRefundStaysFinalAfterItsEventGoes: a refund the worker
// refuses (over_refundable) marks the door's intake of it dead-lettered,
// so its key stays final for as long as the intake row lives, not only as
// long as the outbox keeps the refused event: once the event is purged
// and the republish hold has passed, a retry of the same refund is still
// 422 with its reason and is never published again (a second judgement
// could refund).
func TestRefusedRefundStaysFinalAfterItsEventGoes(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, refunder())
	w.startWorker()
	w.charged("pay-f", 1000)
	wantStatus(t, w.postOp("pay-f", "refunds", "ref-f", `{"amount":1001}`), http.StatusAccepted)
	var in ledger.Intake
	w.eventually("the refund's intake marked dead-lettered", func() bool {
		got, err := w.gwStore.GetIntake(w.ctx, "m_a", "ref-f")
		in = got
		return err == nil && got.DeadLettered()
	})
	if in.DeadLetterReason != ledger.RefuseOverRefundable {
		t.Fatalf("intake dead-lettered with %q, want %s", in.DeadLetterReason, ledger.RefuseOverRefundable)
	}
	// The outbox purged the event; the republish hold passed.
	if _, err := w.pool.Exec(w.ctx, `DELETE FROM outcome_events WHERE merchant_id = 'm_a' AND idempotency_key = 'ref-f'`); err != nil {
		t.Fatal(err)
	}
	if _, err := w.pool.Exec(w.ctx, `UPDATE gateway_intake SET locked_until = now() - interval '1 second' WHERE idempotency_key = 'ref-f'`); err != nil {
		t.Fatal(err)
	}
	r := w.postOp("pay-f", "refunds", "ref-f", `{"amount":1001}`)
	if r.status != http.StatusUnprocessableEntity || r.problem(t).Reason != ledger.RefuseOverRefundable {
		t.Fatalf("retry of a refused refund after its event went: %d %s, want 422 %s", r.status, r.body, ledger.RefuseOverRefundable)
	}
	if op := w.do(http.MethodGet, "/v1/refunds/ref-f", w.keyA, "", nil).operation(t); op.Status != gateway.OpRefused || op.Reason != ledger.RefuseOverRefundable {
		t.Fatalf("GET refused refund %+v", op)
	}
	if n := w.keyMsgs("ref-f"); n != 1 {
		t.Fatalf("%d copies of ref-f in the stream, want 1", n)
	}
	if n := len(w.sim.Refunds()); n != 0 {
		t.Fatalf("%d refunds at the provider, want 0", n)
	}
}

// TestRefusalUnreadableIsUnavailable: a retried operation whose refusal
// cannot be read is 503 (retry), never taken as "not refused": the batch
// could then publish it again.
func TestRefusalUnreadableIsUnavailable(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, refunder())
	wantStatus(t, w.post("pay-u", payBody(1000, "pm_card_visa")), http.StatusAccepted) // no worker runs
	wantStatus(t, w.postOp("pay-u", "refunds", "ref-u", `{"amount":10}`), http.StatusAccepted)
	w.eventually("the refund's publish marked", func() bool { // marked after the 202
		in, err := w.gwStore.GetIntake(w.ctx, "m_a", "ref-u")
		return err == nil && in.Published()
	})
	if _, err := w.pool.Exec(w.ctx, `ALTER TABLE outcome_events RENAME TO outcome_events_away`); err != nil {
		t.Fatal(err)
	}
	r := w.postOp("pay-u", "refunds", "ref-u", `{"amount":10}`)
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("retry with its refusal unreadable: %d %s, want 503", r.status, r.body)
	}
	if n := w.keyMsgs("ref-u"); n != 1 {
		t.Fatalf("%d copies of ref-u in the stream, want 1", n)
	}
}

// TestRefusedOperationMarkedForOperatorReadsRefused: a refusal the worker
// recorded is final; an operator's mark the net made on the intake after
// it (its dead-letter mark not written) does not hide it: GET answers
// refused with the reason, as a retried POST does (422).
func TestRefusedOperationMarkedForOperatorReadsRefused(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, refunder())
	w.startWorker()
	w.charged("pay-g", 1000)
	wantStatus(t, w.postOp("pay-g", "refunds", "ref-g", `{"amount":1001}`), http.StatusAccepted)
	w.eventually("the refund's intake marked dead-lettered", func() bool {
		got, err := w.gwStore.GetIntake(w.ctx, "m_a", "ref-g")
		return err == nil && got.DeadLettered()
	})
	if _, err := w.pool.Exec(w.ctx, `UPDATE gateway_intake SET dead_letter_reason = NULL, dead_letter_error = NULL, dead_lettered_at = NULL,
		operator_reason = 'max_deliveries', operator_at = now() WHERE idempotency_key = 'ref-g'`); err != nil {
		t.Fatal(err)
	}
	if op := w.do(http.MethodGet, "/v1/refunds/ref-g", w.keyA, "", nil).operation(t); op.Status != gateway.OpRefused || op.Reason != ledger.RefuseOverRefundable {
		t.Fatalf("GET of a refused refund marked for an operator: %+v, want refused %s", op, ledger.RefuseOverRefundable)
	}
	if r := w.postOp("pay-g", "refunds", "ref-g", `{"amount":1001}`); r.status != http.StatusUnprocessableEntity || r.problem(t).Reason != ledger.RefuseOverRefundable {
		t.Fatalf("retry: %d %s, want 422 %s", r.status, r.body, ledger.RefuseOverRefundable)
	}
}
