package stream_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/stream"
)

// adminSetup gives a test its own streams (and the durable consumer) on the
// shared NATS server, without Postgres.
func adminSetup(t *testing.T) (jetstream.JetStream, stream.Config) {
	t.Helper()
	js, err := jetstream.New(testenv.NATSConn(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := testenv.Streams(t, js).WithDefaults()
	if _, _, err := stream.EnsureStreams(context.Background(), js, cfg); err != nil {
		t.Fatal(err)
	}
	return js, cfg
}

// body is a payment command's JSON body.
var body = testenv.CommandBody

func TestPublisherWindowAndDuplicates(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	var (
		mu      sync.Mutex
		results []stream.PublishResult
	)
	pub, err := stream.NewPublisher(js.Conn(), stream.PublisherConfig{Window: 4, Retry: 300 * time.Millisecond, OnResult: func(r stream.PublishResult) {
		mu.Lock()
		defer mu.Unlock()
		results = append(results, r)
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const n = 50
	for i := range n {
		m := stream.CommandMsg(cfg, "m_1", fmt.Sprintf("k-%d", i), body("m_1", fmt.Sprintf("k-%d", i), 100))
		if err := pub.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
		if i%5 == 0 { // the same message again: dropped by the duplicate window
			if err := pub.Publish(ctx, stream.CommandMsg(cfg, "m_1", fmt.Sprintf("k-%d", i), body("m_1", fmt.Sprintf("k-%d", i), 100))); err != nil {
				t.Fatal(err)
			}
		}
		if out := pub.Stats().Outstanding(); out > 4 {
			t.Fatalf("%d messages await their PubAck, window is 4", out)
		}
	}
	// A subject no stream listens on: no PubAck.
	if err := pub.Publish(ctx, nats.NewMsg("nobody.listens."+testenv.Unique(t))); err != nil {
		t.Fatal(err)
	}
	st := pub.Close()
	if st.Sent != n+10+1 || st.Stored != n || st.Duplicates != 10 || st.Failed != 1 || st.Outstanding() != 0 {
		t.Fatalf("stats %+v", st)
	}
	if len(results) != st.Sent {
		t.Fatalf("%d results for %d messages", len(results), st.Sent)
	}
	if !results[1].Duplicate || results[0].Seq != results[1].Seq || results[len(results)-1].Err == nil {
		t.Fatalf("results out of order or wrong: first %+v, second %+v", results[0], results[1])
	}
	if err := pub.Publish(ctx, nats.NewMsg(cfg.SubjectPrefix+".m_1")); err == nil {
		t.Fatal("publish after Close succeeded")
	}
	m := stream.CommandMsg(cfg, "m_1", "k-0", nil)
	if m.Subject != cfg.SubjectPrefix+".m_1" || m.Header.Get("Idempotency-Key") != "k-0" || m.Header.Get(nats.MsgIdHdr) != "m_1:k-0" {
		t.Fatalf("command message %s %v", m.Subject, m.Header)
	}
}

func TestConsumerState(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	for i := range 3 {
		if _, err := js.PublishMsg(ctx, stream.CommandMsg(cfg, "m_1", fmt.Sprint(i), body("m_1", fmt.Sprint(i), 100))); err != nil {
			t.Fatal(err)
		}
	}
	st, err := stream.ConsumerState(ctx, js, cfg)
	if err != nil || st.NumPending != 3 || st.NumAckPending != 0 || st.StreamMessages != 3 || st.Durable != "w" {
		t.Fatalf("state %+v %v", st, err)
	}
	missing := cfg
	missing.Durable = "nobody"
	if _, err := stream.ConsumerState(ctx, js, missing); !errors.Is(err, stream.ErrNotSetUp) {
		t.Fatalf("missing consumer: %v", err)
	}
	missing.Name = "NO_SUCH_STREAM_" + strings.ToUpper(testenv.Unique(t))
	if _, err := stream.ConsumerState(ctx, js, missing); !errors.Is(err, stream.ErrNotSetUp) {
		t.Fatalf("missing stream: %v", err)
	}
}

// Idle says commands wait with no worker taking them: the consumer has
// them to deliver and no pull request waiting, delivered none unacked, and
// has been so for stream.IdleAfter; or it does not exist. A worker asking
// for messages is never idle.
func TestIdle(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	idle := func(now time.Time) (bool, time.Time) {
		t.Helper()
		idle, since, err := stream.Idle(ctx, js, cfg, now)
		if err != nil {
			t.Fatal(err)
		}
		return idle, since
	}
	later := time.Now().Add(stream.IdleAfter + time.Second)
	if ok, _ := idle(later); ok {
		t.Fatal("idle with nothing to deliver")
	}
	if _, err := js.PublishMsg(ctx, stream.CommandMsg(cfg, "m_1", "k", body("m_1", "k", 100))); err != nil {
		t.Fatal(err)
	}
	if ok, _ := idle(time.Now()); ok {
		t.Fatal("idle before IdleAfter has passed")
	}
	ok, since := idle(later)
	if !ok || since.IsZero() || time.Since(since) > time.Minute {
		t.Fatalf("a command waits, nobody asks: idle %v since %v, want idle since moments ago", ok, since)
	}
	// A worker asks: its pull request waits on the consumer.
	cons, err := js.Consumer(ctx, cfg.Name, cfg.Durable)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, stream.CommandMsg(cfg, "m_1", "k2", body("m_1", "k2", 100))); err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1)
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		_ = m // delivered, not acked: a worker at work
	}
	if ok, _ := idle(later); ok {
		t.Fatal("idle while a delivered command is unacked")
	}
	missing := cfg
	missing.Durable = "nobody"
	if ok, since, err := stream.Idle(ctx, js, missing, time.Now()); err != nil || !ok || !since.IsZero() {
		t.Fatalf("no consumer: idle %v since %v err %v, want idle (no worker ever started)", ok, since, err)
	}
}
