package dlq_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/dlq"
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

// fileDeadLetter files a dead letter for a payment body directly.
func fileDeadLetter(t *testing.T, js jetstream.JetStream, cfg stream.Config, reason, merchant, key string, failedAt time.Time) uint64 {
	t.Helper()
	h := nats.Header{}
	h.Set(stream.HeaderIdempotencyKey, key)
	h.Set(nats.MsgIdHdr, merchant+":"+key)
	h.Set("X-Custom", "kept")
	h.Set(stream.HeaderRequeues, "1")
	h.Set(stream.HeaderRequeueOf, "41")
	d := stream.Letter{
		Reason: reason, Err: errors.New("it failed"), OrigSubject: cfg.SubjectPrefix + "." + merchant, OrigStream: cfg.Name,
		// OrigSeq is distinct: the dead letter's Nats-Msg-Id is built from it.
		OrigSeq: uint64(time.Now().UnixNano()), Deliveries: 3, Header: h, Data: body(merchant, key, 100), FailedAt: failedAt,
	}
	ack, err := js.PublishMsg(context.Background(), d.Msg(cfg))
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

func TestListDeadLettersFilters(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	now := time.Now()
	s1 := fileDeadLetter(t, js, cfg, stream.ReasonMaxDeliveries, "m_1", "a", now)
	s2 := fileDeadLetter(t, js, cfg, stream.ReasonKeyReused, "m_2", "b", now)
	s3 := fileDeadLetter(t, js, cfg, stream.ReasonMaxDeliveries, "m_1", "c", now)
	// Not a dead letter at all: listed, marked invalid.
	bad := nats.NewMsg(cfg.DLQPrefix + ".junk")
	bad.Data = []byte("{")
	if _, err := js.PublishMsg(ctx, bad); err != nil {
		t.Fatal(err)
	}

	all, err := dlq.List(ctx, js, cfg, dlq.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 4 || all[0].Seq != s1 || all[1].Seq != s2 || all[2].Seq != s3 {
		t.Fatalf("list: %+v", all)
	}
	d := all[1]
	if d.Reason != stream.ReasonKeyReused || d.MerchantID != "m_2" || d.IdempotencyKey != "b" || d.Deliveries != 3 ||
		d.Error != "it failed" || d.OrigSubject != cfg.SubjectPrefix+".m_2" || d.Invalid != "" {
		t.Fatalf("dead letter %+v", d)
	}
	if all[3].Invalid == "" || all[3].Reason != "junk" {
		t.Fatalf("a message without Dlq headers: %+v", all[3])
	}

	byReason, err := dlq.List(ctx, js, cfg, dlq.Filter{Reason: stream.ReasonMaxDeliveries})
	if err != nil || len(byReason) != 2 || byReason[1].IdempotencyKey != "c" {
		t.Fatalf("by reason: %+v %v", byReason, err)
	}
	limited, err := dlq.List(ctx, js, cfg, dlq.Filter{Limit: 1})
	if err != nil || len(limited) != 1 || limited[0].Seq != s1 {
		t.Fatalf("limit 1: %+v %v", limited, err)
	}
	future, err := dlq.List(ctx, js, cfg, dlq.Filter{Since: time.Now().Add(time.Hour)})
	if err != nil || len(future) != 0 {
		t.Fatalf("since the future: %+v %v", future, err)
	}
	none, err := dlq.List(ctx, js, cfg, dlq.Filter{Reason: "no_such_reason"})
	if err != nil || len(none) != 0 {
		t.Fatalf("unknown reason: %+v %v", none, err)
	}

	counts, err := dlq.Counts(ctx, js, cfg)
	if err != nil || counts[stream.ReasonMaxDeliveries] != 2 || counts[stream.ReasonKeyReused] != 1 || counts["junk"] != 1 {
		t.Fatalf("counts %v %v", counts, err)
	}
	if _, err := dlq.Get(ctx, js, cfg, 999); !errors.Is(err, dlq.ErrNotFound) {
		t.Fatalf("missing sequence: %v", err)
	}
}

func TestReplayDeadLetters(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	now := time.Now()
	ok := fileDeadLetter(t, js, cfg, stream.ReasonMaxDeliveries, "m_1", "ok", now)
	reused := fileDeadLetter(t, js, cfg, stream.ReasonKeyReused, "m_1", "reused", now)

	streamMsgs := func() uint64 {
		s, err := js.Stream(ctx, cfg.Name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}

	if _, err := dlq.Replay(ctx, js, cfg, dlq.ReplayOptions{}); err == nil {
		t.Fatal("neither sequences nor All: accepted")
	}
	dry, err := dlq.Replay(ctx, js, cfg, dlq.ReplayOptions{All: true, DryRun: true})
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
	old, err := dlq.Replay(ctx, js, cfg, dlq.ReplayOptions{All: true, DryRun: true, Force: true, Now: now.Add(72 * time.Hour)})
	if err != nil || old.Refused != 2 || !strings.Contains(old.Results[0].Detail, "key retention") {
		t.Fatalf("past the key retention: %+v %v", old, err)
	}

	rep, err := dlq.Replay(ctx, js, cfg, dlq.ReplayOptions{Seqs: []uint64{ok, reused, 999, ok}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Replayed != 1 || rep.Skipped != 1 || rep.Refused != 0 || rep.NotFound != 1 || len(rep.Results) != 3 {
		t.Fatalf("replay %+v", rep)
	}
	res := rep.Results[0]
	if res.Seq != ok || res.Outcome != dlq.Replayed || res.Subject != cfg.SubjectPrefix+".m_1" || res.MsgID != stream.ReplayMsgID(cfg, ok) {
		t.Fatalf("replayed %+v", res)
	}
	s, _ := js.Stream(ctx, cfg.Name)
	m, err := s.GetMsg(ctx, res.StreamSeq)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != string(body("m_1", "ok", 100)) || m.Header.Get("Idempotency-Key") != "ok" || m.Header.Get("X-Custom") != "kept" ||
		m.Header.Get(nats.MsgIdHdr) != res.MsgID || m.Header.Get(stream.HeaderReplayOf) != fmt.Sprintf("%s:%d", cfg.DLQStream, ok) ||
		m.Header.Get(stream.HeaderDLQReason) != "" || m.Header.Get(stream.HeaderRequeues) != "" || m.Header.Get(stream.HeaderRequeueOf) != "" {
		t.Fatalf("republished message: %q %v", m.Data, m.Header)
	}
	if _, err := dlq.Get(ctx, js, cfg, ok); !errors.Is(err, dlq.ErrNotFound) {
		t.Fatalf("the replayed dead letter is still there: %v", err)
	}

	// A longer retention lets an old one through.
	late, err := dlq.Replay(ctx, js, cfg, dlq.ReplayOptions{All: true, DryRun: true, Force: true,
		Now: now.Add(72 * time.Hour), KeyRetention: 96 * time.Hour})
	if err != nil || late.WouldReplay != 1 {
		t.Fatalf("with a longer retention: %+v %v", late, err)
	}
	// Force replays the key_reused one.
	forced, err := dlq.Replay(ctx, js, cfg, dlq.ReplayOptions{All: true, Force: true})
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

func TestReplayRefusesForgedDeadLetters(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	// Signed with the key, as a worker would, yet aimed elsewhere: the
	// target check stands behind the authentication.
	forge := func(subject, origStream string) uint64 {
		d := stream.Letter{Reason: stream.ReasonMaxDeliveries, Err: errors.New("x"), OrigSubject: subject, OrigStream: origStream,
			OrigSeq: uint64(time.Now().UnixNano()), Deliveries: 5, Header: nats.Header{}, Data: body("m_1", "forged", 100), FailedAt: time.Now()}
		ack, err := js.PublishMsg(ctx, d.Msg(cfg))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	seqs := []uint64{
		forge("$JS.API.STREAM.PURGE."+cfg.Name, cfg.Name),    // an API call, not a payment
		forge("other.subject.m_1", cfg.Name),                 // outside the payments prefix
		forge(cfg.SubjectPrefix+".m_1.extra", cfg.Name),      // not a merchant token
		forge(cfg.SubjectPrefix+".m_1", "SOME_OTHER_STREAM"), // another stream's letter
	}
	rep, err := dlq.Replay(ctx, js, cfg, dlq.ReplayOptions{Seqs: seqs, Force: true})
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

func TestCountsNotSetUp(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	missing := cfg
	missing.DLQStream = "NO_SUCH_DLQ_" + strings.ToUpper(testenv.Unique(t))
	if _, err := dlq.Counts(context.Background(), js, missing); !errors.Is(err, stream.ErrNotSetUp) {
		t.Fatalf("missing DLQ stream: %v", err)
	}
}
