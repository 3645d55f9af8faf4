package consumer_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/lab/storehook"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
)

// TestAckLostAfterCommitRedeliveryAcks: the worker→NATS ack boundary. The
// worker commits the outcome and acks, and the ack is lost on the wire
// (the server never hears it: an unknown outcome for the worker). The
// server redelivers after AckWait; the redelivery finds the key completed
// and acks it without calling the provider: one charge, one ledger row, no
// dead letter.
func TestAckLostAfterCommitRedeliveryAcks(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.waitStreamsCreate()
	link := testenv.NewLink(t, "worker-nats", strings.TrimPrefix(testenv.NATSURL(t), "nats://"))
	nc, err := nats.Connect(link.URL("nats"), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	// The first commit, once committed, makes the worker's link to NATS
	// lose everything the worker sends: the outcome is in Postgres and the
	// ack that follows it never reaches the server.
	lost := make(chan struct{})
	var once sync.Once
	cut := func(_ context.Context, c *storehook.Call) error {
		if c.Err == nil {
			once.Do(func() {
				if err := link.Lose(testenv.ClientToServer); err == nil {
					close(lost)
				}
			})
		}
		return nil
	}
	store := storehook.Wrap(e.store).After(storehook.Complete, cut).After(storehook.CompleteBatch, cut)
	viaLink := *e
	viaLink.nc = nc
	viaLink.startWorkerOn("acks-into-the-void", store)

	e.publish("m_1", body("m_1", "ack-lost", 4200), "", nil)
	select {
	case <-lost:
	case <-time.After(30 * time.Second):
		t.Fatal("the outcome was never committed")
	}
	rec, err := e.store.Get(e.ctx, "m_1", "ack-lost")
	if err != nil || rec.Status != ledger.StatusCompleted {
		t.Fatalf("record %+v, %v; want completed before the ack", rec, err)
	}
	// The server did not hear the ack: the message is still pending there,
	// and once AckWait passes it is delivered again, here to a second
	// worker on a sound link.
	c := e.workerConsumer()
	if info, err := c.Info(e.ctx); err != nil || info.NumAckPending != 1 {
		t.Fatalf("consumer %+v, %v; want the message unacked", info, err)
	}
	e.startWorker("sound-link", nil)
	e.quiescent()
	info, err := c.Info(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Delivered.Consumer < 2 {
		t.Fatalf("%d deliveries, want the first and the one after its lost ack", info.Delivered.Consumer)
	}
	if n := e.charges("m_1", "ack-lost"); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
	if n := e.count(`SELECT count(*) FROM payments`); n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
	if dls := e.deadLetters(); len(dls) != 0 {
		t.Fatalf("%d dead letters, want none", len(dls))
	}
}

// TestDeadLetterPubAckLostFilesOnce: the worker→NATS dead-letter boundary.
// The worker dead-letters a reused key; the dead letter is stored and its
// PubAck lost (an unknown outcome: it may have been filed). The worker
// does not take the message as done: it is delivered again, and the second
// filing, under the same Nats-Msg-Id, is dropped by the DLQ's duplicate
// window. One dead letter, the message settled, the first payment charged
// once.
func TestDeadLetterPubAckLostFilesOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.waitStreamsCreate()
	stopFirst := e.startWorker("first", nil)
	e.publish("m_1", body("m_1", "reused", 4200), "", nil)
	e.eventually("the first payment completed", func() bool {
		rec, err := e.store.Get(e.ctx, "m_1", "reused")
		return err == nil && rec.Status == ledger.StatusCompleted
	})
	stopFirst()

	link := testenv.NewLink(t, "worker-nats", strings.TrimPrefix(testenv.NATSURL(t), "nats://"))
	nc, err := nats.Connect(link.URL("nats"), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	// The first claim that finds the key reused makes the worker's link to
	// NATS lose everything the server sends: the dead letter the worker
	// then publishes is stored, and its PubAck never arrives.
	lost := make(chan struct{})
	var once sync.Once
	store := storehook.Wrap(e.store).After(storehook.ClaimBatch, func(_ context.Context, c *storehook.Call) error {
		for _, r := range c.Results {
			if r.Outcome == ledger.Mismatch {
				once.Do(func() {
					if err := link.Lose(testenv.ServerToClient); err == nil {
						close(lost)
					}
				})
			}
		}
		return nil
	})
	viaLink := *e
	viaLink.nc = nc
	viaLink.startWorkerOn("dead-letters-into-the-void", store)

	e.publish("m_1", body("m_1", "reused", 9900), "", nil)
	select {
	case <-lost:
	case <-time.After(30 * time.Second):
		t.Fatal("the reused key was never claimed")
	}
	e.eventually("the dead letter stored", func() bool { return len(e.deadLetters()) == 1 })
	if err := link.Restore(); err != nil {
		t.Fatal(err)
	}
	e.quiescent()
	if dls := e.deadLetters(); len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dls))
	}
	c := e.workerConsumer()
	info, err := c.Info(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Two messages, and the second delivered again after its lost PubAck.
	if info.Delivered.Consumer < 3 {
		t.Fatalf("%d deliveries, want the reused key's delivered again", info.Delivered.Consumer)
	}
	if n := e.charges("m_1", "reused"); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

// TestClaimAndCommitAnswersLost: the worker→PostgreSQL boundary. The first
// claim and the first commit take effect, and their answers are lost: the
// worker sees an error that may have happened. A claim it cannot see is a
// lease it holds without knowing (the message waits for the lease and is
// claimed again); a commit it cannot see is an outcome already recorded
// (the next claim finds it completed and acks). Each payment is charged
// once and completed, and nothing is dead-lettered.
func TestClaimAndCommitAnswersLost(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.waitStreamsCreate()
	const n = 20
	for i := range n {
		e.publish("m_1", body("m_1", fmt.Sprintf("lost-%d", i), 100), "", nil)
	}
	// The first claim and the first commit are carried out and then
	// reported failed, as when the connection drops after PostgreSQL
	// committed and before its answer arrived.
	claimLost, commitLost := make(chan struct{}), make(chan struct{})
	var claimOnce, commitOnce sync.Once
	loseOnce := func(once *sync.Once, lost chan struct{}, what string) storehook.Hook {
		return func(_ context.Context, c *storehook.Call) error {
			if c.Err != nil {
				return nil
			}
			first := false
			once.Do(func() { first = true; close(lost) })
			if first {
				return fmt.Errorf("%s: %w: connection reset after the commit", what, ledger.ErrUnavailable)
			}
			return nil
		}
	}
	s := storehook.Wrap(e.store).
		After(storehook.ClaimBatch, loseOnce(&claimOnce, claimLost, "claim keys")).
		After(storehook.CompleteBatch, loseOnce(&commitOnce, commitLost, "complete keys")).
		After(storehook.Complete, loseOnce(&commitOnce, commitLost, "complete key"))
	e.startWorkerOn("w1", s)
	e.eventually("all completed", func() bool {
		return e.count(`SELECT count(*) FROM payments`) == n
	})
	e.quiescent()
	for _, ch := range []chan struct{}{claimLost, commitLost} {
		select {
		case <-ch:
		default:
			t.Fatal("a claim's or a commit's answer was never lost")
		}
	}
	for i := range n {
		if c := e.charges("m_1", fmt.Sprintf("lost-%d", i)); c != 1 {
			t.Fatalf("lost-%d: %d charges, want 1", i, c)
		}
	}
	if k := e.count(`SELECT count(*) FROM idempotency_keys WHERE status <> 'completed'`); k != 0 {
		t.Fatalf("%d keys not completed", k)
	}
	if dls := e.deadLetters(); len(dls) != 0 {
		t.Fatalf("%d dead letters, want none", len(dls))
	}
}
