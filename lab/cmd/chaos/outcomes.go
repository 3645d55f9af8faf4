package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/stream"
)

// The outcome events, as a subscriber sees them: a reader of
// payments.outcomes.> follows the outcomes stream for the whole run, across
// the NATS kills and restarts, and at the end every payment of the ledger
// is checked against what it read (checkOutcomes). A payment's events:
//
//   - charged (status succeeded) or declined: its one final event;
//   - processing (status processing): not final, money may still move; a
//     settled event (status succeeded or failed) follows once the
//     reconciler or a webhook settles it, and that one is final.
//
// So a payment the ledger holds as succeeded or declined, never settled,
// has exactly one event, its charged or declined; one settled (succeeded
// or failed, settled_at set) has its processing event and then its settled
// event; one still processing has its processing event only. Each event
// carries the ledger row's status, amount and currency. A repeat of an
// event under the same event_id is the at-least-once delivery and is
// counted, never a violation; two final events of one payment are.
//
// A refused event (a command the worker dead-lettered for bad input or a
// reused key) is no payment's outcome: the refused command never bound
// its key, and a later valid command under it may be charged. So refused
// events are checked apart (checkApart) and counted, and the ledger's
// payments are judged on their own events alone. So are
// waiting_for_operator events (a command filed for an operator, migration
// 00029): not final, a payment may have one (one per stored copy of its
// command) and then, replayed, its final event.

// outcomeDrainTimeout bounds the wait, at the end, for the relay to
// publish (and the reader to read) the events of every payment.
const outcomeDrainTimeout = time.Minute

// seenOutcome is one message read from the outcomes stream.
type seenOutcome struct {
	streamSeq uint64
	msgID     string // its Nats-Msg-Id
	event     stream.OutcomeEvent
	bad       string // why its body could not be read as an event
}

// outcomeWatch reads the outcomes stream from its first message to its
// last, resuming after its last read sequence whenever the reader fails
// (NATS killed, the stream's node down).
type outcomeWatch struct {
	mu      sync.Mutex
	seen    []seenOutcome
	next    uint64 // the next stream sequence to read
	resumes int    // times the reader started again after a failure
}

// follow reads the stream named name until ctx ends.
func (w *outcomeWatch) follow(ctx context.Context, js jetstream.JetStream, name string) {
	for ctx.Err() == nil {
		w.mu.Lock()
		cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
		if w.next > 1 {
			cfg = jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: w.next}
		}
		w.mu.Unlock()
		cons, err := js.OrderedConsumer(ctx, name, cfg)
		for err == nil && ctx.Err() == nil {
			var m jetstream.Msg
			m, err = cons.Next(jetstream.FetchMaxWait(time.Second))
			if errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoMessages) {
				err = nil
				continue
			}
			if err == nil {
				err = w.record(m)
			}
		}
		if ctx.Err() != nil {
			return
		}
		w.mu.Lock()
		w.resumes++
		w.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// record keeps m, unless the reader has read its sequence already (a
// resumed reader may read the last one again).
func (w *outcomeWatch) record(m jetstream.Msg) error {
	md, err := m.Metadata()
	if err != nil {
		return fmt.Errorf("outcome message without metadata: %w", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if md.Sequence.Stream < w.next {
		return nil
	}
	s := seenOutcome{streamSeq: md.Sequence.Stream, msgID: m.Headers().Get(nats.MsgIdHdr)}
	if s.event, err = stream.DecodeOutcomeEvent(m.Data()); err != nil {
		s.bad = err.Error()
	}
	w.seen = append(w.seen, s)
	w.next = md.Sequence.Stream + 1
	return nil
}

// snapshot is what was read so far, in stream order.
func (w *outcomeWatch) snapshot() (seen []seenOutcome, next uint64, resumes int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.seen), w.next, w.resumes
}

// ledgerPayment is a ledger row as the outcome check needs it.
type ledgerPayment struct {
	status   string // succeeded, declined, processing, failed
	amount   int64
	currency string
	chargeID string
	settled  bool // a processing payment settled later (settled_at set)
	// authorized: an authorization (capture_method manual), as it stands
	// (authorized), or moved since by its capture or cancel; its one
	// event is its authorized one, the capture's or cancel's its own.
	authorized bool
}

// expectedKinds are the events a ledger row must have, in order.
func (p ledgerPayment) expectedKinds() []string {
	switch {
	case p.authorized:
		return []string{ledger.OutcomeAuthorized}
	case p.settled:
		return []string{ledger.OutcomeProcessing, ledger.OutcomeSettled}
	case p.status == ledger.PaymentSucceeded:
		return []string{ledger.OutcomeCharged}
	case p.status == ledger.PaymentDeclined:
		return []string{ledger.OutcomeDeclined}
	case p.status == ledger.PaymentProcessing:
		return []string{ledger.OutcomeProcessing}
	}
	return nil // failed without a settlement: the schema forbids it
}

// finalKind reports whether an event of kind is a payment's final one.
func finalKind(kind string) bool {
	return kind == ledger.OutcomeCharged || kind == ledger.OutcomeDeclined || kind == ledger.OutcomeSettled || kind == ledger.OutcomeAuthorized
}

// eventShape is the seq and statuses each kind of event may carry.
var eventShape = map[string]struct {
	seq      int
	statuses []string
}{
	ledger.OutcomeCharged:    {1, []string{ledger.PaymentSucceeded}},
	ledger.OutcomeDeclined:   {1, []string{ledger.PaymentDeclined}},
	ledger.OutcomeProcessing: {1, []string{ledger.PaymentProcessing}},
	ledger.OutcomeSettled:    {2, []string{ledger.PaymentSucceeded, ledger.PaymentFailed}},
	ledger.OutcomeAuthorized: {1, []string{ledger.PaymentAuthorized}},
}

// ledgerOp is a refund's, a capture's or a cancel's row (refunds,
// payment_ops) as the outcome check needs it.
type ledgerOp struct {
	kind     string // refund, capture, cancel
	status   string // the row's
	amount   int64  // its amount; a succeeded capture's what it received
	currency string
}

// expectedKind is the final event an operation's row calls for, with its
// status; "" while it is not final.
func (o ledgerOp) expectedKind() (kind, status string) {
	switch {
	case o.kind == "refund" && o.status == "succeeded":
		return ledger.OutcomeRefunded, "succeeded"
	case o.kind == "refund" && (o.status == "failed" || o.status == "refused"):
		return ledger.OutcomeRefundFailed, o.status
	case o.kind == "capture" && o.status == "succeeded":
		return ledger.OutcomeCaptured, "succeeded"
	case o.kind == "cancel" && o.status == "succeeded":
		return ledger.OutcomeCanceled, "canceled"
	case o.status == "refused":
		return o.kind + "_failed", "refused"
	}
	return "", ""
}

// opKinds are the events of operations, seq 3, under their own keys.
var opKinds = []string{ledger.OutcomeRefunded, ledger.OutcomeRefundFailed, ledger.OutcomeCaptured, ledger.OutcomeCanceled,
	ledger.OutcomeCaptureFailed, ledger.OutcomeCancelFailed}

// outcomeVerdict is the outcome check of a run.
type outcomeVerdict struct {
	events, distinct, duplicates int // messages read, distinct event ids, repeats of an id
	refused                      int // distinct refused events
	waiting                      int // distinct waiting_for_operator events
	payments, final              int // ledger rows, and those whose outcome is final
	operations, opEvents         int // final operation rows, and their distinct events
	missing                      []string
	broken                       []string
}

func (v outcomeVerdict) ok() bool { return len(v.missing) == 0 && len(v.broken) == 0 }

// checkOutcomes judges the events read (in stream order) against the
// ledger (by "merchant:key"): every ledger row has the events its state
// calls for, once each (a repeat under the same event_id aside), with its
// status, amount and currency, in order; no payment has two final events;
// no event names a payment the ledger lacks. So with the operations
// (ops, by their own "merchant:key"): each final one has its one event
// (seq 3), of its kind, status, amount and currency; none has two; no
// operation's event names one the ledger lacks or that is not final.
func checkOutcomes(seen []seenOutcome, rows map[string]ledgerPayment, ops map[string]ledgerOp) outcomeVerdict {
	var v outcomeVerdict
	broke := func(format string, args ...any) { v.broken = append(v.broken, fmt.Sprintf(format, args...)) }
	first := map[string]stream.OutcomeEvent{}   // by event id
	kinds := map[string][]stream.OutcomeEvent{} // by payment, distinct, in stream order
	opEvents := map[string][]string{}           // by operation, distinct kinds
	for _, s := range seen {
		v.events++
		if s.bad != "" {
			broke("stream seq %d: %s", s.streamSeq, s.bad)
			continue
		}
		e := s.event
		if prev, ok := first[e.EventID]; ok {
			v.duplicates++
			same := prev
			same.OccurredAt = e.OccurredAt // compared by Equal: a decoded time has no monotonic reading
			if same != e || !prev.OccurredAt.Equal(e.OccurredAt) {
				broke("event %s published twice with different contents: %+v, then %+v", e.EventID, prev, e)
			}
			continue
		}
		first[e.EventID] = e
		v.distinct++
		if status, ok := apart[e.Kind]; ok {
			if e.Kind == ledger.OutcomeRefused {
				v.refused++
			} else {
				v.waiting++
			}
			if why := checkApart(s.msgID, e, status); why != "" {
				broke("event %s: %s", e.EventID, why)
			}
			continue
		}
		payment := e.MerchantID + ":" + e.IdempotencyKey
		if want := payment + ":" + e.Kind; e.EventID != want || s.msgID != e.EventID {
			broke("event %s (Nats-Msg-Id %q): want the id %s", e.EventID, s.msgID, want)
		}
		if slices.Contains(opKinds, e.Kind) {
			v.opEvents++
			opEvents[payment] = append(opEvents[payment], e.Kind)
			op, ok := ops[payment]
			kind, status := op.expectedKind()
			switch {
			case !ok:
				broke("event %s: an operation the ledger lacks", e.EventID)
			case e.Seq != 3:
				broke("event %s: seq %d, want 3", e.EventID, e.Seq)
			case kind == "":
				broke("event %s: the ledger's %s is %s, not final", e.EventID, op.kind, op.status)
			case e.Kind != kind || e.Status != status || e.Amount != op.amount || e.Currency != op.currency:
				broke("event %s: %s %s %d %s, the ledger's %s %s %d %s (want %s)", e.EventID, e.Kind, e.Status, e.Amount, e.Currency,
					op.kind, op.status, op.amount, op.currency, kind)
			}
			continue
		}
		shape, ok := eventShape[e.Kind]
		switch {
		case !ok:
			broke("event %s: unknown kind %q", e.EventID, e.Kind)
		case e.Seq != shape.seq || !slices.Contains(shape.statuses, e.Status):
			broke("event %s: kind %s with seq %d and status %s", e.EventID, e.Kind, e.Seq, e.Status)
		}
		if ev := kinds[payment]; len(ev) > 0 && ev[len(ev)-1].Seq >= e.Seq {
			broke("payment %s: event %s (seq %d) after %s (seq %d): out of order", payment, e.Kind, e.Seq, ev[len(ev)-1].Kind, ev[len(ev)-1].Seq)
		}
		kinds[payment] = append(kinds[payment], e)
		row, ok := rows[payment]
		if !ok {
			broke("event %s: a payment the ledger lacks", e.EventID)
			continue
		}
		status := row.status
		switch e.Kind {
		case ledger.OutcomeProcessing:
			status = ledger.PaymentProcessing // what it left then; a settlement moved it on
		case ledger.OutcomeAuthorized:
			status = ledger.PaymentAuthorized // what it left then; a capture or a cancel moved it on
		}
		if e.Status != status || e.Amount != row.amount || e.Currency != row.currency {
			broke("event %s: %s %d %s, the ledger %s %d %s", e.EventID, e.Status, e.Amount, e.Currency, row.status, row.amount, row.currency)
		}
		if finalKind(e.Kind) && e.ChargeID != "" && row.chargeID != "" && e.ChargeID != row.chargeID {
			broke("event %s: charge %s, the ledger %s", e.EventID, e.ChargeID, row.chargeID)
		}
	}
	for _, payment := range slices.Sorted(maps.Keys(rows)) {
		row := rows[payment]
		v.payments++
		want := row.expectedKinds()
		if row.status != ledger.PaymentProcessing {
			v.final++
		}
		var got, finals []string
		for _, e := range kinds[payment] {
			got = append(got, e.Kind)
			if finalKind(e.Kind) {
				finals = append(finals, e.Kind)
			}
		}
		if len(finals) > 1 {
			broke("payment %s: %d final events (%s)", payment, len(finals), strings.Join(finals, ", "))
		}
		for _, k := range got {
			if !slices.Contains(want, k) {
				broke("payment %s: a %s event, but the ledger holds it %s (settled %v)", payment, k, row.status, row.settled)
			}
		}
		var lacking []string
		for _, k := range want {
			if !slices.Contains(got, k) {
				lacking = append(lacking, k)
			}
		}
		if len(lacking) > 0 {
			v.missing = append(v.missing, fmt.Sprintf("%s: no %s event (ledger %s %d %s, settled %v; events read: %s)",
				payment, strings.Join(lacking, " or "), row.status, row.amount, row.currency, row.settled, or(strings.Join(got, ", "), "none")))
		}
	}
	for _, key := range slices.Sorted(maps.Keys(ops)) {
		op := ops[key]
		kind, _ := op.expectedKind()
		if kind == "" {
			continue
		}
		v.operations++
		got := opEvents[key]
		switch {
		case len(got) > 1:
			broke("operation %s: %d final events (%s)", key, len(got), strings.Join(got, ", "))
		case len(got) == 0:
			v.missing = append(v.missing, fmt.Sprintf("%s: no %s event (its %s %s %d %s)", key, kind, op.kind, op.status, op.amount, op.currency))
		}
	}
	slices.Sort(v.broken)
	return v
}

// apart are the kinds of event checked apart from the payments' (by
// checkApart), with the status each must carry.
var apart = map[string]string{ledger.OutcomeRefused: ledger.StatusRefused, ledger.OutcomeWaiting: ledger.StatusWaiting}

// checkApart says what is wrong with a refused or waiting_for_operator
// event read under the message id msgID ("" when nothing is): its id is
// <merchant>:<key>:<kind>:<stream sequence> and the message's, its seq 0
// (outside any payment's order), its status status, with the dead
// letter's reason and no charge.
func checkApart(msgID string, e stream.OutcomeEvent, status string) string {
	seq, ok := strings.CutPrefix(e.EventID, e.MerchantID+":"+e.IdempotencyKey+":"+e.Kind+":")
	n, err := strconv.ParseUint(seq, 10, 64)
	switch {
	case !ok || err != nil || n == 0 || strconv.FormatUint(n, 10) != seq:
		return "want the id " + e.MerchantID + ":" + e.IdempotencyKey + ":" + e.Kind + ":<stream sequence>"
	case msgID != e.EventID:
		return fmt.Sprintf("published under Nats-Msg-Id %q", msgID)
	case e.Seq != 0 || e.Status != status:
		return fmt.Sprintf("%s with seq %d and status %s", e.Kind, e.Seq, e.Status)
	case e.Reason == "" || e.ChargeID != "":
		return fmt.Sprintf("%s with reason %q and charge %q", e.Kind, e.Reason, e.ChargeID)
	}
	return ""
}

// checkOutcomeEvents waits (at most outcomeDrainTimeout) until the reader
// has read the events of every payment of the ledger, then judges them.
func (h *harness) checkOutcomeEvents(ctx context.Context) error {
	pool, err := pg.Connect(ctx, h.dbURL("postgres", "paydedup"))
	if err != nil {
		return err
	}
	defer pool.Close()
	readLedger := func() (map[string]ledgerPayment, error) {
		rows, err := pool.Query(ctx, `SELECT merchant_id, idempotency_key, status, amount, currency, coalesce(charge_id, ''), settled_at IS NOT NULL,
				status IN ('authorized', 'canceled') OR EXISTS (SELECT 1 FROM payment_ops o WHERE o.merchant_id = p.merchant_id
					AND o.payment_key = p.idempotency_key AND o.kind = 'capture' AND o.status = 'succeeded')
			FROM payments p`)
		if err != nil {
			return nil, fmt.Errorf("read the ledger: %w", err)
		}
		defer rows.Close()
		out := map[string]ledgerPayment{}
		for rows.Next() {
			var merchant, key string
			var p ledgerPayment
			if err := rows.Scan(&merchant, &key, &p.status, &p.amount, &p.currency, &p.chargeID, &p.settled, &p.authorized); err != nil {
				return nil, err
			}
			out[merchant+":"+key] = p
		}
		return out, rows.Err()
	}
	readOps := func() (map[string]ledgerOp, error) {
		rows, err := pool.Query(ctx, `SELECT merchant_id, idempotency_key, 'refund', status, amount, currency FROM refunds
			UNION ALL SELECT merchant_id, idempotency_key, kind, status, CASE WHEN kind = 'capture' AND status = 'succeeded' THEN amount_received ELSE amount END, currency FROM payment_ops`)
		if err != nil {
			return nil, fmt.Errorf("read the operations: %w", err)
		}
		defer rows.Close()
		out := map[string]ledgerOp{}
		for rows.Next() {
			var merchant, key string
			var o ledgerOp
			if err := rows.Scan(&merchant, &key, &o.kind, &o.status, &o.amount, &o.currency); err != nil {
				return nil, err
			}
			out[merchant+":"+key] = o
		}
		return out, rows.Err()
	}
	deadline := time.Now().Add(outcomeDrainTimeout)
	var v outcomeVerdict
	for {
		rows, err := readLedger()
		if err != nil {
			return err
		}
		ops, err := readOps()
		if err != nil {
			return err
		}
		seen, _, _ := h.outcomes.snapshot()
		v = checkOutcomes(seen, rows, ops)
		if len(v.missing) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
	if len(v.missing) > 0 {
		var unrelayed int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM outcome_events WHERE relayed_at IS NULL`).Scan(&unrelayed); err != nil {
			unrelayed = -1
		}
		_, next, _ := h.outcomes.snapshot()
		last := uint64(0)
		if s, err := h.js.Stream(ctx, h.streamConfig().Stream.OutcomeStream); err == nil {
			if info, err := s.Info(ctx); err == nil {
				last = info.State.LastSeq
			}
		}
		v.broken = append(v.broken, fmt.Sprintf("the outcome events of %d payments did not arrive within %v of the run's end: %d events left unrelayed in the outbox; the reader read up to stream seq %d of %d",
			len(v.missing), outcomeDrainTimeout, unrelayed, next-1, last))
	}
	h.outcomeVerdict, h.outcomesChecked = v, true
	return nil
}

// reportOutcomes prints the outcome check's violations and its summary;
// it returns whether the check passed.
func (h *harness) reportOutcomes() bool {
	if !h.outcomesChecked {
		fmt.Fprintln(h.out, "chaos: VIOLATION outcome: the outcome events were not checked")
		return false
	}
	v := h.outcomeVerdict
	for _, list := range []struct {
		what  string
		items []string
	}{{"outcome missing", v.missing}, {"outcome", v.broken}} {
		for i, it := range list.items {
			if i == 50 {
				fmt.Fprintf(h.out, "chaos: VIOLATION %s: … and %d more\n", list.what, len(list.items)-50)
				break
			}
			fmt.Fprintf(h.out, "chaos: VIOLATION %s: %s\n", list.what, it)
		}
	}
	_, _, resumes := h.outcomes.snapshot()
	fmt.Fprintf(h.out, "chaos: outcome events: read=%d distinct=%d duplicates_by_id=%d payments=%d final=%d refused=%d missing=%d broken=%d reader_resumes=%d waiting_for_operator=%d operations=%d operation_events=%d\n",
		v.events, v.distinct, v.duplicates, v.payments, v.final, v.refused, len(v.missing), len(v.broken), resumes, v.waiting, v.operations, v.opEvents)
	return v.ok()
}

func (h *harness) outcomeSummary() string {
	if !h.outcomesChecked {
		return ""
	}
	v := h.outcomeVerdict
	return fmt.Sprintf(" outcome_events=%d outcome_refused=%d outcome_duplicates=%d outcome_missing=%d outcome_broken=%d outcome_waiting=%d", v.distinct, v.refused, v.duplicates, len(v.missing), len(v.broken), v.waiting)
}
