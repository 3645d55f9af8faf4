package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/lab/workload"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
	"github.com/paydedup/paydedup/stream"
)

// env is one test's world: its own Postgres schema, its own streams on the
// shared NATS server, its own simulator.
type env struct {
	t      testing.TB
	ctx    context.Context
	pool   *pgxpool.Pool
	store  *dedup.Store
	nc     *nats.Conn
	js     jetstream.JetStream
	sim    *stripesim.Simulator
	stripe *stripe.Client
	cfg    consumer.Config
}

func setup(t testing.TB) *env {
	t.Helper()
	return setupWith(t, dedup.Config{})
}

// setupWith is setup with the store's configuration given (e.g. a fake
// clock).
func setupWith(t testing.TB, scfg dedup.Config) *env {
	t.Helper()
	pool := testenv.Pool(t)
	store, err := dedup.New(pool, scfg)
	if err != nil {
		t.Fatal(err)
	}
	nc := testenv.NATSConn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	sim, stripe := testenv.Provider(t, 7, 2*time.Second)
	cfg := consumer.Config{Stream: testenv.Streams(t, js)}
	cfg.Lease, cfg.Stream.AckWait, cfg.Stream.MaxDeliver = 3*time.Second, 5*time.Second, 6
	cfg.ProviderTry = provider.RetryPolicy{MaxTries: 2, AttemptTimeout: 800 * time.Millisecond, InitialInterval: 50 * time.Millisecond, MaxInterval: 100 * time.Millisecond}
	cfg.RetryBase, cfg.RetryMax = 50*time.Millisecond, 500*time.Millisecond
	cfg.DrainTimeout, cfg.Concurrency, cfg.FetchBatch = 2*time.Second, 16, 50
	cfg.TrimInterval = 100 * time.Millisecond // every test runs the trimmer: it must remove only what is settled
	e := &env{t: t, ctx: context.Background(), pool: pool, store: store, nc: nc, js: js, sim: sim, stripe: stripe, cfg: cfg}
	return e
}

// startWorker runs a worker until the returned stop is called (or the test
// ends); stop waits for the drain.
func (e *env) startWorker(holder string, charger consumer.Charger) (stop func()) {
	e.t.Helper()
	return e.run(holder, e.store, charger, nil)
}

// startWorkerLogged runs a worker that logs to logger.
func (e *env) startWorkerLogged(holder string, logger *slog.Logger) (stop func()) {
	e.t.Helper()
	return e.run(holder, e.store, nil, logger)
}

// startWorkerOn runs a worker on another Store (a fault-injecting wrapper).
func (e *env) startWorkerOn(holder string, store consumer.Store) (stop func()) {
	e.t.Helper()
	return e.run(holder, store, nil, nil)
}

// waitStreamsCreate creates the streams and the consumer without a worker,
// so a test can fill the stream first.
func (e *env) waitStreamsCreate() {
	e.t.Helper()
	if _, _, err := stream.EnsureStreams(e.ctx, e.js, e.cfg.Stream); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) run(holder string, store consumer.Store, charger consumer.Charger, logger *slog.Logger) (stop func()) {
	e.t.Helper()
	cfg := e.cfg
	cfg.Holder = holder
	if charger == nil {
		charger = e.stripe
	}
	proc := consumer.NewProcessor(store, charger, cfg, logger)
	w, err := consumer.NewWorker(e.nc, proc, cfg, logger, nil, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				e.t.Errorf("worker %s: %v", holder, err)
			}
		})
	}
	e.t.Cleanup(stop)
	e.waitStreams()
	return stop
}

func (e *env) waitStreams() {
	e.t.Helper()
	e.eventually("streams exist", func() bool {
		_, err1 := e.js.Stream(e.ctx, e.cfg.Stream.Name)
		_, err2 := e.js.Stream(e.ctx, e.cfg.Stream.DLQStream)
		return err1 == nil && err2 == nil
	})
}

// cmdJSON is a command as a client encodes it.
type cmdJSON = workload.Wire

func body(merchant, key string, amount int64) []byte {
	b, _ := json.Marshal(cmdJSON{MerchantID: merchant, IdempotencyKey: key, Amount: amount, Currency: "usd", PaymentMethod: "pm_card_visa"})
	return b
}

// publish sends a raw message; msgID "" leaves Nats-Msg-Id unset.
func (e *env) publish(merchant string, data []byte, msgID string, hdr map[string]string) {
	e.t.Helper()
	m := nats.NewMsg(e.cfg.Stream.SubjectPrefix + "." + merchant)
	m.Data = data
	for k, v := range hdr {
		m.Header.Set(k, v)
	}
	if msgID != "" {
		m.Header.Set(nats.MsgIdHdr, msgID)
	}
	if _, err := e.js.PublishMsg(e.ctx, m); err != nil {
		e.t.Fatalf("publish: %v", err)
	}
}

// workerConsumer returns the workers' durable consumer once a worker
// started by the test has created it (Run creates it as it starts, which a
// test publishing at once may get ahead of).
func (e *env) workerConsumer() jetstream.Consumer {
	e.t.Helper()
	var c jetstream.Consumer
	e.eventually("the workers' consumer created", func() bool {
		var err error
		c, err = e.js.Consumer(e.ctx, e.cfg.Stream.Name, e.cfg.Stream.Durable)
		return err == nil
	})
	return c
}

func (e *env) eventually(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(e.ctx, sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// quiescent waits until the consumer has nothing pending or unacked.
func (e *env) quiescent() {
	e.t.Helper()
	e.eventually("consumer quiescent", func() bool {
		c, err := e.js.Consumer(e.ctx, e.cfg.Stream.Name, e.cfg.Stream.Durable)
		if err != nil {
			return false
		}
		info, err := c.Info(e.ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
}

func (e *env) deadLetters() []*jetstream.RawStreamMsg {
	e.t.Helper()
	return e.streamMessages(e.cfg.Stream.DLQStream)
}

// streamMessages reads every message stream holds.
func (e *env) streamMessages(name string) []*jetstream.RawStreamMsg {
	e.t.Helper()
	s, err := e.js.Stream(e.ctx, name)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		if m, err := s.GetMsg(e.ctx, seq); err == nil {
			out = append(out, m)
		}
	}
	return out
}

func (e *env) charges(merchant, key string) int {
	return e.sim.ChargesByKey()[merchant+":"+key]
}

func TestSameCommandFiveTimesChargedOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.startWorker("w1", nil)
	b := body("m_1", "five", 1500)
	for range 5 {
		e.publish("m_1", b, "", nil) // no Nats-Msg-Id: all five reach the stream
	}
	e.eventually("row completed", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == 1
	})
	e.quiescent()
	if n := e.charges("m_1", "five"); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
	if n := e.count(`SELECT count(*) FROM payments`); n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters, want 0", n)
	}
	s, _ := e.js.Stream(e.ctx, e.cfg.Stream.Name)
	info, _ := s.Info(e.ctx)
	// All five were stored (the workers trim them once settled).
	if info.State.LastSeq != 5 {
		t.Fatalf("stream stored %d messages, want 5", info.State.LastSeq)
	}
}

func TestTwoWorkersThirtyPercentDuplicates(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.startWorker("w1", nil)
	e.startWorker("w2", nil)
	const n = 1000
	w := workload.Numbered{N: n}
	for i := range n {
		c := w.Command(i)
		e.publish(c.Cmd.MerchantID, c.Body, "", nil)
		if i%10 < 3 {
			e.publish(c.Cmd.MerchantID, c.Body, "", nil)
		}
	}
	e.eventually("all completed", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == n
	})
	e.quiescent()
	rows, err := workload.StoreRows(e.ctx, e.store, w.Refs())
	if err != nil {
		t.Fatal(err)
	}
	v := workload.Check(w.Expected(), rows, e.sim.ChargesByKey())
	if len(v.Double) > 0 || len(v.Unsettled) > 0 || len(v.Disagree) > 0 || v.ChargedOnce != n || v.KeysCharged != n {
		t.Fatalf("against the provider's ledger: %d of %d charged once, %d keys charged; double %q, unsettled %q, disagreeing %q",
			v.ChargedOnce, n, v.KeysCharged, v.Double, v.Unsettled, v.Disagree)
	}
	if n2 := e.count(`SELECT count(*) FROM payments`); n2 != n {
		t.Fatalf("%d ledger rows, want %d", n2, n)
	}
}

func TestDeclineCompletedNotRetried(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.startWorker("w1", nil)
	b, _ := json.Marshal(cmdJSON{MerchantID: "m_1", IdempotencyKey: "dec", Amount: 500, Currency: "usd", PaymentMethod: "pm_card_chargeDeclined"})
	e.publish("m_1", b, "", nil)
	e.eventually("decline recorded", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed' AND response_status = 402`) == 1
	})
	e.quiescent()
	if n := e.count(`SELECT count(*) FROM payments WHERE status = 'declined'`); n != 1 {
		t.Fatalf("%d declined ledger rows, want 1", n)
	}
	rec, err := e.store.Get(e.ctx, "m_1", "dec")
	if err != nil || rec.Attempts != 1 {
		t.Fatalf("record %+v %v: want one attempt", rec, err)
	}
	if e.charges("m_1", "dec") != 0 {
		t.Fatal("a declined payment shows a charge")
	}
}

func TestBadInputDeadLettered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.startWorker("w1", nil)
	good := string(body("m_1", "k", 100))
	cases := []struct {
		name, merchant, data, reason string
		hdr                          map[string]string
	}{
		{"malformed", "m_1", `{"merchant_id":`, "malformed_json", nil},
		{"unknown field", "m_1", strings.Replace(good, `"amount"`, `"extra":1,"amount"`, 1), "unknown_field", nil},
		{"missing key", "m_1", strings.Replace(good, `"idempotency_key":"k",`, "", 1), "missing_key", nil},
		{"empty key", "m_1", strings.Replace(good, `"idempotency_key":"k"`, `"idempotency_key":""`, 1), "missing_key", nil},
		{"header disagrees", "m_1", good, "key_mismatch", map[string]string{"Idempotency-Key": "other"}},
		{"zero amount", "m_1", strings.Replace(good, `"amount":100`, `"amount":0`, 1), "invalid_amount", nil},
		{"over limit", "m_1", strings.Replace(good, `"amount":100`, `"amount":100000000000`, 1), "amount_over_limit", nil},
		{"bad currency", "m_1", strings.Replace(good, `"usd"`, `"US"`, 1), "invalid_currency", nil},
		{"oversize", "m_1", strings.Replace(good, `"pm_card_visa"`, `"pm_card_visa","description":"`+strings.Repeat("x", 70<<10)+`"`, 1), "body_too_large", nil},
		{"subject merchant differs", "m_2", good, "merchant_mismatch", nil},
		{"invalid utf-8", "m_1", strings.Replace(good, `"pm_card_visa"`, "\"pm_\xff\"", 1), "invalid_encoding", nil},
		{"kind unknown", "m_1", strings.Replace(good, `"amount"`, `"kind":"payout","amount"`, 1), "invalid_kind", nil},
		{"unknown kind", "m_1", strings.Replace(good, `"amount"`, `"kind":"payout","amount"`, 1), "invalid_kind", nil},
	}
	for i, c := range cases {
		h := map[string]string{"X-Case": c.name}
		for k, v := range c.hdr {
			h[k] = v
		}
		e.publish(c.merchant, []byte(c.data), fmt.Sprintf("bad-%d", i), h)
	}
	// The worker keeps running: a good command after them is charged.
	e.publish("m_1", body("m_1", "after", 100), "", nil)
	e.eventually("dead letters filed", func() bool { return len(e.deadLetters()) == len(cases) })
	e.eventually("good command completed", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'after' AND status = 'completed'`) == 1
	})
	byCase := map[string]*jetstream.RawStreamMsg{}
	for _, m := range e.deadLetters() {
		byCase[m.Header.Get("X-Case")] = m
	}
	for i, c := range cases {
		m := byCase[c.name]
		if m == nil {
			t.Errorf("%s: no dead letter", c.name)
			continue
		}
		p, err := stream.ParseDeadLetter(m.Header)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if p.Reason != c.reason || m.Subject != e.cfg.Stream.DLQPrefix+"."+c.reason {
			t.Errorf("%s: reason %q on %s, want %q", c.name, p.Reason, m.Subject, c.reason)
		}
		if string(m.Data) != c.data {
			t.Errorf("%s: body not kept byte for byte", c.name)
		}
		if p.OrigSubject != e.cfg.Stream.SubjectPrefix+"."+c.merchant || p.OrigStream != e.cfg.Stream.Name || p.OrigSeq == 0 || p.Deliveries != 1 || p.Error == "" {
			t.Errorf("%s: headers %+v", c.name, p)
		}
		if got := m.Header.Get("Dlq-Orig-Msg-Id"); got != fmt.Sprintf("bad-%d", i) {
			t.Errorf("%s: Dlq-Orig-Msg-Id %q", c.name, got)
		}
	}
	if n := e.count(`SELECT count(*) FROM idempotency_keys`); n != 1 {
		t.Fatalf("%d rows: bad input must never be claimed", n)
	}
}

func TestKeyReusedDeadLettered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.startWorker("w1", nil)
	e.publish("m_1", body("m_1", "reuse", 100), "", nil)
	e.eventually("original completed", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == 1
	})
	e.publish("m_1", body("m_1", "reuse", 999), "", nil)
	e.eventually("key_reused dead letter", func() bool { return len(e.deadLetters()) == 1 })
	dl := e.deadLetters()[0]
	if dl.Header.Get("Dlq-Reason") != "key_reused" {
		t.Fatalf("reason %q", dl.Header.Get("Dlq-Reason"))
	}
	rec, _ := e.store.Get(e.ctx, "m_1", "reuse")
	if rec.Amount != 100 || e.charges("m_1", "reuse") != 1 {
		t.Fatalf("original disturbed: amount %d, charges %d", rec.Amount, e.charges("m_1", "reuse"))
	}
}

// TestProviderDownHoldsMaybeCharged: the provider answers every call 500,
// the lookup of the last delivery too. The payment is held through the
// pause, not dead-lettered max_deliveries (an outage is no message's
// fault), and its row, whose calls all ended in 5xx, stays pending and
// maybe_charged: never completed, never failed.
func TestProviderDownHoldsMaybeCharged(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if err := e.sim.SetFaults(stripesim.Faults{Rate5xx: 1}); err != nil {
		t.Fatal(err)
	}
	proc, _ := e.runPausable("w1", e.store, e.stripe)
	e.publish("m_1", body("m_1", "down", 100), "", nil)
	e.eventually("paused, holding the payment", func() bool {
		return errors.Is(proc.Paused(e.ctx), consumer.ErrProviderUnavailable) && proc.Held() == 1
	})
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters, want 0", n)
	}
	rec, _ := e.store.Get(e.ctx, "m_1", "down")
	if rec.Status != ledger.StatusPending {
		t.Fatalf("row %s although the provider never answered, want pending", rec.Status)
	}
	if !rec.MaybeCharged {
		t.Fatal("a row whose calls all ended in 5xx must stay maybe_charged")
	}
}
