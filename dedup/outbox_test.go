package dedup_test

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/ledger"
)

// events returns the outbox's events, in the outbox's order.
func (b *bundle) events(t *testing.T) []ledger.OutcomeEvent {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT id, event_id, merchant_id, idempotency_key, seq, kind, status, amount, currency,
		coalesce(charge_id, ''), coalesce(reason, ''), occurred_at, relayed_at IS NOT NULL FROM outcome_events ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []ledger.OutcomeEvent
	for rows.Next() {
		var (
			e       ledger.OutcomeEvent
			seq     int16
			relayed bool
		)
		if err := rows.Scan(&e.ID, &e.EventID, &e.MerchantID, &e.IdempotencyKey, &seq, &e.Kind, &e.Status, &e.Amount, &e.Currency,
			&e.ChargeID, &e.Reason, &e.OccurredAt, &relayed); err != nil {
			t.Fatal(err)
		}
		e.Seq = int(seq)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestOutcomeEventWithEachOutcome: every final outcome the ledger records
// writes exactly one outcome event with it, and an outcome that is not
// recorded (a stale lease's completion, a ledger conflict rolled back)
// writes none; a retried completion writes no second. Without the
// outbox's triggers (migration 00022) the outbox stays empty and this
// fails.
func TestOutcomeEventWithEachOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	charge := b.claim(t, "w", req("m_1", "charge", 1000)).Lease
	if err := b.store.Complete(b.ctx, *charge, charged("pi_1")); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Complete(b.ctx, *charge, charged("pi_1")); err != nil {
		t.Fatalf("retried completion: %v", err)
	}
	stale := *b.claim(t, "w", req("m_1", "stale", 1000)).Lease
	stale.Attempt++
	if err := b.store.Complete(b.ctx, stale, charged("pi_stale")); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Fatalf("stale completion: %v, want ErrLeaseLost", err)
	}
	decline := b.claim(t, "w", req("m_2", "decline", 700)).Lease
	ach := b.claim(t, "w", req("m_2", "ach", 900)).Lease
	dup1 := b.claim(t, "w", req("m_2", "dup1", 900)).Lease
	dup2 := b.claim(t, "w", req("m_2", "dup2", 900)).Lease
	declined := ledger.Completion{Declined: true, ResponseStatus: 402,
		Response: json.RawMessage(`{"error":{"type":"card_error","code":"card_declined","decline_code":"insufficient_funds"}}`)}
	errs, err := b.store.CompleteBatch(b.ctx, []ledger.CompleteItem{
		{Lease: *decline, Completion: declined},
		{Lease: *ach, Completion: ledger.Completion{ChargeID: "pi_ach", Processing: true, ResponseStatus: 202, Response: json.RawMessage(`{"id":"pi_ach","status":"processing"}`)}},
		// Two keys under one charge id: the batch fails on the ledger and
		// falls back to one by one; the second is refused and rolled back.
		{Lease: *dup1, Completion: charged("pi_dup")},
		{Lease: *dup2, Completion: charged("pi_dup")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil || errs[1] != nil || errs[2] != nil || !errors.Is(errs[3], ledger.ErrLedgerConflict) {
		t.Fatalf("batch: %v", errs)
	}
	p, err := b.store.GetPayment(b.ctx, "m_2", "ach")
	if err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Minute)
	if err := b.store.SettlePayment(b.ctx, p, ledger.PaymentFailed, 402, json.RawMessage(`{"last_payment_error":{"code":"debit_returned"}}`)); err != nil {
		t.Fatal(err)
	}
	if err := b.store.SettlePayment(b.ctx, p, ledger.PaymentSucceeded, 200, json.RawMessage(`{}`)); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("second settlement: %v", err)
	}

	got := map[string]ledger.OutcomeEvent{}
	for _, e := range b.events(t) {
		if _, dup := got[e.EventID]; dup {
			t.Fatalf("event %s written twice", e.EventID)
		}
		got[e.EventID] = e
	}
	want := map[string]struct {
		seq                          int
		kind, status, charge, reason string
		amount                       int64
	}{
		"m_1:charge:charged":   {1, ledger.OutcomeCharged, ledger.PaymentSucceeded, "pi_1", "", 1000},
		"m_2:decline:declined": {1, ledger.OutcomeDeclined, ledger.PaymentDeclined, "", "insufficient_funds", 700},
		"m_2:ach:processing":   {1, ledger.OutcomeProcessing, ledger.PaymentProcessing, "pi_ach", "", 900},
		"m_2:ach:settled":      {2, ledger.OutcomeSettled, ledger.PaymentFailed, "pi_ach", "debit_returned", 900},
		"m_2:dup1:charged":     {1, ledger.OutcomeCharged, ledger.PaymentSucceeded, "pi_dup", "", 900},
	}
	if len(got) != len(want) {
		ids := make([]string, 0, len(got))
		for id := range got {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		t.Fatalf("events %v, want the %d of the recorded outcomes", ids, len(want))
	}
	for id, w := range want {
		e, ok := got[id]
		if !ok {
			t.Fatalf("no event %s", id)
		}
		if e.Seq != w.seq || e.Kind != w.kind || e.Status != w.status || e.ChargeID != w.charge || e.Reason != w.reason ||
			e.Amount != w.amount || e.Currency != "usd" || e.OccurredAt.IsZero() {
			t.Errorf("event %s: %+v, want %+v", id, e, w)
		}
	}
	if !got["m_2:ach:settled"].OccurredAt.Equal(b.clock.Now()) {
		t.Errorf("settled at %v, want the settlement's time %v", got["m_2:ach:settled"].OccurredAt, b.clock.Now())
	}
}

// publishAll reports every event published and records them.
type recorder struct {
	mu  sync.Mutex
	ids []string
}

func (r *recorder) publish(_ context.Context, events []ledger.OutcomeEvent) ([]bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	done := make([]bool, len(events))
	for i, e := range events {
		r.ids = append(r.ids, e.EventID)
		done[i] = true
	}
	return done, nil
}

// TestRelayOutcomesMarksWhatWasPublished: RelayOutcomes marks relayed only
// the events publish confirmed; a failed publish marks none; a payment's
// second event is not handed out while its first is unrelayed; relayed
// events are purged after the retention, unrelayed ones never.
func TestRelayOutcomesMarksWhatWasPublished(t *testing.T) {
	t.Parallel()
	b := setup(t)
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
	for _, k := range []string{"a", "b"} {
		l := b.claim(t, "w", req("m_1", k, 100)).Lease
		if err := b.store.Complete(b.ctx, *l, charged("pi_"+k)); err != nil {
			t.Fatal(err)
		}
	}
	boom := errors.New("no connection")
	if _, err := b.store.RelayOutcomes(b.ctx, 10, func(context.Context, []ledger.OutcomeEvent) ([]bool, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("failed publish: %v", err)
	}
	var first []string
	n, err := b.store.RelayOutcomes(b.ctx, 10, func(_ context.Context, events []ledger.OutcomeEvent) ([]bool, error) {
		done := make([]bool, len(events))
		for i, e := range events {
			first = append(first, e.EventID)
			done[i] = e.IdempotencyKey != "b" // b's PubAck was lost
		}
		return done, nil
	})
	if err != nil || n != 2 {
		t.Fatalf("relay: %d %v, want 2 marked", n, err)
	}
	if want := []string{"m_1:ach:processing", "m_1:a:charged", "m_1:b:charged"}; !equal(first, want) {
		t.Fatalf("first batch %v, want %v (the settlement waits for the processing event)", first, want)
	}
	var r recorder
	if n, err := b.store.RelayOutcomes(b.ctx, 10, r.publish); err != nil || n != 2 {
		t.Fatalf("second relay: %d %v", n, err)
	}
	if want := []string{"m_1:ach:settled", "m_1:b:charged"}; !equal(r.ids, want) {
		t.Fatalf("second batch %v, want %v", r.ids, want)
	}
	if n, err := b.store.RelayOutcomes(b.ctx, 10, r.publish); err != nil || n != 0 {
		t.Fatalf("third relay: %d %v, want nothing left", n, err)
	}
	backlog, err := b.store.OutcomeBacklog(b.ctx)
	if err != nil || backlog.Unrelayed != 0 || !backlog.Oldest.IsZero() {
		t.Fatalf("backlog %+v %v", backlog, err)
	}
	l := b.claim(t, "w", req("m_1", "late", 100)).Lease
	if err := b.store.Complete(b.ctx, *l, charged("pi_late")); err != nil {
		t.Fatal(err)
	}
	if backlog, err = b.store.OutcomeBacklog(b.ctx); err != nil || backlog.Unrelayed != 1 || !backlog.Oldest.Equal(b.clock.Now()) {
		t.Fatalf("backlog %+v %v, want the late event", backlog, err)
	}
	if n, err := b.store.PurgeOutcomes(b.ctx, time.Hour, 100); err != nil || n != 0 {
		t.Fatalf("purge before the retention: %d %v", n, err)
	}
	b.clock.Advance(2 * time.Hour)
	if n, err := b.store.PurgeOutcomes(b.ctx, time.Hour, 100); err != nil || n != 4 {
		t.Fatalf("purge: %d %v, want the 4 relayed events", n, err)
	}
	if evs := b.events(t); len(evs) != 1 || evs[0].EventID != "m_1:late:charged" {
		t.Fatalf("left %+v, want the unrelayed event", evs)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestRelayOutcomesSkipsHeldEvents: while one relay holds a batch (its
// publish is under way), another takes only the other events, and every
// event is marked once.
func TestRelayOutcomesSkipsHeldEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, k := range []string{"a", "b", "c", "d"} {
		l := b.claim(t, "w", req("m_1", k, 100)).Lease
		if err := b.store.Complete(b.ctx, *l, charged("pi_"+k)); err != nil {
			t.Fatal(err)
		}
	}
	held, release := make(chan []string, 1), make(chan struct{})
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	defer letGo() // a failure below must not leave the first relay's session open
	errc := make(chan error, 1)
	go func() {
		_, err := b.store.RelayOutcomes(b.ctx, 2, func(_ context.Context, events []ledger.OutcomeEvent) ([]bool, error) {
			var ids []string
			for _, e := range events {
				ids = append(ids, e.EventID)
			}
			held <- ids
			<-release
			return []bool{true, true}, nil
		})
		errc <- err
	}()
	first := <-held
	var r recorder
	if n, err := b.store.RelayOutcomes(b.ctx, 10, r.publish); err != nil || n != 2 {
		t.Fatalf("second relay: %d %v", n, err)
	}
	letGo()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, id := range append(first, r.ids...) {
		if seen[id] {
			t.Fatalf("event %s handed to both relays (first %v, second %v)", id, first, r.ids)
		}
		seen[id] = true
	}
	if b.count(t, `SELECT count(*) FROM outcome_events WHERE relayed_at IS NULL`) != 0 || len(seen) != 4 {
		t.Fatalf("seen %v; some event left unrelayed", seen)
	}
}
