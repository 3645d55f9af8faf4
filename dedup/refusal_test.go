package dedup_test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
)

// TestRecordRefusalOnceOutsidePaymentOrder: a refusal's event is written
// once under <merchant>:<key>:refused:<stream sequence> (a second write of
// the same refusal, even with other contents, changes nothing), beside
// the events of a payment under the same key; the relay hands it out
// without waiting for the payment's events, and an unrelayed refusal
// holds back none of them (a settlement waits for its processing event
// only).
func TestRecordRefusalOnceOutsidePaymentOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	filed := b.clock.Now()
	r := ledger.Refusal{MerchantID: "m_1", IdempotencyKey: "ach", StreamSeq: 7, Reason: "invalid_amount", Amount: -5, Currency: "usd", FiledAt: filed}
	if wrote, err := b.store.RecordRefusal(b.ctx, r); err != nil || !wrote {
		t.Fatalf("record refusal: %v %v", wrote, err)
	}
	again := r
	again.Reason, again.FiledAt = "key_reused", filed.Add(time.Minute)
	if wrote, err := b.store.RecordRefusal(b.ctx, again); err != nil || wrote {
		t.Fatalf("record refusal again: %v %v, want nothing written", wrote, err)
	}
	if _, err := b.store.RecordRefusal(b.ctx, ledger.Refusal{MerchantID: "m_1", IdempotencyKey: "ach", Reason: "invalid_amount", FiledAt: filed}); err == nil {
		t.Fatal("a refusal without a stream sequence was recorded")
	}
	ach := b.claim(t, "w", req("m_1", "ach", 900)).Lease
	if err := b.store.Complete(b.ctx, *ach, ledger.Completion{ChargeID: "pi_ach", Processing: true, ResponseStatus: 202, Response: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	p, err := b.store.GetPayment(b.ctx, "m_1", "ach")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.SettlePayment(b.ctx, p, ledger.PaymentSucceeded, 200, json.RawMessage(`{}`)); err != nil {
		t.Fatal(err)
	}
	evs := b.events(t)
	if len(evs) != 3 {
		t.Fatalf("events %+v, want the refusal and the payment's two", evs)
	}
	if e := evs[0]; e.EventID != "m_1:ach:refused:7" || e.Kind != ledger.OutcomeRefused || e.Status != ledger.StatusRefused || e.Seq != 0 ||
		e.Reason != "invalid_amount" || e.Amount != -5 || e.Currency != "usd" || e.ChargeID != "" || !e.OccurredAt.Equal(filed) {
		t.Fatalf("refusal event %+v", e)
	}
	// First pass: every event but the refusal is published; the
	// settlement is not handed out, its processing event being unrelayed.
	var first []string
	if _, err := b.store.RelayOutcomes(b.ctx, 10, func(_ context.Context, events []ledger.OutcomeEvent) ([]bool, error) {
		done := make([]bool, len(events))
		for i, e := range events {
			first = append(first, e.EventID)
			done[i] = e.Kind != ledger.OutcomeRefused
		}
		return done, nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"m_1:ach:refused:7", "m_1:ach:processing"}; !equal(first, want) {
		t.Fatalf("first batch %v, want %v", first, want)
	}
	var r2 recorder
	if n, err := b.store.RelayOutcomes(b.ctx, 10, r2.publish); err != nil || n != 2 {
		t.Fatalf("second relay: %d %v", n, err)
	}
	if want := []string{"m_1:ach:refused:7", "m_1:ach:settled"}; !equal(r2.ids, want) {
		t.Fatalf("second batch %v, want %v: the unrelayed refusal must not hold the settlement back", r2.ids, want)
	}
	// The schema keeps refusals apart from the payment's order.
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO outcome_events (event_id, merchant_id, idempotency_key, seq, kind, status, amount, currency, reason, occurred_at)
		VALUES ('m_1:x:refused:1', 'm_1', 'x', 1, 'refused', 'refused', 0, '', 'invalid_amount', now())`); err == nil {
		t.Fatal("a refusal in the payment's order (seq 1) was stored")
	}
}

// TestRecordRefusalRaceWritesOne: workers writing the same refusal at
// once (a redelivery taken by another worker while the first still files
// it) write one event, and exactly one of them is told it wrote it.
func TestRecordRefusalRaceWritesOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := ledger.Refusal{MerchantID: "m_1", IdempotencyKey: "race", StreamSeq: 42, Reason: "key_reused", Amount: 100, Currency: "eur", FiledAt: b.clock.Now()}
	var (
		wg    sync.WaitGroup
		wrote atomic.Int32
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := b.store.RecordRefusal(b.ctx, r)
			if err != nil {
				t.Error(err)
			}
			if ok {
				wrote.Add(1)
			}
		}()
	}
	wg.Wait()
	if wrote.Load() != 1 || b.count(t, `SELECT count(*) FROM outcome_events WHERE event_id = 'm_1:race:refused:42'`) != 1 {
		t.Fatalf("%d writers told they wrote it, %d rows; want 1 and 1", wrote.Load(), b.count(t, `SELECT count(*) FROM outcome_events`))
	}
}

// TestRefusalEventsDownRefusesUnrelayed: migration 00026's down refuses
// while a refusal event waits to be published (no subscriber has seen it)
// and proceeds once it was relayed, leaving the payment's events.
func TestRefusalEventsDownRefusesUnrelayed(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	owner, m := migrator(t, url)
	store, err := dedup.New(owner, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cl, err := store.Claim(ctx, "h", lease, req("m_1", "paid", 100))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(ctx, *cl.Lease, charged("ch_1")); err != nil {
		t.Fatal(err)
	}
	if _, err := store.RecordRefusal(ctx, ledger.Refusal{MerchantID: "m_1", IdempotencyKey: "paid", StreamSeq: 3, Reason: "key_reused", FiledAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	downTo(t, m, 26)
	refuses(t, m, "outcome_events", "1 row", "refusal events never published")
	if _, err := owner.Exec(ctx, `UPDATE outcome_events SET relayed_at = now()`); err != nil {
		t.Fatal(err)
	}
	downTo(t, m, 25)
	if n := count(t, owner, `SELECT count(*) FROM outcome_events`); n != 1 {
		t.Fatalf("%d events after the down, want the payment's", n)
	}
}

// TestRecordWaitingOnceOutsidePaymentOrder: a command filed for an
// operator (a Waiting refusal) writes a waiting_for_operator event once
// under <merchant>:<key>:waiting_for_operator:<stream sequence>, at seq
// 0, beside the events of the payment its replay completes; migration
// 00029's down refuses while one waits to be published, and proceeds once
// it was, deleting it and keeping the payment's.
func TestRecordWaitingOnceOutsidePaymentOrder(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	owner, m := migrator(t, url)
	store, err := dedup.New(owner, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	filed := time.Now().UTC().Truncate(time.Microsecond)
	w := ledger.Refusal{MerchantID: "m_1", IdempotencyKey: "op", StreamSeq: 9, Reason: "max_deliveries", Amount: 100, Currency: "usd", FiledAt: filed, Waiting: true}
	if wrote, err := store.RecordRefusal(ctx, w); err != nil || !wrote {
		t.Fatalf("record waiting: %v %v", wrote, err)
	}
	if wrote, err := store.RecordRefusal(ctx, w); err != nil || wrote {
		t.Fatalf("record waiting again: %v %v, want nothing written", wrote, err)
	}
	cl, err := store.Claim(ctx, "h", lease, req("m_1", "op", 100))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(ctx, *cl.Lease, charged("ch_op")); err != nil {
		t.Fatal(err)
	}
	var id, kind, status, reason string
	var seq int
	if err := owner.QueryRow(ctx, `SELECT event_id, kind, status, seq, reason FROM outcome_events WHERE seq = 0`).Scan(&id, &kind, &status, &seq, &reason); err != nil {
		t.Fatal(err)
	}
	if id != "m_1:op:waiting_for_operator:9" || kind != ledger.OutcomeWaiting || status != ledger.StatusWaiting || seq != 0 || reason != "max_deliveries" {
		t.Fatalf("waiting event %s %s %s %d %s", id, kind, status, seq, reason)
	}
	if n := count(t, owner, `SELECT count(*) FROM outcome_events`); n != 2 {
		t.Fatalf("%d events, want the waiting one and the payment's", n)
	}
	downTo(t, m, 29)
	refuses(t, m, "outcome_events", "1 row", "waiting events never published")
	if _, err := owner.Exec(ctx, `UPDATE outcome_events SET relayed_at = now()`); err != nil {
		t.Fatal(err)
	}
	downTo(t, m, 28)
	if n := count(t, owner, `SELECT count(*) FROM outcome_events`); n != 1 {
		t.Fatalf("%d events after the down, want the payment's", n)
	}
}
