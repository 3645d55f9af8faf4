package consumer_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/stream"
)

// dyingWorker pulls from the consumer and never settles what it gets, as a
// worker killed with each message in hand does, until stop is closed. It
// counts the deliveries it took.
func dyingWorker(t *testing.T, cons jetstream.Consumer, stop <-chan struct{}) (deliveries *atomic.Int32, done <-chan struct{}) {
	t.Helper()
	deliveries = new(atomic.Int32)
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		for {
			select {
			case <-stop:
				return
			default:
			}
			b, err := cons.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond))
			if err != nil {
				continue
			}
			for range b.Messages() {
				deliveries.Add(1)
			}
		}
	}()
	return deliveries, ch
}

// streamMsgs reads every message the payments stream holds.
func (e *env) streamMsgs(cfg consumer.Config) []*jetstream.RawStreamMsg {
	e.t.Helper()
	return e.streamMessages(cfg.Stream.Name)
}

// requeueSetup is a stream whose messages run out after 2 deliveries of
// 500 ms each, with the net running over js and requeueing up to requeues
// times.
func requeueSetup(t *testing.T, e *env, js jetstream.JetStream, requeues int) (consumer.Config, jetstream.Consumer) {
	t.Helper()
	cfg := e.cfg
	cfg.Stream.MaxDeliver, cfg.Stream.AckWait = 2, 500*time.Millisecond
	cfg.NetRequeues = requeues
	_, cons, err := stream.EnsureStreams(e.ctx, e.js, cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- consumer.RunMaxDeliveriesNet(ctx, js, cfg, nil, nil, e.store) }()
	t.Cleanup(func() { cancel(); <-done })
	return cfg, cons
}

// TestNetRequeuesWhatCrashesSpent: a payment whose deliveries were all
// spent by workers that died holding it (kill -9 during an outage, a
// crash-looping pod) did nothing wrong; filed max_deliveries it would wait
// for an operator, its client told "retrying" for good. The net publishes
// it again, once, as a new message with deliveries of its own, and a live
// worker charges it: no dead letter, charged once.
func TestNetRequeuesWhatCrashesSpent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg, cons := requeueSetup(t, e, e.js, 1)
	e.publish("m_1", body("m_1", "crash-spent", 700), stream.MsgID("m_1", "crash-spent"), nil)

	stop := make(chan struct{})
	deliveries, dead := dyingWorker(t, cons, stop)
	e.eventually("the first copy ran out of deliveries", func() bool {
		return deliveries.Load() >= 2 && (len(e.streamMsgs(cfg)) == 2 || len(e.deadLetters()) > 0)
	})
	close(stop)
	<-dead
	if dls := e.deadLetters(); len(dls) != 0 {
		p, _ := stream.ParseDeadLetter(dls[0].Header)
		t.Fatalf("the net filed %d dead letter(s) (%s: %s) for a payment its workers died holding; want it published again", len(dls), p.Reason, p.Error)
	}
	msgs := e.streamMsgs(cfg)
	again := msgs[1]
	if id := again.Header.Get(nats.MsgIdHdr); id != stream.RequeueMsgID(cfg.Stream, msgs[0].Sequence) {
		t.Errorf("the new copy's Nats-Msg-Id is %q, want %q", id, stream.RequeueMsgID(cfg.Stream, msgs[0].Sequence))
	}
	if got := again.Header.Get(stream.HeaderRequeues); got != "1" {
		t.Errorf("%s: %q, want 1", stream.HeaderRequeues, got)
	}
	if again.Subject != msgs[0].Subject || string(again.Data) != string(msgs[0].Data) || again.Header.Get(stream.HeaderIdempotencyKey) != msgs[0].Header.Get(stream.HeaderIdempotencyKey) {
		t.Errorf("the new copy %q %q %v is not the command %q %q %v", again.Subject, again.Data, again.Header, msgs[0].Subject, msgs[0].Data, msgs[0].Header)
	}

	e.startWorker("alive", nil)
	e.eventually("the payment completed", func() bool {
		rec, err := e.store.Get(e.ctx, "m_1", "crash-spent")
		return err == nil && rec.Status == ledger.StatusCompleted
	})
	e.quiescent()
	if n := e.charges("m_1", "crash-spent"); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
	if dls := e.deadLetters(); len(dls) != 0 {
		t.Fatalf("%d dead letters, want none", len(dls))
	}
}

// TestNetFilesWhenRequeuesRunOut: a message that kills every worker that
// takes it is published again NetRequeues times and then filed
// max_deliveries, once: (NetRequeues+1) × MaxDeliver deliveries in all.
func TestNetFilesWhenRequeuesRunOut(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg, cons := requeueSetup(t, e, e.js, 1)
	e.publish("m_1", body("m_1", "poison", 700), stream.MsgID("m_1", "poison"), nil)

	stop := make(chan struct{})
	deliveries, dead := dyingWorker(t, cons, stop)
	e.eventually("the letter filed", func() bool { return len(e.deadLetters()) > 0 })
	adv, err := e.js.Stream(e.ctx, cfg.WithDefaults().Stream.AdvisoryStream)
	if err != nil {
		t.Fatal(err)
	}
	e.eventually("every advisory acked", func() bool {
		info, err := adv.Info(e.ctx)
		return err == nil && info.State.Msgs == 0
	})
	close(stop)
	<-dead
	if n := deliveries.Load(); n != 4 {
		t.Errorf("%d deliveries, want 4: 2 of the command and 2 of its one new copy", n)
	}
	if n := len(e.streamMsgs(cfg)); n != 2 {
		t.Errorf("%d messages in the stream, want the command and one copy", n)
	}
	dls := e.deadLetters()
	if len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dls))
	}
	p, err := stream.ParseDeadLetter(dls[0].Header)
	if err != nil || p.Reason != stream.ReasonMaxDeliveries || p.Deliveries != 2 {
		t.Fatalf("dead letter %+v %v, want max_deliveries after 2", p, err)
	}
	if !strings.Contains(p.Error, "published again 1 time") {
		t.Errorf("the letter's error %q does not say the net published it again", p.Error)
	}
	if got := dls[0].Header.Get(stream.HeaderRequeues); got != "1" {
		t.Errorf("the letter's %s is %q, want 1", stream.HeaderRequeues, got)
	}
}

// pubAckLost is a JetStream whose first publish on subjects under prefix
// is stored and then answered with an error, as when the link drops after
// the server stored the message and before its PubAck arrived.
type pubAckLost struct {
	jetstream.JetStream
	prefix string
	once   sync.Once
	lost   atomic.Bool
}

func (j *pubAckLost) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ack, err := j.JetStream.PublishMsg(ctx, m, opts...)
	if err != nil || !strings.HasPrefix(m.Subject, j.prefix) {
		return ack, err
	}
	lose := false
	j.once.Do(func() { lose = true })
	if lose {
		j.lost.Store(true)
		return nil, fmt.Errorf("%w: the PubAck did not arrive", context.DeadlineExceeded)
	}
	return ack, nil
}

// TestNetRequeuePubAckLost: the net → NATS boundary of a requeue. The new
// copy is stored and its PubAck lost: the outcome is unknown, so the net
// neither files a letter nor acks the advisory; it tries again, the
// stream answers with a duplicate PubAck, the stored copy is checked to be
// this command, and only then is the advisory acked. One copy, charged
// once, no dead letter.
func TestNetRequeuePubAckLost(t *testing.T) {
	t.Parallel()
	e := setup(t)
	lossy := &pubAckLost{JetStream: e.js, prefix: e.cfg.Stream.SubjectPrefix + "."}
	cfg, cons := requeueSetup(t, e, lossy, 1)
	e.publish("m_1", body("m_1", "ack-lost", 700), stream.MsgID("m_1", "ack-lost"), nil)

	stop := make(chan struct{})
	_, dead := dyingWorker(t, cons, stop)
	e.eventually("the new copy stored", func() bool { return len(e.streamMsgs(cfg)) == 2 || len(e.deadLetters()) > 0 })
	close(stop)
	<-dead
	adv, err := e.js.Stream(e.ctx, cfg.WithDefaults().Stream.AdvisoryStream)
	if err != nil {
		t.Fatal(err)
	}
	e.eventually("the advisory acked after the retry", func() bool {
		info, err := adv.Info(e.ctx)
		return err == nil && info.State.Msgs == 0
	})
	if !lossy.lost.Load() {
		t.Fatal("no PubAck was lost: the test proves nothing")
	}
	if n := len(e.streamMsgs(cfg)); n != 2 {
		t.Fatalf("%d messages in the stream, want the command and one copy", n)
	}
	e.startWorker("alive", nil)
	e.eventually("the payment completed", func() bool {
		rec, err := e.store.Get(e.ctx, "m_1", "ack-lost")
		return err == nil && rec.Status == ledger.StatusCompleted
	})
	e.quiescent()
	if n := e.charges("m_1", "ack-lost"); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
	if dls := e.deadLetters(); len(dls) != 0 {
		t.Fatalf("%d dead letters, want none", len(dls))
	}
}

// unlucky refuses the connection to the first fails charges of one key and passes
// everything else on: a payment whose deliveries run out on transient
// answers, though nothing is wrong with it.
type unlucky struct {
	provider.Provider
	key   string
	fails int32
	calls *atomic.Int32
}

func (u unlucky) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	if req.IdempotencyKey == u.key && u.calls.Add(1) <= u.fails {
		return nil, refusedConnection()
	}
	return u.Provider.Charge(ctx, req)
}

// TestLastDeliveryWithoutOutcomeIsPublishedAgain: a payment whose last
// delivery ends without an outcome (a refused call while the provider answers the
// lookup, so no outage) is published again by the worker, up to
// NetRequeues times, and charged once when the provider takes it; only a
// payment that keeps failing through every copy is filed max_deliveries,
// its letter counting the copies. Kills may have spent the deliveries
// before the last; the last one failing alone proves nothing against the
// payment.
func TestLastDeliveryWithoutOutcomeIsPublishedAgain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		fails   int32
		letters int
	}{
		{"recovers in its copy", 0, 0}, // every try of every delivery of the command
		{"fails through every copy", 1 << 30, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			outageConfig(e)
			e.cfg.Stream.MaxDeliver = 2 * consumer.OutageAnswers
			e.cfg.NetRequeues = 1
			tries := int32(e.cfg.Stream.MaxDeliver * e.cfg.ProviderTry.MaxTries)
			fails := tc.fails
			if fails == 0 {
				fails = tries
			}
			u := unlucky{Provider: e.stripe, key: "unlucky", fails: fails, calls: new(atomic.Int32)}
			e.runPausable("w1", e.store, u)
			e.publish("m_1", body("m_1", "unlucky", 100), "", nil)
			var keys []string
			for i := range 20 {
				keys = append(keys, fmt.Sprintf("ok-%d", i))
				e.publish("m_1", body("m_1", keys[i], 100), "", nil)
			}
			if tc.letters == 0 {
				e.eventually("the unlucky payment charged", func() bool {
					rec, err := e.store.Get(e.ctx, "m_1", "unlucky")
					return (err == nil && rec.Status == ledger.StatusCompleted) || len(e.deadLetters()) > 0
				})
			} else {
				e.eventually("the letter filed", func() bool { return len(e.deadLetters()) > 0 })
			}
			e.quiescent()
			dls := e.deadLetters()
			if len(dls) != tc.letters {
				for _, d := range dls {
					p, _ := stream.ParseDeadLetter(d.Header)
					t.Logf("dead letter %s: %s (%s: %q)", p.Reason, p.Error, stream.HeaderRequeues, d.Header.Get(stream.HeaderRequeues))
				}
				t.Fatalf("%d dead letters, want %d", len(dls), tc.letters)
			}
			copies := 0
			for _, m := range e.streamMsgs(e.cfg) {
				if m.Header.Get(stream.HeaderRequeues) != "" {
					copies++
				}
			}
			if copies != 1 {
				t.Errorf("%d copies published again, want 1", copies)
			}
			if tc.letters == 0 {
				if n := e.charges("m_1", "unlucky"); n != 1 {
					t.Fatalf("charged %d times, want 1", n)
				}
			} else {
				p, err := stream.ParseDeadLetter(dls[0].Header)
				if err != nil || p.Reason != stream.ReasonMaxDeliveries || dls[0].Header.Get(stream.HeaderRequeues) != "1" {
					t.Fatalf("letter %+v %v (%s %q), want max_deliveries of the copy", p, err, stream.HeaderRequeues, dls[0].Header.Get(stream.HeaderRequeues))
				}
				if n := u.calls.Load(); n != 2*tries {
					t.Errorf("%d charge attempts, want %d: every try of every delivery of the command and of its copy", n, 2*tries)
				}
			}
			for _, k := range keys {
				if n := e.charges("m_1", k); n != 1 {
					t.Errorf("%s charged %d times, want 1", k, n)
				}
			}
		})
	}
}
