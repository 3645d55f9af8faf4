package consumer_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/stream"
)

// While the dead-letter stream refuses writes, a message that must be
// dead-lettered is nakked and redelivered, never terminated: a Term after a
// failed publish would lose it. Once the stream accepts writes again, the
// letter is filed exactly once and the message settles.
func TestDLQRefusesWritesNaks(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.cfg.Stream.MaxDeliver = 1000 // the refusal, not the delivery limit, is under test
	var buf testenv.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e.startWorkerLogged("refused", logger)

	// The DLQ holds one message and refuses the next (DiscardNew).
	dlq, err := e.js.Stream(e.ctx, e.cfg.Stream.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	full := dlq.CachedInfo().Config
	full.MaxMsgs, full.Discard = 1, jetstream.DiscardNew
	if _, err := e.js.UpdateStream(e.ctx, full); err != nil {
		t.Fatalf("limit the DLQ: %v", err)
	}
	filler := nats.NewMsg(e.cfg.Stream.DLQPrefix + ".filler")
	filler.Data = []byte("occupies the only slot")
	if _, err := e.js.PublishMsg(e.ctx, filler); err != nil {
		t.Fatal(err)
	}
	probe := nats.NewMsg(e.cfg.Stream.DLQPrefix + ".probe")
	if _, err := e.js.PublishMsg(e.ctx, probe); err == nil {
		t.Fatal("the full DLQ accepted a write: the test would prove nothing")
	}

	e.publish("m_1", []byte(`{"merchant_id": "m_1", not json`), "", nil)
	e.eventually("the message redelivered after failed dead-letter publishes", func() bool {
		if strings.Count(buf.String(), "dead-letter publish failed") >= 3 {
			return true
		}
		// Settled while its letter is refused: terminated or acked, lost.
		// Said at once, not when the wait times out.
		if e.settled() {
			t.Fatal("the message settled while the dead-letter stream refused its letter: lost")
		}
		return false
	})
	if n := len(e.deadLetters()); n != 1 {
		t.Fatalf("%d messages in the full DLQ, want only the filler", n)
	}

	open := full
	open.MaxMsgs, open.Discard = -1, jetstream.DiscardOld
	if _, err := e.js.UpdateStream(e.ctx, open); err != nil {
		t.Fatalf("reopen the DLQ: %v", err)
	}
	e.eventually("dead letter filed", func() bool { return len(e.deadLetters()) == 2 })
	e.quiescent()
	var filed int
	for _, m := range e.deadLetters() {
		if p, err := stream.ParseDeadLetter(m.Header); err == nil {
			filed++
			if p.Reason != "malformed_json" || p.Deliveries < 4 {
				t.Errorf("dead letter %+v, want malformed_json after at least 4 deliveries", p)
			}
		}
	}
	if filed != 1 {
		t.Fatalf("%d dead letters filed, want exactly 1", filed)
	}
}

// A dead letter's Dlq-Failed-At is the worker's clock's time (Config.Clock),
// not the process's wall clock read directly.
func TestDeadLetterFailedAtFromClock(t *testing.T) {
	t.Parallel()
	e := setup(t)
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	e.cfg.Clock = clock.NewFake(at)
	e.startWorker("clocked", nil)
	e.publish("m_1", []byte(`{"merchant_id": "m_1", not json`), "", nil)
	e.eventually("dead letter filed", func() bool { return len(e.deadLetters()) == 1 })
	p, err := stream.ParseDeadLetter(e.deadLetters()[0].Header)
	if err != nil {
		t.Fatal(err)
	}
	if !p.FailedAt.Equal(at) {
		t.Fatalf("Dlq-Failed-At %v, want the clock's %v", p.FailedAt, at)
	}
}
