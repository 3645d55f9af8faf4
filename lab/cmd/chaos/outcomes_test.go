package main

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/stream"
)

var outcomeAt = time.Date(2026, 12, 7, 6, 0, 0, 0, time.UTC)

// outcome is the event of kind for payment "m:<key>" as the relay would
// publish it, with status and amount.
func outcome(key, kind, status string, amount int64) seenOutcome {
	seq := 1
	if kind == ledger.OutcomeSettled {
		seq = 2
	}
	id := "m:" + key + ":" + kind
	return seenOutcome{msgID: id, event: stream.OutcomeEvent{Schema: stream.OutcomeSchema, EventID: id, MerchantID: "m",
		IdempotencyKey: key, Seq: seq, Kind: kind, Status: status, Amount: amount, Currency: "usd", OccurredAt: outcomeAt}}
}

// refusal is the refused event of a command under "m:<key>" at stream
// sequence seq, with reason.
func refusal(key string, seq int, reason string) seenOutcome {
	id := "m:" + key + ":refused:" + strconv.Itoa(seq)
	return seenOutcome{msgID: id, event: stream.OutcomeEvent{Schema: stream.OutcomeSchema, EventID: id, MerchantID: "m",
		IdempotencyKey: key, Kind: ledger.OutcomeRefused, Status: ledger.StatusRefused, Reason: reason, Amount: 5, Currency: "usd", OccurredAt: outcomeAt}}
}

// waitingEvent is the waiting_for_operator event of a command under
// "m:<key>" at stream sequence seq, with reason.
func waitingEvent(key string, seq int, reason string) seenOutcome {
	id := "m:" + key + ":waiting_for_operator:" + strconv.Itoa(seq)
	return seenOutcome{msgID: id, event: stream.OutcomeEvent{Schema: stream.OutcomeSchema, EventID: id, MerchantID: "m",
		IdempotencyKey: key, Kind: ledger.OutcomeWaiting, Status: ledger.StatusWaiting, Reason: reason, Amount: 100, Currency: "usd", OccurredAt: outcomeAt}}
}

// TestCheckOutcomes plants each way the outcome events can break their
// promise (a final event missing, two final events, one that does not
// match the ledger, one for a payment the ledger lacks, out of order, an
// id repeated with other contents) and checks the check sees it; a repeat
// under the same id, and a processing event followed by its settlement,
// pass. Refused events are checked apart: beside a payment's events, or
// for a key the ledger lacks, they pass (counted); a refused event never
// stands in for a payment's final event; a malformed one, or one repeated
// under its id with other contents, is caught.
func TestCheckOutcomes(t *testing.T) {
	succeeded := ledgerPayment{status: ledger.PaymentSucceeded, amount: 100, currency: "usd"}
	declined := ledgerPayment{status: ledger.PaymentDeclined, amount: 100, currency: "usd"}
	processing := ledgerPayment{status: ledger.PaymentProcessing, amount: 100, currency: "usd"}
	settledOK := ledgerPayment{status: ledger.PaymentSucceeded, amount: 100, currency: "usd", settled: true}
	settledFailed := ledgerPayment{status: ledger.PaymentFailed, amount: 100, currency: "usd", settled: true}
	charged := outcome("a", ledger.OutcomeCharged, ledger.PaymentSucceeded, 100)
	for _, tc := range []struct {
		name       string
		ledger     map[string]ledgerPayment
		seen       []seenOutcome
		missing    string // a substring of one missing line
		broken     string // a substring of one broken line
		duplicates int
		refused    int
		waiting    int
	}{
		{name: "charged once", ledger: map[string]ledgerPayment{"m:a": succeeded}, seen: []seenOutcome{charged}},
		{name: "declined once", ledger: map[string]ledgerPayment{"m:a": declined},
			seen: []seenOutcome{outcome("a", ledger.OutcomeDeclined, ledger.PaymentDeclined, 100)}},
		{name: "a repeat by id", ledger: map[string]ledgerPayment{"m:a": succeeded}, seen: []seenOutcome{charged, charged}, duplicates: 1},
		{name: "processing, then settled", ledger: map[string]ledgerPayment{"m:a": settledOK, "m:b": settledFailed}, seen: []seenOutcome{
			outcome("a", ledger.OutcomeProcessing, ledger.PaymentProcessing, 100), outcome("b", ledger.OutcomeProcessing, ledger.PaymentProcessing, 100),
			outcome("b", ledger.OutcomeSettled, ledger.PaymentFailed, 100), outcome("a", ledger.OutcomeSettled, ledger.PaymentSucceeded, 100)}},
		{name: "still processing", ledger: map[string]ledgerPayment{"m:a": processing},
			seen: []seenOutcome{outcome("a", ledger.OutcomeProcessing, ledger.PaymentProcessing, 100)}},

		{name: "final event missing", ledger: map[string]ledgerPayment{"m:a": succeeded, "m:b": succeeded}, seen: []seenOutcome{charged},
			missing: "m:b: no charged event"},
		{name: "settlement missing", ledger: map[string]ledgerPayment{"m:a": settledOK},
			seen: []seenOutcome{outcome("a", ledger.OutcomeProcessing, ledger.PaymentProcessing, 100)}, missing: "m:a: no settled event"},
		{name: "two final events", ledger: map[string]ledgerPayment{"m:a": succeeded},
			seen: []seenOutcome{charged, outcome("a", ledger.OutcomeDeclined, ledger.PaymentDeclined, 100)}, broken: "2 final events"},
		{name: "a settled payment charged too", ledger: map[string]ledgerPayment{"m:a": settledOK}, seen: []seenOutcome{
			outcome("a", ledger.OutcomeProcessing, ledger.PaymentProcessing, 100), charged, outcome("a", ledger.OutcomeSettled, ledger.PaymentSucceeded, 100)},
			broken: "a charged event, but the ledger holds it succeeded (settled true)"},
		{name: "amount differs", ledger: map[string]ledgerPayment{"m:a": succeeded},
			seen: []seenOutcome{outcome("a", ledger.OutcomeCharged, ledger.PaymentSucceeded, 99)}, broken: "succeeded 99 usd, the ledger succeeded 100 usd"},
		{name: "currency differs", ledger: map[string]ledgerPayment{"m:a": {status: ledger.PaymentSucceeded, amount: 100, currency: "eur"}},
			seen: []seenOutcome{charged}, broken: "the ledger succeeded 100 eur"},
		{name: "status differs", ledger: map[string]ledgerPayment{"m:a": settledFailed}, seen: []seenOutcome{
			outcome("a", ledger.OutcomeProcessing, ledger.PaymentProcessing, 100), outcome("a", ledger.OutcomeSettled, ledger.PaymentSucceeded, 100)},
			broken: "succeeded 100 usd, the ledger failed 100 usd"},
		{name: "a payment the ledger lacks", ledger: map[string]ledgerPayment{}, seen: []seenOutcome{charged}, broken: "a payment the ledger lacks"},
		{name: "settled before processing", ledger: map[string]ledgerPayment{"m:a": settledOK}, seen: []seenOutcome{
			outcome("a", ledger.OutcomeSettled, ledger.PaymentSucceeded, 100), outcome("a", ledger.OutcomeProcessing, ledger.PaymentProcessing, 100)},
			broken: "out of order"},
		{name: "an id repeated with other contents", ledger: map[string]ledgerPayment{"m:a": succeeded},
			seen: []seenOutcome{charged, outcome("a", ledger.OutcomeCharged, ledger.PaymentSucceeded, 101)}, broken: "published twice with different contents", duplicates: 1},
		{name: "a message id that is not the event's", ledger: map[string]ledgerPayment{"m:a": succeeded},
			seen: []seenOutcome{{msgID: "m:a", event: charged.event}}, broken: "want the id m:a:charged"},
		{name: "a body that is not an event", ledger: map[string]ledgerPayment{"m:a": succeeded},
			seen: []seenOutcome{charged, {streamSeq: 9, bad: "decode outcome event: schema \"x\""}}, broken: "stream seq 9: decode outcome event"},

		{name: "a refusal beside the payment's charge", ledger: map[string]ledgerPayment{"m:a": succeeded},
			seen: []seenOutcome{refusal("a", 3, "key_reused"), charged, refusal("a", 9, "invalid_amount")}, refused: 2},
		{name: "a refusal of a key the ledger lacks", ledger: map[string]ledgerPayment{}, seen: []seenOutcome{refusal("z", 4, "invalid_amount")}, refused: 1},
		{name: "a refusal repeated by id", ledger: map[string]ledgerPayment{},
			seen: []seenOutcome{refusal("z", 4, "invalid_amount"), refusal("z", 4, "invalid_amount")}, duplicates: 1, refused: 1},
		{name: "a refusal repeated with other contents", ledger: map[string]ledgerPayment{},
			seen: []seenOutcome{refusal("z", 4, "invalid_amount"), refusal("z", 4, "key_reused")}, broken: "published twice with different contents",
			duplicates: 1, refused: 1},
		{name: "a refusal is no final event", ledger: map[string]ledgerPayment{"m:a": succeeded}, seen: []seenOutcome{refusal("a", 3, "key_reused")},
			missing: "m:a: no charged event", refused: 1},
		{name: "a refusal without its sequence", ledger: map[string]ledgerPayment{}, seen: []seenOutcome{func() seenOutcome {
			r := refusal("z", 4, "invalid_amount")
			r.event.EventID, r.msgID = "m:z:refused", "m:z:refused"
			return r
		}()}, broken: "want the id m:z:refused:<stream sequence>", refused: 1},
		{name: "a refusal in a payment's order", ledger: map[string]ledgerPayment{}, seen: []seenOutcome{func() seenOutcome {
			r := refusal("z", 4, "invalid_amount")
			r.event.Seq = 1
			return r
		}()}, broken: "refused with seq 1", refused: 1},
		{name: "a refusal without a reason", ledger: map[string]ledgerPayment{}, seen: []seenOutcome{refusal("z", 4, "")},
			broken: "refused with reason \"\"", refused: 1},
		{name: "waiting for an operator, then charged after a replay", ledger: map[string]ledgerPayment{"m:a": succeeded},
			seen: []seenOutcome{waitingEvent("a", 3, "max_deliveries"), charged}, waiting: 1},
		{name: "waiting for an operator still", ledger: map[string]ledgerPayment{},
			seen: []seenOutcome{waitingEvent("z", 3, "provider_rejected"), waitingEvent("z", 8, "max_deliveries")}, waiting: 2},
		{name: "a waiting event is no final event", ledger: map[string]ledgerPayment{"m:a": succeeded},
			seen: []seenOutcome{waitingEvent("a", 3, "max_deliveries")}, missing: "m:a: no charged event", waiting: 1},
		{name: "a waiting event with another status", ledger: map[string]ledgerPayment{}, seen: []seenOutcome{func() seenOutcome {
			w := waitingEvent("z", 4, "max_deliveries")
			w.event.Status = ledger.StatusRefused
			return w
		}()}, broken: "waiting_for_operator with seq 0 and status refused", waiting: 1},
		{name: "a refusal under another message id", ledger: map[string]ledgerPayment{}, seen: []seenOutcome{func() seenOutcome {
			r := refusal("z", 4, "invalid_amount")
			r.msgID = "m:z"
			return r
		}()}, broken: "published under Nats-Msg-Id \"m:z\"", refused: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := checkOutcomes(tc.seen, tc.ledger, nil)
			missing, broken := strings.Join(v.missing, "\n"), strings.Join(v.broken, "\n")
			switch {
			case tc.missing == "" && len(v.missing) > 0, tc.missing != "" && !strings.Contains(missing, tc.missing):
				t.Fatalf("missing %q, want %q", v.missing, tc.missing)
			case tc.broken == "" && len(v.broken) > 0, tc.broken != "" && !strings.Contains(broken, tc.broken):
				t.Fatalf("broken %q, want %q", v.broken, tc.broken)
			case v.duplicates != tc.duplicates:
				t.Fatalf("%d duplicates by id, want %d", v.duplicates, tc.duplicates)
			case v.refused != tc.refused:
				t.Fatalf("%d refused events, want %d", v.refused, tc.refused)
			case v.waiting != tc.waiting:
				t.Fatalf("%d waiting events, want %d", v.waiting, tc.waiting)
			case v.ok() != (tc.missing == "" && tc.broken == ""):
				t.Fatalf("ok %v with missing %q and broken %q", v.ok(), v.missing, v.broken)
			}
		})
	}
}

// TestOutcomeViolationsFailTheRun: a run whose outcome check found a
// missing event, or that never ran the check, reports a violation.
func TestOutcomeViolationsFailTheRun(t *testing.T) {
	for _, h := range []*harness{
		{outcomesChecked: true, outcomeVerdict: outcomeVerdict{missing: []string{"m:a: no charged event"}}},
		{outcomesChecked: true, outcomeVerdict: outcomeVerdict{broken: []string{"payment m:a: 2 final events"}}},
		{},
	} {
		var out strings.Builder
		h.out = &out
		if h.reportOutcomes() || !strings.Contains(out.String(), "chaos: VIOLATION outcome") {
			t.Errorf("%+v passed: %s", h.outcomeVerdict, out.String())
		}
	}
	h := &harness{outcomesChecked: true, outcomeVerdict: outcomeVerdict{events: 4, distinct: 3, duplicates: 1, payments: 2, final: 2, refused: 1}}
	var out strings.Builder
	h.out = &out
	if !h.reportOutcomes() || !strings.Contains(out.String(), "outcome events: read=4 distinct=3 duplicates_by_id=1 payments=2 final=2 refused=1 missing=0") {
		t.Errorf("a clean check: %s", out.String())
	}
}

// TestOutcomeReaderSurvivesRestarts: the run's reader of the outcomes
// stream reads every event exactly once by stream sequence across a NATS
// shutdown and restart with its store, and a repeat published under the
// same id within the duplicate window is not stored again.
func TestOutcomeReaderSurvivesRestarts(t *testing.T) {
	srv := testenv.EmbeddedNATS(t)
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := stream.Config{}.WithDefaults()
	if _, err := stream.EnsureOutcomeStream(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	publish := func(key string) {
		t.Helper()
		m, err := stream.OutcomeMsg(cfg, ledger.OutcomeEvent{EventID: "m:" + key + ":charged", MerchantID: "m", IdempotencyKey: key,
			Seq: 1, Kind: ledger.OutcomeCharged, Status: ledger.PaymentSucceeded, Amount: 100, Currency: "usd", OccurredAt: outcomeAt})
		if err != nil {
			t.Fatal(err)
		}
		for {
			pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := js.PublishMsg(pctx, m)
			pcancel()
			if err == nil {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("publish %s: %v", key, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	var w outcomeWatch
	readCtx, stopReading := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); w.follow(readCtx, js, cfg.OutcomeStream) }()
	defer func() { stopReading(); <-done }()
	waitRead := func(n int) {
		t.Helper()
		for {
			seen, _, _ := w.snapshot()
			if len(seen) >= n {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("read %d events, want %d", len(seen), n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	publish("a")
	publish("b")
	waitRead(2)
	srv.Shutdown()
	time.Sleep(200 * time.Millisecond)
	srv.Start()
	publish("b") // a relay's repeat: dropped by the duplicate window
	publish("c")
	publish("d")
	waitRead(4)
	time.Sleep(300 * time.Millisecond) // a repeat read would show now
	seen, _, resumes := w.snapshot()
	var got []string
	for i, s := range seen {
		if s.bad != "" || s.streamSeq != uint64(i+1) {
			t.Fatalf("read %+v at %d", s, i)
		}
		got = append(got, s.event.IdempotencyKey)
	}
	if strings.Join(got, ",") != "a,b,c,d" {
		t.Fatalf("read %v, want a,b,c,d once each", got)
	}
	rows := map[string]ledgerPayment{}
	for _, k := range got {
		rows["m:"+k] = ledgerPayment{status: ledger.PaymentSucceeded, amount: 100, currency: "usd"}
	}
	if v := checkOutcomes(seen, rows, nil); !v.ok() || v.distinct != 4 {
		t.Fatalf("check: %+v", v)
	}
	t.Logf("reader resumed %d times", resumes)
}

// opEvent is the final event of the operation "m:<key>" of kind, seq 3.
func opEvent(key, kind, status string, amount int64) seenOutcome {
	o := outcome(key, kind, status, amount)
	o.event.Seq = 3
	return o
}

// TestCheckOutcomesOfTheLifecycle: an authorization's one event is its
// authorized one, whether it still holds or a capture or cancel moved it
// on; each final refund, capture and cancel has its one event of its
// kind under its own key. A final operation without its event is
// missing; two final events of one, an event of one not final, of one
// the ledger lacks, or of another amount, are broken.
func TestCheckOutcomesOfTheLifecycle(t *testing.T) {
	captured := ledgerPayment{status: ledger.PaymentSucceeded, amount: 100, currency: "usd", settled: true, authorized: true}
	canceled := ledgerPayment{status: "canceled", amount: 50, currency: "usd", settled: true, authorized: true}
	rows := map[string]ledgerPayment{"m:a": captured, "m:b": canceled}
	ops := func() map[string]ledgerOp {
		return map[string]ledgerOp{
			"m:a-cap": {kind: "capture", status: "succeeded", amount: 80, currency: "usd"},
			"m:a-r0":  {kind: "refund", status: "succeeded", amount: 30, currency: "usd"},
			"m:a-r1":  {kind: "refund", status: "refused", amount: 80, currency: "usd"},
			"m:b-can": {kind: "cancel", status: "succeeded", amount: 50, currency: "usd"},
			"m:a-r2":  {kind: "refund", status: "unknown", amount: 10, currency: "usd"},
		}
	}
	clean := func() []seenOutcome {
		return []seenOutcome{
			outcome("a", ledger.OutcomeAuthorized, ledger.PaymentAuthorized, 100), outcome("b", ledger.OutcomeAuthorized, ledger.PaymentAuthorized, 50),
			opEvent("a-cap", ledger.OutcomeCaptured, "succeeded", 80), opEvent("a-r0", ledger.OutcomeRefunded, "succeeded", 30),
			opEvent("a-r1", ledger.OutcomeRefundFailed, "refused", 80), opEvent("b-can", ledger.OutcomeCanceled, "canceled", 50),
		}
	}
	for _, tc := range []struct {
		name            string
		seen            func([]seenOutcome) []seenOutcome
		missing, broken string
	}{
		{name: "clean"},
		{name: "a refund's event missing", seen: func(s []seenOutcome) []seenOutcome { return slices.Delete(s, 3, 4) }, missing: "m:a-r0: no refunded event"},
		{name: "two final events of a refund", seen: func(s []seenOutcome) []seenOutcome {
			return append(s, opEvent("a-r0", ledger.OutcomeRefundFailed, "failed", 30))
		}, broken: "operation m:a-r0: 2 final events"},
		{name: "an event of an operation not final", seen: func(s []seenOutcome) []seenOutcome {
			return append(s, opEvent("a-r2", ledger.OutcomeRefunded, "succeeded", 10))
		}, broken: "the ledger's refund is unknown, not final"},
		{name: "an event of an operation the ledger lacks", seen: func(s []seenOutcome) []seenOutcome {
			return append(s, opEvent("z-r0", ledger.OutcomeRefunded, "succeeded", 10))
		}, broken: "an operation the ledger lacks"},
		{name: "a capture's event of another amount", seen: func(s []seenOutcome) []seenOutcome {
			s[2] = opEvent("a-cap", ledger.OutcomeCaptured, "succeeded", 100)
			return s
		}, broken: "the ledger's capture succeeded 80 usd"},
		{name: "an authorization charged", seen: func(s []seenOutcome) []seenOutcome {
			return append(s, outcome("a", ledger.OutcomeCharged, ledger.PaymentSucceeded, 100))
		}, broken: "payment m:a: 2 final events"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := clean()
			if tc.seen != nil {
				seen = tc.seen(seen)
			}
			v := checkOutcomes(seen, rows, ops())
			missing, broken := strings.Join(v.missing, "\n"), strings.Join(v.broken, "\n")
			switch {
			case tc.missing == "" && len(v.missing) > 0, tc.missing != "" && !strings.Contains(missing, tc.missing):
				t.Fatalf("missing %q, want %q", v.missing, tc.missing)
			case tc.broken == "" && len(v.broken) > 0, tc.broken != "" && !strings.Contains(broken, tc.broken):
				t.Fatalf("broken %q, want %q", v.broken, tc.broken)
			}
		})
	}
}
