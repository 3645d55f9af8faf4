package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/lab/storehook"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/outbox"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/stream"
)

// withOutcomes gives the test an outcomes stream of its own.
func (e *env) withOutcomes() {
	e.t.Helper()
	u := testenv.Unique(e.t)
	e.cfg.Stream.OutcomeStream, e.cfg.Stream.OutcomePrefix = "OUTCOMES_"+strings.ToUpper(u), u+".outcomes"
	if _, err := stream.EnsureOutcomeStream(e.ctx, e.js, e.cfg.Stream); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = e.js.DeleteStream(context.Background(), e.cfg.Stream.OutcomeStream) })
}

// relayedOutcomes relays the outbox to the outcomes stream until it is
// empty and returns every event the stream holds, with the raw bodies.
func (e *env) relayedOutcomes() ([]stream.OutcomeEvent, []string) {
	e.t.Helper()
	r, err := outbox.New(outbox.Config{BatchSize: 64}, outbox.Outcomes(e.store, stream.NewOutcomePublisher(e.js, e.cfg.Stream, 5*time.Second)))
	if err != nil {
		e.t.Fatal(err)
	}
	e.eventually("outbox relayed", func() bool {
		res, err := r.RunOnce(e.ctx)
		if err != nil {
			e.t.Fatal(err)
		}
		return res.Relayed == 0 && e.count(`SELECT count(*) FROM outcome_events WHERE relayed_at IS NULL`) == 0
	})
	var (
		evs []stream.OutcomeEvent
		raw []string
	)
	for _, m := range e.streamMessages(e.cfg.Stream.OutcomeStream) {
		ev, err := stream.DecodeOutcomeEvent(m.Data)
		if err != nil {
			e.t.Fatal(err)
		}
		if got := m.Header.Get("Nats-Msg-Id"); got != ev.EventID {
			e.t.Fatalf("event %s published under Nats-Msg-Id %q", ev.EventID, got)
		}
		evs = append(evs, ev)
		raw = append(raw, m.Subject+" "+fmt.Sprint(m.Header)+" "+string(m.Data))
	}
	return evs, raw
}

// refused returns the refused events of key.
func refused(evs []stream.OutcomeEvent, key string) []stream.OutcomeEvent {
	var out []stream.OutcomeEvent
	for _, ev := range evs {
		if ev.Kind == ledger.OutcomeRefused && ev.IdempotencyKey == key {
			out = append(out, ev)
		}
	}
	return out
}

// letterSeq is the stream sequence of the dead letter of key.
func (e *env) letterSeq(key string) uint64 {
	e.t.Helper()
	for _, m := range e.deadLetters() {
		if strings.Contains(string(m.Data), `"`+key+`"`) || m.Header.Get(stream.HeaderIdempotencyKey) == key {
			seq, err := strconv.ParseUint(m.Header.Get("Dlq-Orig-Seq"), 10, 64)
			if err != nil {
				e.t.Fatal(err)
			}
			return seq
		}
	}
	e.t.Fatalf("no dead letter of %s", key)
	return 0
}

// TestRefusedCommandPublishesOneRefusedEvent: a command the worker refuses
// for bad input (invalid_amount) and one refused for a reused key each
// publish exactly one refused event on the outcomes stream, with the dead
// letter's reason, the amount as sent and the id
// <merchant>:<key>:refused:<stream sequence>, beside the first command's
// own charged event; so does a body that does not decode under a key
// header, and one with no key anywhere publishes none. Without the refusal events a publisher on the stream
// never learns of either.
func TestRefusedCommandPublishesOneRefusedEvent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.withOutcomes()
	e.startWorker("w1", nil)
	e.publish("m_1", []byte(`{"merchant_id":"m_1","idempotency_key":"bad-amount","amount":-5,"currency":"usd","payment_method":"pm_card_visa"}`), "", nil)
	e.publish("m_1", body("m_1", "reused", 1500), "", nil)
	e.eventually("first command charged", func() bool { return e.charges("m_1", "reused") == 1 })
	e.publish("m_1", body("m_1", "reused", 2500), "", nil)
	// A body that does not decode: the key from the header, no amount; and
	// one with no key anywhere, which nobody could match: no event.
	e.publish("m_1", []byte(`{"merchant_id":"m_1",`), "", map[string]string{stream.HeaderIdempotencyKey: "hdr-key"})
	e.publish("m_1", []byte(`not json`), "", nil)
	e.eventually("four dead letters", func() bool { return len(e.deadLetters()) == 4 })
	e.quiescent()

	evs, _ := e.relayedOutcomes()
	for key, want := range map[string]struct {
		reason   string
		amount   int64
		currency string
	}{"bad-amount": {"invalid_amount", -5, "usd"}, "reused": {"key_reused", 2500, "usd"}, "hdr-key": {"malformed_json", 0, ""}} {
		got := refused(evs, key)
		if len(got) != 1 {
			t.Fatalf("%s: %d refused events, want 1: %+v", key, len(got), evs)
		}
		ev, id := got[0], fmt.Sprintf("m_1:%s:refused:%d", key, e.letterSeq(key))
		if ev.EventID != id || ev.Status != ledger.StatusRefused || ev.Reason != want.reason || ev.Amount != want.amount ||
			ev.Currency != want.currency || ev.Seq != 0 || ev.ChargeID != "" || ev.OccurredAt.IsZero() {
			t.Fatalf("%s: event %+v, want id %s, status refused, reason %s, amount %d %q", key, ev, id, want.reason, want.amount, want.currency)
		}
	}
	charged := 0
	for _, ev := range evs {
		if ev.Kind == ledger.OutcomeCharged && ev.IdempotencyKey == "reused" && ev.Amount == 1500 {
			charged++
		}
	}
	if charged != 1 || len(evs) != 4 {
		t.Fatalf("events %+v: want the charge of the first command once, and the three refusals with a key", evs)
	}
}

// TestRefusalEventAnswerLostWritesOne: the refusal event is written but
// its answer is lost (the connection drops after PostgreSQL committed, or
// the worker dies before its term): the message is not termed, its
// redelivery files the letter and writes the event again, and the outbox
// and the stream hold one event under the same id.
func TestRefusalEventAnswerLostWritesOne(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.withOutcomes()
	hooked := storehook.Wrap(e.store).After(storehook.RecordRefusal, func(_ context.Context, c *storehook.Call) error {
		if c.N == 1 {
			if c.Err != nil || !c.Wrote {
				t.Errorf("first refusal write: %v %v, want written", c.Wrote, c.Err)
			}
			return errors.New("connection lost after the refusal was committed")
		}
		return nil
	})
	e.startWorkerOn("w1", hooked)
	e.publish("m_1", []byte(`{"merchant_id":"m_1","idempotency_key":"lost","amount":10,"currency":"xyz","payment_method":"pm_card_visa"}`), "", nil)
	e.eventually("the redelivery wrote the event again", func() bool { return hooked.Calls(storehook.RecordRefusal) >= 2 })
	e.quiescent()
	if n := hooked.Calls(storehook.RecordRefusal); n != 2 {
		t.Fatalf("%d refusal writes, want 2 (the lost answer's, its redelivery's)", n)
	}
	if n := e.count(`SELECT count(*) FROM outcome_events WHERE idempotency_key = 'lost'`); n != 1 {
		t.Fatalf("%d outbox rows, want 1", n)
	}
	if n := len(e.deadLetters()); n != 1 {
		t.Fatalf("%d dead letters, want 1", n)
	}
	evs, _ := e.relayedOutcomes()
	got := refused(evs, "lost")
	if len(got) != 1 || got[0].Reason != "invalid_currency" || got[0].Currency != "" || got[0].Amount != 10 ||
		got[0].EventID != fmt.Sprintf("m_1:lost:refused:%d", e.letterSeq("lost")) {
		t.Fatalf("events %+v, want one refused invalid_currency, currency empty (not a valid code)", evs)
	}
}

// TestRefusalEventRefusedLeavesMessageUnacked: while PostgreSQL refuses
// the refusal event's insert, the message is not termed: it is delivered
// again, and once the insert is taken the event is written, once.
func TestRefusalEventRefusedLeavesMessageUnacked(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.withOutcomes()
	e.cfg.Stream.MaxDeliver = 20
	if _, err := e.pool.Exec(e.ctx, `ALTER TABLE outcome_events ADD CONSTRAINT test_refuses_refusals CHECK (seq <> 0) NOT VALID`); err != nil {
		t.Fatal(err)
	}
	hooked := storehook.Wrap(e.store).Before(storehook.RecordRefusal, func(ctx context.Context, c *storehook.Call) error {
		if c.N == 3 {
			// PostgreSQL takes the insert again from the third delivery on.
			if _, err := e.pool.Exec(ctx, `ALTER TABLE outcome_events DROP CONSTRAINT test_refuses_refusals`); err != nil {
				return err
			}
		}
		return nil
	})
	var (
		mu         sync.Mutex
		refusedErr []error
	)
	hooked.After(storehook.RecordRefusal, func(_ context.Context, c *storehook.Call) error {
		mu.Lock()
		defer mu.Unlock()
		refusedErr = append(refusedErr, c.Err)
		return nil
	})
	e.startWorkerOn("w1", hooked)
	e.publish("m_1", []byte(`{"merchant_id":"m_1","idempotency_key":"pg-refuses","amount":0,"currency":"usd","payment_method":"pm_card_visa"}`), "", nil)
	e.eventually("event written", func() bool {
		return e.count(`SELECT count(*) FROM outcome_events WHERE idempotency_key = 'pg-refuses'`) == 1
	})
	e.quiescent()
	mu.Lock()
	defer mu.Unlock()
	if len(refusedErr) != 3 || refusedErr[0] == nil || refusedErr[1] == nil || refusedErr[2] != nil {
		t.Fatalf("refusal writes ended %v: want two refused by PostgreSQL (each delivered again), then one written", refusedErr)
	}
	if n := len(e.deadLetters()); n != 1 {
		t.Fatalf("%d dead letters, want 1", n)
	}
	evs, _ := e.relayedOutcomes()
	if got := refused(evs, "pg-refuses"); len(got) != 1 || got[0].Reason != "invalid_amount" {
		t.Fatalf("events %+v, want one refused invalid_amount", evs)
	}
}

// TestRefusalEventNeverCarriesCardData: a command whose key or merchant is
// the field holding a card number is dead-lettered card_data and publishes
// no event; one whose card number is elsewhere (the description) publishes
// its refused event with reason card_data. No card number reaches the
// outcomes stream.
func TestRefusalEventNeverCarriesCardData(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.withOutcomes()
	e.startWorker("w1", nil)
	const pan = "4242424242424242"
	e.publish("m_1", []byte(`{"merchant_id":"m_1","amount":10,"currency":"usd","payment_method":"pm_card_visa"}`), "",
		map[string]string{stream.HeaderIdempotencyKey: pan})
	e.publish("m_1", []byte(`{"merchant_id":"m_1","idempotency_key":"k-`+pan+`","amount":10,"currency":"usd","payment_method":"pm_card_visa"}`), "", nil)
	e.publish(pan, []byte(`{"merchant_id":"`+pan+`","idempotency_key":"merchant-pan","amount":10,"currency":"usd","payment_method":"pm_card_visa"}`), "", nil)
	e.publish("m_1", []byte(`{"merchant_id":"m_1","idempotency_key":"desc-pan","amount":10,"currency":"usd","payment_method":"pm_card_visa","description":"card `+pan+`"}`), "", nil)
	e.eventually("four dead letters", func() bool { return len(e.deadLetters()) == 4 })
	e.quiescent()
	evs, raw := e.relayedOutcomes()
	if len(evs) != 1 || evs[0].IdempotencyKey != "desc-pan" || evs[0].Kind != ledger.OutcomeRefused || evs[0].Reason != "card_data" {
		t.Fatalf("events %+v, want only desc-pan's, refused card_data", evs)
	}
	for _, r := range raw {
		if strings.Contains(r, pan) {
			t.Fatalf("a card number reached the outcomes stream: %s", r)
		}
	}
	if n := e.count(`SELECT count(*) FROM outcome_events WHERE strpos(idempotency_key || merchant_id || currency || coalesce(reason, ''), $1) > 0`, pan); n != 0 {
		t.Fatalf("%d outbox rows hold the card number", n)
	}
}

// TestRefusedRefundPublishesARefusedEvent: a refund the ledger's rules
// refuse (over what is left to refund, or of no payment) is never sent and
// dead-lettered with its reason; its publisher learns it as a refused
// event with that reason, as for any refused command.
func TestRefusedRefundPublishesARefusedEvent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.withOutcomes()
	e.startWorker("w1", nil)
	e.charged("m_1", "pay", 100)
	e.publish("m_1", refundBody("m_1", "r-over", "pay", 101), "", nil)
	e.publish("m_1", refundBody("m_1", "r-none", "nope", 10), "", nil)
	e.eventually("two dead letters", func() bool { return len(e.deadLetters()) == 2 })
	e.quiescent()

	evs, _ := e.relayedOutcomes()
	for key, reason := range map[string]string{"r-over": ledger.RefuseOverRefundable, "r-none": ledger.RefuseNoPayment} {
		got := refused(evs, key)
		if len(got) != 1 {
			t.Fatalf("%s: %d refused events, want 1: %+v", key, len(got), evs)
		}
		if ev := got[0]; ev.Reason != reason || ev.EventID != fmt.Sprintf("m_1:%s:refused:%d", key, e.letterSeq(key)) {
			t.Fatalf("%s: event %+v, want reason %s", key, ev, reason)
		}
	}
}

// TestRefusalEventAmountNeverACardNumber: a card number typed as the
// amount is refused amount_over_limit (the door reads strings, not
// numbers), and its refused event carries no amount: an amount past the
// limit is the refusal's own reason, never reported.
func TestRefusalEventAmountNeverACardNumber(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.withOutcomes()
	e.startWorker("w1", nil)
	const pan = "4242424242424242"
	e.publish("m_1", []byte(`{"merchant_id":"m_1","idempotency_key":"amount-pan","amount":`+pan+`,"currency":"usd","payment_method":"pm_card_visa"}`), "", nil)
	e.eventually("one dead letter", func() bool { return len(e.deadLetters()) == 1 })
	e.quiescent()
	evs, raw := e.relayedOutcomes()
	for _, r := range raw {
		if strings.Contains(r, pan) {
			t.Fatalf("a card number reached the outcomes stream: %s", r)
		}
	}
	if got := refused(evs, "amount-pan"); len(got) != 1 || got[0].Amount != 0 || got[0].Reason != "amount_over_limit" {
		t.Fatalf("refused events %+v, want one amount_over_limit with amount 0", got)
	}
}

// TestRefusalEventWaitsOutPostgresOutage: a command refused for bad input
// while PostgreSQL is unreachable has its letter filed but its refused
// event not written. It is held like a claim in the outage, not nakked:
// no delivery is spent however long the outage lasts, and when PostgreSQL
// is back the event is written, once, under the message's sequence, and
// the message is termed. Nakked, it ran out of deliveries and the net
// filed it max_deliveries, and its publisher never learnt why.
func TestRefusalEventWaitsOutPostgresOutage(t *testing.T) {
	t.Parallel()
	e, link, store := pgOutageEnv(t)
	e.withOutcomes()
	proc, _ := e.runPausable("w1", store, e.stripe)
	link.down()
	e.publish("m_1", []byte(`{"merchant_id":"m_1","idempotency_key":"pg-out","amount":-5,"currency":"usd","payment_method":"pm_card_visa"}`), "", nil)
	e.eventually("readiness says PostgreSQL is unavailable", func() bool {
		return errors.Is(proc.Paused(e.ctx), consumer.ErrStoreUnavailable)
	})
	// Four leases, and ten times the delivery schedule.
	for end := time.Now().Add(max(4*e.cfg.Lease, 10*time.Duration(e.cfg.Stream.MaxDeliver)*e.cfg.RetryMax)); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if n := e.exhausted(); n != 0 {
			t.Fatalf("%d message(s) ran out of deliveries during the outage", n)
		}
	}
	if proc.Held() != 1 {
		t.Fatalf("%d messages held at the end of the outage, want 1", proc.Held())
	}
	link.up(t)
	e.eventually("event written", func() bool {
		return e.count(`SELECT count(*) FROM outcome_events WHERE idempotency_key = 'pg-out'`) == 1
	})
	e.quiescent()
	if n := e.exhausted(); n != 0 {
		t.Fatalf("%d messages ran out of deliveries, want 0", n)
	}
	if dls := e.deadLetters(); len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dls))
	}
	if p := e.deadLetterOf("pg-out"); p.Reason != "invalid_amount" {
		t.Fatalf("dead letter %+v, want invalid_amount", p)
	}
	evs, _ := e.relayedOutcomes()
	if got := refused(evs, "pg-out"); len(got) != 1 || got[0].Reason != "invalid_amount" ||
		got[0].EventID != fmt.Sprintf("m_1:pg-out:refused:%d", e.letterSeq("pg-out")) {
		t.Fatalf("events %+v, want one refused invalid_amount under the message's sequence", evs)
	}
	if err := proc.Paused(e.ctx); err != nil {
		t.Fatalf("readiness after the outage: %v", err)
	}
}

// TestRequeuedCopyRefusedUnderTheFirstSequence: a command whose workers
// died holding it is published again by the net; the new copy, refused
// (key_reused), writes its refused event under the first copy's stream
// sequence (Paydedup-Requeue-Of), so every copy of one command tells one
// event id.
func TestRequeuedCopyRefusedUnderTheFirstSequence(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.withOutcomes()
	// The key is taken by another command: any copy is refused key_reused.
	if _, err := e.store.Claim(e.ctx, "dead-worker", time.Second, ledger.ClaimRequest{
		MerchantID: "m_1", IdempotencyKey: "requeued", RequestHash: make([]byte, 32), Amount: 900, Currency: "usd",
	}); err != nil {
		t.Fatal(err)
	}
	cfg, cons := requeueSetup(t, e, e.js, 1)
	e.publish("m_1", body("m_1", "requeued", 700), stream.MsgID("m_1", "requeued"), nil)
	stop := make(chan struct{})
	deliveries, dead := dyingWorker(t, cons, stop)
	e.eventually("the first copy ran out of deliveries and was published again", func() bool {
		return deliveries.Load() >= 2 && len(e.streamMsgs(cfg)) == 2
	})
	close(stop)
	<-dead
	msgs := e.streamMsgs(cfg)
	first := msgs[0].Sequence
	if got := msgs[1].Header.Get(stream.HeaderRequeueOf); got != strconv.FormatUint(first, 10) {
		t.Fatalf("the new copy's %s is %q, want %d", stream.HeaderRequeueOf, got, first)
	}
	e.startWorker("alive", nil)
	e.eventually("the copy refused", func() bool { return len(e.deadLetters()) == 1 })
	e.quiescent()
	evs, _ := e.relayedOutcomes()
	if got := refused(evs, "requeued"); len(got) != 1 || got[0].Reason != stream.ReasonKeyReused ||
		got[0].EventID != fmt.Sprintf("m_1:requeued:refused:%d", first) {
		t.Fatalf("events %+v, want one refused key_reused under the first copy's sequence %d", evs, first)
	}
}

// TestNetWritesTheRefusalOfBadInput: a command refused for bad input whose
// deliveries ran out with no worker settling it (its workers died holding
// it) is filed by the net with its own reason, never published again
// (every copy would be refused), and its refused event is written before
// the advisory is acked: filed max_deliveries with no event, its
// publisher never learnt why.
func TestNetWritesTheRefusalOfBadInput(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.withOutcomes()
	cfg, cons := requeueSetup(t, e, e.js, 1)
	e.publish("m_1", []byte(`{"merchant_id":"m_1","idempotency_key":"net-bad","amount":10,"currency":"xyz","payment_method":"pm_card_visa"}`), "", nil)
	stop := make(chan struct{})
	deliveries, dead := dyingWorker(t, cons, stop)
	e.eventually("the message ran out of deliveries and was filed", func() bool {
		return deliveries.Load() >= 2 && len(e.deadLetters()) > 0
	})
	close(stop)
	<-dead
	if n := len(e.streamMsgs(cfg)); n != 1 {
		t.Fatalf("the stream holds %d messages: bad input was published again", n)
	}
	if p := e.deadLetterOf("net-bad"); p.Reason != "invalid_currency" {
		t.Fatalf("dead letter %+v, want invalid_currency", p)
	}
	e.eventually("event written", func() bool {
		return e.count(`SELECT count(*) FROM outcome_events WHERE idempotency_key = 'net-bad'`) == 1
	})
	evs, _ := e.relayedOutcomes()
	if got := refused(evs, "net-bad"); len(got) != 1 || got[0].Reason != "invalid_currency" ||
		got[0].EventID != fmt.Sprintf("m_1:net-bad:refused:%d", e.streamMsgs(cfg)[0].Sequence) {
		t.Fatalf("events %+v, want one refused invalid_currency under the message's sequence", evs)
	}
}

// failingFor refuses the connection for one key while on is set and passes
// everything else on.
type failingFor struct {
	provider.Provider
	key string
	on  *atomic.Bool
}

func (f failingFor) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	if req.IdempotencyKey == f.key && f.on.Load() {
		return nil, refusedConnection()
	}
	return f.Provider.Charge(ctx, req)
}

// waiting returns the waiting_for_operator events of key.
func waiting(evs []stream.OutcomeEvent, key string) []stream.OutcomeEvent {
	var out []stream.OutcomeEvent
	for _, ev := range evs {
		if ev.Kind == ledger.OutcomeWaiting && ev.IdempotencyKey == key {
			out = append(out, ev)
		}
	}
	return out
}

// TestWaitingForOperatorThenFinal: a payment whose every delivery fails
// alone (the provider answers a lookup: its own failure) is filed
// max_deliveries for an operator, and its publisher learns it: a
// waiting_for_operator event with the reason, under the message's stream
// sequence, written before the message is termed. The operator replays
// the letter once the cause is gone; the payment is charged and its final
// event follows. One waiting event, one final event.
func TestWaitingForOperatorThenFinal(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.withOutcomes()
	outageConfig(e)
	on := new(atomic.Bool)
	on.Store(true)
	e.startWorker("w1", failingFor{Provider: e.stripe, key: "op", on: on})
	e.publish("m_1", body("m_1", "op", 300), "", nil)
	e.eventually("filed for an operator", func() bool { return len(e.deadLetters()) == 1 })
	if p := e.deadLetterOf("op"); p.Reason != stream.ReasonMaxDeliveries {
		t.Fatalf("dead letter %+v, want max_deliveries", p)
	}
	seq := e.letterSeq("op")
	e.quiescent()
	evs, _ := e.relayedOutcomes()
	got := waiting(evs, "op")
	if len(got) != 1 || got[0].Reason != stream.ReasonMaxDeliveries || got[0].Status != ledger.StatusWaiting || got[0].Seq != 0 ||
		got[0].Amount != 300 || got[0].Currency != "usd" || got[0].EventID != fmt.Sprintf("m_1:op:waiting_for_operator:%d", seq) {
		t.Fatalf("events %+v, want one waiting_for_operator max_deliveries under sequence %d", evs, seq)
	}
	on.Store(false)
	if _, err := dlq.Replay(e.ctx, e.js, e.cfg.Stream, dlq.ReplayOptions{All: true}); err != nil {
		t.Fatal(err)
	}
	e.eventually("charged after the replay", func() bool { return e.charges("m_1", "op") == 1 })
	e.quiescent()
	evs, _ = e.relayedOutcomes()
	var kinds []string
	for _, ev := range evs {
		if ev.IdempotencyKey == "op" {
			kinds = append(kinds, ev.Kind)
		}
	}
	if strings.Join(kinds, ",") != ledger.OutcomeWaiting+","+ledger.OutcomeCharged {
		t.Fatalf("events of the payment %v, want waiting_for_operator then charged", kinds)
	}
}

// TestNetTellsAPaymentWaitingForOperator: a payment the net files
// max_deliveries (its workers died holding every copy) has its
// waiting_for_operator event written before the advisory is acked.
func TestNetTellsAPaymentWaitingForOperator(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.withOutcomes()
	cfg, cons := requeueSetup(t, e, e.js, 0)
	e.publish("m_1", body("m_1", "net-op", 700), "", nil)
	stop := make(chan struct{})
	_, dead := dyingWorker(t, cons, stop)
	e.eventually("filed for an operator", func() bool { return len(e.deadLetters()) == 1 })
	close(stop)
	<-dead
	e.eventually("event written", func() bool {
		return e.count(`SELECT count(*) FROM outcome_events WHERE idempotency_key = 'net-op'`) == 1
	})
	evs, _ := e.relayedOutcomes()
	if got := waiting(evs, "net-op"); len(got) != 1 || got[0].Reason != stream.ReasonMaxDeliveries ||
		got[0].EventID != fmt.Sprintf("m_1:net-op:waiting_for_operator:%d", e.streamMsgs(cfg)[0].Sequence) {
		t.Fatalf("events %+v, want one waiting_for_operator max_deliveries", evs)
	}
}
