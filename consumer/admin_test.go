package consumer_test

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

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/internal/testenv"
)

// adminSetup gives a test its own streams (and the durable consumer) on the
// shared NATS server, without Postgres.
func adminSetup(t *testing.T) (jetstream.JetStream, consumer.Config) {
	t.Helper()
	nc := testenv.NATSConn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	u := testenv.Unique(t)
	name := strings.ToUpper(u)
	cfg := consumer.Config{
		Stream: name, SubjectPrefix: u + ".req", DLQStream: name + "_DLQ", DLQPrefix: u + ".dlq", Durable: "w",
		StreamMaxAge: time.Hour, DLQMaxAge: time.Hour, DLQKey: []byte(testenv.DLQKey),
	}.WithDefaults()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, cfg.Stream)
		_ = js.DeleteStream(ctx, cfg.DLQStream)
		_ = js.DeleteStream(ctx, cfg.WithDefaults().AdvisoryStream)
	})
	if _, _, err := consumer.EnsureStreams(context.Background(), js, cfg); err != nil {
		t.Fatal(err)
	}
	return js, cfg
}

// fileDeadLetter files a dead letter for a payment body directly.
func fileDeadLetter(t *testing.T, js jetstream.JetStream, cfg consumer.Config, reason, merchant, key string, failedAt time.Time) uint64 {
	t.Helper()
	h := nats.Header{}
	h.Set(consumer.HeaderIdempotencyKey, key)
	h.Set(nats.MsgIdHdr, merchant+":"+key)
	h.Set("X-Custom", "kept")
	d := consumer.Letter{
		Reason: reason, Err: errors.New("it failed"), OrigSubject: cfg.SubjectPrefix + "." + merchant, OrigStream: cfg.Stream,
		// OrigSeq is distinct: the dead letter's Nats-Msg-Id is built from it.
		OrigSeq: uint64(time.Now().UnixNano()), Deliveries: 3, Header: h, Data: body(merchant, key, 100), FailedAt: failedAt,
	}
	ack, err := js.PublishMsg(context.Background(), d.Msg(cfg))
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

func TestPublisherWindowAndDuplicates(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	var (
		mu      sync.Mutex
		results []consumer.PublishResult
	)
	pub, err := consumer.NewPublisher(js.Conn(), consumer.PublisherConfig{Window: 4, OnResult: func(r consumer.PublishResult) {
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
		m := consumer.CommandMsg(cfg, "m_1", fmt.Sprintf("k-%d", i), body("m_1", fmt.Sprintf("k-%d", i), 100))
		if err := pub.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
		if i%5 == 0 { // the same message again: dropped by the duplicate window
			if err := pub.Publish(ctx, consumer.CommandMsg(cfg, "m_1", fmt.Sprintf("k-%d", i), body("m_1", fmt.Sprintf("k-%d", i), 100))); err != nil {
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
	m := consumer.CommandMsg(cfg, "m_1", "k-0", nil)
	if m.Subject != cfg.SubjectPrefix+".m_1" || m.Header.Get("Idempotency-Key") != "k-0" || m.Header.Get(nats.MsgIdHdr) != "m_1:k-0" {
		t.Fatalf("command message %s %v", m.Subject, m.Header)
	}
}

func TestListDeadLettersFilters(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	now := time.Now()
	s1 := fileDeadLetter(t, js, cfg, consumer.ReasonMaxDeliveries, "m_1", "a", now)
	s2 := fileDeadLetter(t, js, cfg, consumer.ReasonKeyReused, "m_2", "b", now)
	s3 := fileDeadLetter(t, js, cfg, consumer.ReasonMaxDeliveries, "m_1", "c", now)
	// Not a dead letter at all: listed, marked invalid.
	bad := nats.NewMsg(cfg.DLQPrefix + ".junk")
	bad.Data = []byte("{")
	if _, err := js.PublishMsg(ctx, bad); err != nil {
		t.Fatal(err)
	}

	all, err := consumer.ListDeadLetters(ctx, js, cfg, consumer.DLQFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 4 || all[0].Seq != s1 || all[1].Seq != s2 || all[2].Seq != s3 {
		t.Fatalf("list: %+v", all)
	}
	d := all[1]
	if d.Reason != consumer.ReasonKeyReused || d.MerchantID != "m_2" || d.IdempotencyKey != "b" || d.Deliveries != 3 ||
		d.Error != "it failed" || d.OrigSubject != cfg.SubjectPrefix+".m_2" || d.Invalid != "" {
		t.Fatalf("dead letter %+v", d)
	}
	if all[3].Invalid == "" || all[3].Reason != "junk" {
		t.Fatalf("a message without Dlq headers: %+v", all[3])
	}

	byReason, err := consumer.ListDeadLetters(ctx, js, cfg, consumer.DLQFilter{Reason: consumer.ReasonMaxDeliveries})
	if err != nil || len(byReason) != 2 || byReason[1].IdempotencyKey != "c" {
		t.Fatalf("by reason: %+v %v", byReason, err)
	}
	limited, err := consumer.ListDeadLetters(ctx, js, cfg, consumer.DLQFilter{Limit: 1})
	if err != nil || len(limited) != 1 || limited[0].Seq != s1 {
		t.Fatalf("limit 1: %+v %v", limited, err)
	}
	future, err := consumer.ListDeadLetters(ctx, js, cfg, consumer.DLQFilter{Since: time.Now().Add(time.Hour)})
	if err != nil || len(future) != 0 {
		t.Fatalf("since the future: %+v %v", future, err)
	}
	none, err := consumer.ListDeadLetters(ctx, js, cfg, consumer.DLQFilter{Reason: "no_such_reason"})
	if err != nil || len(none) != 0 {
		t.Fatalf("unknown reason: %+v %v", none, err)
	}

	counts, err := consumer.DeadLetterCounts(ctx, js, cfg)
	if err != nil || counts[consumer.ReasonMaxDeliveries] != 2 || counts[consumer.ReasonKeyReused] != 1 || counts["junk"] != 1 {
		t.Fatalf("counts %v %v", counts, err)
	}
	if _, err := consumer.GetDeadLetter(ctx, js, cfg, 999); !errors.Is(err, consumer.ErrDeadLetterNotFound) {
		t.Fatalf("missing sequence: %v", err)
	}
}

func TestReplayDeadLetters(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	now := time.Now()
	ok := fileDeadLetter(t, js, cfg, consumer.ReasonMaxDeliveries, "m_1", "ok", now)
	reused := fileDeadLetter(t, js, cfg, consumer.ReasonKeyReused, "m_1", "reused", now)

	streamMsgs := func() uint64 {
		s, err := js.Stream(ctx, cfg.Stream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}

	if _, err := consumer.ReplayDeadLetters(ctx, js, cfg, consumer.ReplayOptions{}); err == nil {
		t.Fatal("neither sequences nor All: accepted")
	}
	dry, err := consumer.ReplayDeadLetters(ctx, js, cfg, consumer.ReplayOptions{All: true, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if dry.WouldReplay != 1 || dry.Skipped != 1 || dry.Refused != 0 || dry.Replayed != 0 {
		t.Fatalf("dry run %+v", dry)
	}
	if n := streamMsgs(); n != 0 {
		t.Fatalf("a dry run published %d messages", n)
	}

	// Three days on, past the key retention, every letter is refused.
	old, err := consumer.ReplayDeadLetters(ctx, js, cfg, consumer.ReplayOptions{All: true, DryRun: true, Force: true, Now: now.Add(72 * time.Hour)})
	if err != nil || old.Refused != 2 || !strings.Contains(old.Results[0].Detail, "key retention") {
		t.Fatalf("past the key retention: %+v %v", old, err)
	}

	rep, err := consumer.ReplayDeadLetters(ctx, js, cfg, consumer.ReplayOptions{Seqs: []uint64{ok, reused, 999, ok}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Replayed != 1 || rep.Skipped != 1 || rep.Refused != 0 || rep.NotFound != 1 || len(rep.Results) != 3 {
		t.Fatalf("replay %+v", rep)
	}
	res := rep.Results[0]
	if res.Seq != ok || res.Outcome != consumer.Replayed || res.Subject != cfg.SubjectPrefix+".m_1" || res.MsgID != fmt.Sprintf("replay:%s:%d", cfg.DLQStream, ok) {
		t.Fatalf("replayed %+v", res)
	}
	s, _ := js.Stream(ctx, cfg.Stream)
	m, err := s.GetMsg(ctx, res.StreamSeq)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != string(body("m_1", "ok", 100)) || m.Header.Get("Idempotency-Key") != "ok" || m.Header.Get("X-Custom") != "kept" ||
		m.Header.Get(nats.MsgIdHdr) != res.MsgID || m.Header.Get(consumer.HeaderReplayOf) != fmt.Sprintf("%s:%d", cfg.DLQStream, ok) ||
		m.Header.Get(consumer.HeaderDLQReason) != "" {
		t.Fatalf("republished message: %q %v", m.Data, m.Header)
	}
	if _, err := consumer.GetDeadLetter(ctx, js, cfg, ok); !errors.Is(err, consumer.ErrDeadLetterNotFound) {
		t.Fatalf("the replayed dead letter is still there: %v", err)
	}

	// A longer retention lets an old one through.
	late, err := consumer.ReplayDeadLetters(ctx, js, cfg, consumer.ReplayOptions{All: true, DryRun: true, Force: true,
		Now: now.Add(72 * time.Hour), KeyRetention: 96 * time.Hour})
	if err != nil || late.WouldReplay != 1 {
		t.Fatalf("with a longer retention: %+v %v", late, err)
	}
	// Force replays the key_reused one.
	forced, err := consumer.ReplayDeadLetters(ctx, js, cfg, consumer.ReplayOptions{All: true, Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if forced.Replayed != 1 || forced.Refused != 0 || forced.Results[0].Seq != reused {
		t.Fatalf("forced %+v", forced)
	}
	if n := streamMsgs(); n != 2 {
		t.Fatalf("stream holds %d messages, want 2", n)
	}
}

func TestConsumerState(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	for i := range 3 {
		if _, err := js.PublishMsg(ctx, consumer.CommandMsg(cfg, "m_1", fmt.Sprint(i), body("m_1", fmt.Sprint(i), 100))); err != nil {
			t.Fatal(err)
		}
	}
	st, err := consumer.ConsumerState(ctx, js, cfg)
	if err != nil || st.NumPending != 3 || st.NumAckPending != 0 || st.StreamMessages != 3 || st.Durable != "w" {
		t.Fatalf("state %+v %v", st, err)
	}
	missing := cfg
	missing.Durable = "nobody"
	if _, err := consumer.ConsumerState(ctx, js, missing); !errors.Is(err, consumer.ErrNotSetUp) {
		t.Fatalf("missing consumer: %v", err)
	}
	missing.Stream, missing.DLQStream = "NO_SUCH_STREAM_"+strings.ToUpper(testenv.Unique(t)), "NO_SUCH_DLQ_"+strings.ToUpper(testenv.Unique(t))
	if _, err := consumer.ConsumerState(ctx, js, missing); !errors.Is(err, consumer.ErrNotSetUp) {
		t.Fatalf("missing stream: %v", err)
	}
	if _, err := consumer.DeadLetterCounts(ctx, js, missing); !errors.Is(err, consumer.ErrNotSetUp) {
		t.Fatalf("missing DLQ stream: %v", err)
	}
}

func TestReplayRefusesForgedDeadLetters(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	// Signed with the key, as a worker would, yet aimed elsewhere: the
	// target check stands behind the authentication.
	forge := func(subject, stream string) uint64 {
		d := consumer.Letter{Reason: consumer.ReasonMaxDeliveries, Err: errors.New("x"), OrigSubject: subject, OrigStream: stream,
			OrigSeq: uint64(time.Now().UnixNano()), Deliveries: 5, Header: nats.Header{}, Data: body("m_1", "forged", 100), FailedAt: time.Now()}
		ack, err := js.PublishMsg(ctx, d.Msg(cfg))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	seqs := []uint64{
		forge("$JS.API.STREAM.PURGE."+cfg.Stream, cfg.Stream), // an API call, not a payment
		forge("other.subject.m_1", cfg.Stream),                // outside the payments prefix
		forge(cfg.SubjectPrefix+".m_1.extra", cfg.Stream),     // not a merchant token
		forge(cfg.SubjectPrefix+".m_1", "SOME_OTHER_STREAM"),  // another stream's letter
	}
	rep, err := consumer.ReplayDeadLetters(ctx, js, cfg, consumer.ReplayOptions{Seqs: seqs, Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Refused != len(seqs) || rep.Replayed != 0 {
		t.Fatalf("forged dead letters: %+v", rep)
	}
	for _, r := range rep.Results {
		if !strings.Contains(r.Detail, "not a payment subject") {
			t.Errorf("refusal of %s does not say why: %q", r.Subject, r.Detail)
		}
	}
}
