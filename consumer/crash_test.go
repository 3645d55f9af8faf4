package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/lab/storehook"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/reconciler"
	"github.com/paydedup/paydedup/stream"
)

func TestCrashAfterChargeBeforeCommit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// The first commit hangs until released, and every claim after it too:
	// a worker that charged and then died before its commit, and does
	// nothing more.
	hung, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hangOnce := func(context.Context, *storehook.Call) error {
		first := false
		once.Do(func() { first = true })
		if first {
			close(hung)
			<-release
		}
		return nil
	}
	hs := storehook.Wrap(e.store).
		Before(storehook.Complete, hangOnce).
		Before(storehook.CompleteBatch, hangOnce).
		Before(storehook.ClaimBatch, func(ctx context.Context, _ *storehook.Call) error {
			select {
			case <-hung:
				select {
				case <-release:
				case <-ctx.Done():
				}
				return fmt.Errorf("worker is dead")
			default:
				return nil
			}
		})
	cfg := e.cfg
	cfg.Holder = "dies"
	w, err := consumer.NewWorker(e.nc, consumer.NewProcessor(hs, e.stripe, cfg, nil), cfg, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	e.waitStreams()
	e.publish("m_1", body("m_1", "crash", 4200), "", nil)
	select {
	case <-hung:
	case <-time.After(30 * time.Second):
		t.Fatal("the charge never reached the commit")
	}
	if n := e.charges("m_1", "crash"); n != 1 {
		t.Fatalf("%d charges before the crash, want 1", n)
	}
	chargeID := e.sim.Charges()[0].ID
	// The process is dead: it fetches nothing more. (Its drain gives up on
	// the hung commit; Run returns once the test releases it.)
	cancel()

	// A healthy worker takes over once the lease expires and JetStream
	// redelivers (AckWait): it re-calls with the same provider key, the
	// provider replays, and the row completes with the original charge.
	e.startWorker("healthy", nil)
	e.eventually("row completed by the healthy worker", func() bool {
		rec, err := e.store.Get(e.ctx, "m_1", "crash")
		return err == nil && rec.Status == ledger.StatusCompleted
	})
	rec, _ := e.store.Get(e.ctx, "m_1", "crash")
	if rec.ChargeID != chargeID || rec.LockedBy != "healthy" {
		t.Fatalf("completed with %s by %s, want the original charge %s by another holder", rec.ChargeID, rec.LockedBy, chargeID)
	}
	// The dead worker wakes up: its stale commit is fenced out.
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e.quiescent()
	if n := e.charges("m_1", "crash"); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
	if n := e.count(`SELECT count(*) FROM payments`); n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
}

func TestChargeThenDropRedeliveryReplays(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if err := e.sim.SetFaults(stripesim.Faults{RateDropAfterCharge: 1}); err != nil {
		t.Fatal(err)
	}
	e.startWorker("w1", nil)
	e.publish("m_1", body("m_1", "drop", 777), "", nil)
	e.eventually("charged at the provider", func() bool { return e.charges("m_1", "drop") == 1 })
	e.eventually("outcome unknown, row released", func() bool {
		rec, err := e.store.Get(e.ctx, "m_1", "drop")
		return err == nil && rec.Status == ledger.StatusPending && rec.MaybeCharged
	})
	if err := e.sim.SetFaults(stripesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("completed from the provider's replay", func() bool {
		rec, err := e.store.Get(e.ctx, "m_1", "drop")
		return err == nil && rec.Status == ledger.StatusCompleted
	})
	e.quiescent()
	rec, _ := e.store.Get(e.ctx, "m_1", "drop")
	if n := e.charges("m_1", "drop"); n != 1 || rec.ChargeID != e.sim.Charges()[0].ID {
		t.Fatalf("%d charges, completed with %s: want the one original charge", n, rec.ChargeID)
	}
}

func TestReconcilerCompletesAbandonedCharge(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// The state a worker leaves when it dies between the provider's charge
	// and the commit, with its message already gone (acked by a bug, or
	// dead-lettered): a pending row and a charge at the provider.
	cmd := &cmdJSON{MerchantID: "m_1", IdempotencyKey: "orphan", Amount: 900, Currency: "usd", PaymentMethod: "pm_card_visa"}
	b, _ := json.Marshal(cmd)
	_ = b
	res, err := e.store.Claim(e.ctx, "dead-worker", time.Second, ledger.ClaimRequest{
		MerchantID: "m_1", IdempotencyKey: "orphan", RequestHash: make([]byte, 32), Amount: 900, Currency: "usd",
	})
	if err != nil || res.Lease == nil {
		t.Fatalf("claim: %v", err)
	}
	out, err := e.stripe.Charge(e.ctx, provider.ChargeRequest{
		ProviderKey: res.Lease.ProviderKey, MerchantID: "m_1", IdempotencyKey: "orphan",
		Amount: 900, Currency: "usd", PaymentMethod: "pm_card_visa",
	})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := reconciler.New(e.store, e.stripe, reconciler.Config{Grace: time.Millisecond, SearchLag: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e.eventually("lease expired", func() bool {
		r, err := rec.RunOnce(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		return r.Completed == 1
	})
	got, _ := e.store.Get(e.ctx, "m_1", "orphan")
	if got.Status != ledger.StatusCompleted || got.ChargeID != out.ChargeID {
		t.Fatalf("row %s with %s, want completed with %s", got.Status, got.ChargeID, out.ChargeID)
	}
	if n := e.charges("m_1", "orphan"); n != 1 {
		t.Fatalf("%d charges, want 1: the reconciler must never charge", n)
	}
}

func TestMaxDeliveriesAdvisoryCopiesUnsettledMessage(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := e.cfg
	cfg.Stream.MaxDeliver = 2
	cfg.Stream.AckWait = 500 * time.Millisecond
	_, cons, err := stream.EnsureStreams(e.ctx, e.js, cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	stopNet := runNet(t, e, cfg, nil)
	defer stopNet()
	data := body("m_1", "never-settled", 100)
	e.publish("m_1", data, "orig-id", nil)
	// A worker that dies on every delivery: fetch and never settle.
	var deliveries atomic.Int32
	for deliveries.Load() < 2 {
		b, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for range b.Messages() {
			deliveries.Add(1)
		}
	}
	// The server announces the exhausted message when it next tries to
	// deliver, so something must keep pulling, as live workers do.
	e.eventually("advisory copied the message", func() bool {
		b, err := cons.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond))
		if err == nil {
			for range b.Messages() {
				deliveries.Add(1)
			}
		}
		return len(e.deadLetters()) == 1
	})
	if deliveries.Load() != 2 {
		t.Fatalf("%d deliveries, want 2", deliveries.Load())
	}
	dl := e.deadLetters()[0]
	p, err := stream.ParseDeadLetter(dl.Header)
	if err != nil || p.Reason != stream.ReasonMaxDeliveries || p.Deliveries != 2 || string(dl.Data) != string(data) {
		t.Fatalf("dead letter %+v %v, body %q", p, err, dl.Data)
	}
	if dl.Header.Get("Dlq-Orig-Msg-Id") != "orig-id" {
		t.Fatalf("original message id not kept: %v", dl.Header)
	}
	// A repeated advisory (another pod, a retry) files nothing new.
	adv, _ := json.Marshal(map[string]any{"stream": cfg.Stream.Name, "consumer": cfg.Stream.Durable, "stream_seq": p.OrigSeq, "deliveries": 2})
	if err := e.nc.Publish(stream.AdvisorySubject(cfg.Stream.Name, cfg.Stream.Durable), adv); err != nil {
		t.Fatal(err)
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// Wait for the listener to have handled it: a marker message published
	// after it is dead-lettered... the listener is sequential, so poll the
	// DLQ's last sequence for a while instead of sleeping blindly.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if n := len(e.deadLetters()); n != 1 {
			t.Fatalf("%d dead letters after a repeated advisory, want 1", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestSIGTERMDrainNeverAcksUnfinished(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// Slow provider: every charge takes 1.5 s, longer than the drain allows.
	if err := e.sim.SetFaults(stripesim.Faults{Latency: 1500 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	cfg := e.cfg
	cfg.ProviderTry = provider.RetryPolicy{MaxTries: 1, AttemptTimeout: 2 * time.Second}
	cfg.DrainTimeout = 200 * time.Millisecond
	e.cfg = cfg
	stop := e.startWorker("w1", nil)
	const n = 20
	for i := range n {
		e.publish("m_1", body("m_1", fmt.Sprintf("t-%d", i), 100), "", nil)
	}
	e.eventually("payments in flight", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'pending'`) > 0
	})
	stop() // SIGTERM: drain deadline passes with calls in flight
	// Nothing unfinished was acked: every message not completed is pending
	// redelivery in the consumer.
	completed := e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`)
	c := e.workerConsumer()
	info, err := c.Info(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Each unfinished payment's message must still be owed: nakked back to
	// pending, or awaiting its delayed redelivery. An acked one would be
	// missing from these counts.
	if unacked := int(info.NumPending) + info.NumAckPending; unacked < n-completed {
		t.Fatalf("%d messages still owed but %d payments unfinished: unfinished work was acked", unacked, n-completed)
	}
	if completed == n {
		t.Fatal("every payment finished before the drain deadline: the test proves nothing")
	}
	// After a restart every command is charged exactly once.
	if err := e.sim.SetFaults(stripesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	e.cfg.DrainTimeout = 2 * time.Second
	e.startWorker("w2", nil)
	e.eventually("all completed after restart", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == n
	})
	e.quiescent()
	for i := range n {
		if c := e.charges("m_1", fmt.Sprintf("t-%d", i)); c != 1 {
			t.Errorf("t-%d charged %d times", i, c)
		}
	}
}

var _ = nats.MsgIdHdr

// runNet runs the max-deliveries net, telling intake (nil: none), until
// the returned stop is called.
func runNet(t *testing.T, e *env, cfg consumer.Config, intake consumer.OperatorMarker) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- consumer.RunMaxDeliveriesNet(ctx, e.js, cfg, nil, intake, e.store) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("max-deliveries net: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// The net is durable: a message that runs out of deliveries while no
// worker listens (a rolling restart) is dead-lettered, once, when one
// starts again; and while the DLQ refuses writes the advisory waits.
func TestMaxDeliveriesNetSurvivesRestart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := e.cfg
	cfg.Stream.MaxDeliver, cfg.Stream.AckWait = 2, 500*time.Millisecond
	_, cons, err := stream.EnsureStreams(e.ctx, e.js, cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	adv, err := e.js.Stream(e.ctx, cfg.WithDefaults().Stream.AdvisoryStream)
	if err != nil {
		t.Fatal(err)
	}
	// The DLQ refuses writes at first.
	dlq, err := e.js.Stream(e.ctx, cfg.Stream.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	full := dlq.CachedInfo().Config
	full.MaxMsgs, full.Discard = 1, jetstream.DiscardNew
	if _, err := e.js.UpdateStream(e.ctx, full); err != nil {
		t.Fatal(err)
	}
	filler := nats.NewMsg(cfg.Stream.DLQPrefix + ".filler")
	if _, err := e.js.PublishMsg(e.ctx, filler); err != nil {
		t.Fatal(err)
	}

	// No net runs. A worker that dies on every delivery: fetch, never
	// settle, and keep pulling so the server gives up on the message.
	e.publish("m_1", body("m_1", "orphan", 100), "", nil)
	e.eventually("the advisory captured", func() bool {
		if b, err := cons.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond)); err == nil {
			for range b.Messages() {
			}
		}
		info, err := adv.Info(e.ctx)
		return err == nil && info.State.Msgs == 1
	})

	var buf testenv.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- consumer.RunMaxDeliveriesNet(ctx, e.js, cfg, slog.New(slog.NewJSONHandler(&buf, nil)), nil, e.store)
	}()
	defer func() { cancel(); <-done }()
	e.eventually("the net tried the refusing DLQ twice", func() bool {
		return strings.Count(buf.String(), "could not dead-letter") >= 2
	})
	if info, err := adv.Info(e.ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("the advisory was dropped after a failed publish: %+v %v", info, err)
	}
	open := full
	open.MaxMsgs, open.Discard = -1, jetstream.DiscardOld
	if _, err := e.js.UpdateStream(e.ctx, open); err != nil {
		t.Fatal(err)
	}
	e.eventually("dead letter filed", func() bool { return len(e.deadLetters()) == 2 })
	e.eventually("the advisory acked", func() bool {
		info, err := adv.Info(e.ctx)
		return err == nil && info.State.Msgs == 0
	})
	var filed int
	for _, m := range e.deadLetters() {
		if p, err := stream.ParseDeadLetter(m.Header); err == nil {
			filed++
			if p.Reason != stream.ReasonMaxDeliveries || p.Deliveries != 2 {
				t.Errorf("dead letter %+v", p)
			}
		}
	}
	if filed != 1 {
		t.Fatalf("%d dead letters, want 1", filed)
	}
}
