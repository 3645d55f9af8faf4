package ledger_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/paydedup/paydedup/ledger"
)

// TestStateOf: a payment's client-visible state from the rows that hold
// it, for each state and each row that can decide it (the gateway's GET
// tests check the same answers end to end).
func TestStateOf(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	hash, other := make([]byte, 32), make([]byte, 32)
	other[0] = 1
	rec := func(f func(*ledger.Record)) *ledger.Record {
		r := &ledger.Record{MerchantID: "m_1", IdempotencyKey: "k", RequestHash: hash, Amount: 1000, Currency: "usd",
			Status: ledger.StatusPending, CreatedAt: t0, UpdatedAt: t0}
		f(r)
		return r
	}
	completed := func(status int) func(*ledger.Record) {
		return func(r *ledger.Record) {
			r.Status, r.ResponseStatus, r.Response = ledger.StatusCompleted, status, json.RawMessage(`{"id":"pi_1"}`)
			r.ChargeID, r.CompletedAt = "pi_1", t0.Add(time.Second)
		}
	}
	intake := func(f func(*ledger.Intake)) *ledger.Intake {
		in := &ledger.Intake{MerchantID: "m_1", IdempotencyKey: "k", RequestHash: hash, Amount: 1000, Currency: "usd",
			Attempt: 1, PublishedAt: t0, StreamSeq: 7, CreatedAt: t0.Add(-time.Second)}
		f(in)
		return in
	}
	none := func(*ledger.Intake) {}
	letter := func(reason string) func(*ledger.Intake) {
		return func(in *ledger.Intake) { in.DeadLetterReason, in.DeadLetteredAt = reason, t0 }
	}
	operator := func(reason string, at time.Time) func(*ledger.Intake) {
		return func(in *ledger.Intake) { in.OperatorReason, in.OperatorAt = reason, at }
	}
	pay := func(status string) *ledger.Payment {
		return &ledger.Payment{MerchantID: "m_1", IdempotencyKey: "k", ChargeID: "pi_1", Status: status, Amount: 1000,
			Currency: "usd", CreatedAt: t0.Add(time.Minute)}
	}
	for _, c := range []struct {
		name      string
		in        *ledger.Intake
		rec       *ledger.Record
		pay       *ledger.Payment
		want      ledger.State
		rejected  bool
		reason    string
		completed bool
		final     bool
		forWorker bool // WaitsForWorker
	}{
		{name: "nothing known"},
		{name: "published, not claimed", in: intake(none), want: ledger.StateQueued, forWorker: true},
		{name: "no PubAck, none in flight", in: intake(func(in *ledger.Intake) { in.PublishedAt, in.StreamSeq = time.Time{}, 0 }),
			want: ledger.StatePublishUnknown},
		{name: "dead-lettered intake", in: intake(letter("invalid_amount")), rejected: true, reason: "invalid_amount", final: true},
		{name: "intake waits for an operator", in: intake(operator("max_deliveries", t0)),
			want: ledger.StateWaitingForOperator, reason: "max_deliveries"},
		{name: "worker holds the key", in: intake(none), rec: rec(func(*ledger.Record) {}), want: ledger.StateProcessing, forWorker: true},
		{name: "outcome unknown", rec: rec(func(r *ledger.Record) { r.MaybeCharged = true }), want: ledger.StateProcessing, forWorker: true},
		{name: "failed record retrying", rec: rec(func(r *ledger.Record) { r.Status = ledger.StatusFailed }),
			want: ledger.StateRetrying, forWorker: true},
		{name: "charged", rec: rec(completed(200)), want: ledger.StateSucceeded, completed: true, final: true},
		{name: "charged, 201", rec: rec(completed(201)), want: ledger.StateSucceeded, completed: true, final: true},
		{name: "declined", rec: rec(completed(402)), want: ledger.StateDeclined, completed: true, final: true},
		{name: "provider rejected the parameters", rec: rec(completed(400)), want: ledger.StateDeclined, completed: true, final: true},
		{name: "completed as processing (stored 202)", rec: rec(completed(202)), want: ledger.StateProcessing, completed: true},
		{name: "completed record beside a dead letter", in: intake(letter("key_reused")), rec: rec(completed(200)),
			want: ledger.StateSucceeded, completed: true, final: true},
		{name: "completed record beside an operator letter", in: intake(operator("provider_rejected", t0.Add(time.Hour))),
			rec: rec(completed(200)), want: ledger.StateSucceeded, completed: true, final: true},
		{name: "pending record, dead-lettered intake", in: intake(letter("key_reused")), rec: rec(func(*ledger.Record) {}),
			rejected: true, reason: "key_reused", final: true},
		{name: "dead letter of another payload", in: intake(func(in *ledger.Intake) { letter("key_reused")(in); in.RequestHash = other }),
			rec: rec(func(*ledger.Record) {}), want: ledger.StateProcessing, forWorker: true},
		{name: "failed record, operator letter after it", in: intake(operator("provider_rejected", t0.Add(time.Second))),
			rec: rec(func(r *ledger.Record) { r.Status = ledger.StatusFailed }), want: ledger.StateWaitingForOperator, reason: "provider_rejected"},
		{name: "operator letter filed as the record changed", in: intake(operator("max_deliveries", t0)),
			rec: rec(func(*ledger.Record) {}), want: ledger.StateWaitingForOperator, reason: "max_deliveries"},
		{name: "record updated after the letter (a replay claimed it)", in: intake(operator("provider_rejected", t0.Add(-time.Second))),
			rec: rec(func(*ledger.Record) {}), want: ledger.StateProcessing, forWorker: true},
		{name: "operator letter of another payload", in: intake(func(in *ledger.Intake) { operator("max_deliveries", t0)(in); in.RequestHash = other }),
			rec: rec(func(r *ledger.Record) { r.Status = ledger.StatusFailed }), want: ledger.StateRetrying, forWorker: true},
		{name: "purged key, ledger succeeded", pay: pay(ledger.PaymentSucceeded), want: ledger.StateSucceeded, completed: true, final: true},
		{name: "purged key, ledger declined", pay: pay(ledger.PaymentDeclined), want: ledger.StateDeclined, completed: true, final: true},
		{name: "purged key, ledger processing", pay: pay(ledger.PaymentProcessing), want: ledger.StateProcessing, completed: true},
		{name: "purged key, processing that failed", pay: pay(ledger.PaymentFailed), want: ledger.StateDeclined, completed: true, final: true},
		{name: "purged key, ledger row beside its intake", in: intake(none), pay: pay(ledger.PaymentSucceeded),
			want: ledger.StateSucceeded, completed: true, final: true},
		{name: "record beside its ledger row", rec: rec(completed(202)), pay: pay(ledger.PaymentSucceeded),
			want: ledger.StateProcessing, completed: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := ledger.StateOf(c.in, c.rec, c.pay)
			if st.Status != c.want || st.Rejected != c.rejected || st.Reason != c.reason || st.Completed != c.completed {
				t.Errorf("StateOf = status %q rejected %v reason %q completed %v, want %q %v %q %v",
					st.Status, st.Rejected, st.Reason, st.Completed, c.want, c.rejected, c.reason, c.completed)
			}
			if st.Final() != c.final || st.WaitsForWorker() != c.forWorker {
				t.Errorf("Final %v WaitsForWorker %v, want %v %v", st.Final(), st.WaitsForWorker(), c.final, c.forWorker)
			}
			if found := c.in != nil || c.rec != nil || c.pay != nil; st.Found() != found {
				t.Errorf("Found %v, want %v", st.Found(), found)
			}
			if st.Rejected {
				if st.IdempotencyKey != "" || st.Completed {
					t.Errorf("a rejected payment shows payment fields: %+v", st)
				}
				return
			}
			if st.Found() && (st.IdempotencyKey != "k" || st.Amount != 1000 || st.Currency != "usd") {
				t.Errorf("fields %q %d %q, want k 1000 usd", st.IdempotencyKey, st.Amount, st.Currency)
			}
		})
	}
}

// A payment's fields come from the row that decides its state: the
// record's when there is one (its outcome once completed), the ledger
// row's for a purged key, else the intake's.
func TestStateOfFields(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	in := ledger.Intake{IdempotencyKey: "k", Amount: 1, Currency: "eur", PublishedAt: t0, CreatedAt: t0,
		OperatorReason: "max_deliveries", OperatorAt: t0.Add(time.Hour)}
	rec := ledger.Record{IdempotencyKey: "k", Amount: 2, Currency: "usd", Status: ledger.StatusCompleted, ChargeID: "pi_2",
		ResponseStatus: 201, Response: json.RawMessage(`{"id":"pi_2"}`), CreatedAt: t0.Add(time.Second), CompletedAt: t0.Add(2 * time.Second)}
	st := ledger.StateOf(&in, &rec, nil)
	if st.Amount != 2 || st.ChargeID != "pi_2" || !st.CreatedAt.Equal(rec.CreatedAt) || !st.CompletedAt.Equal(rec.CompletedAt) ||
		st.ResponseStatus != 201 || string(st.Response) != `{"id":"pi_2"}` {
		t.Errorf("completed record: %+v", st)
	}
	pay := ledger.Payment{IdempotencyKey: "k", Amount: 3, Currency: "gbp", ChargeID: "pi_3", Status: ledger.PaymentSucceeded, CreatedAt: t0.Add(time.Minute)}
	st = ledger.StateOf(nil, nil, &pay)
	if st.Amount != 3 || st.ChargeID != "pi_3" || !st.CompletedAt.Equal(pay.CreatedAt) || st.ResponseStatus != 0 || st.Response != nil {
		t.Errorf("ledger row: %+v", st)
	}
	// Waiting for an operator: the record's fields when it has one, else
	// the intake's; never the record's outcome (it is not completed).
	rec.Status, rec.ResponseStatus, rec.Response, rec.UpdatedAt = ledger.StatusFailed, 0, nil, t0
	if st := ledger.StateOf(&in, &rec, nil); st.Status != ledger.StateWaitingForOperator || st.Amount != 2 || st.Completed {
		t.Errorf("operator wait with a record: %+v", st)
	}
	if st := ledger.OperatorWaitState(in, nil); st.Status != ledger.StateWaitingForOperator || st.Amount != 1 ||
		st.Currency != "eur" || !st.CreatedAt.Equal(t0) || st.Reason != "max_deliveries" {
		t.Errorf("operator wait without a record: %+v", st)
	}
	in.PublishedAt = time.Time{}
	if st := ledger.AcceptedState(in); st.Status != ledger.StateQueued || st.Amount != 1 {
		t.Errorf("accepted: %+v", st)
	}
}
