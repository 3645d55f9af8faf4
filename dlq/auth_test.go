package dlq_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/stream"
)

// A letter published straight to the DLQ's subjects, well formed and aimed
// at a real merchant's subject, is never replayed: it carries no Dlq-Auth
// made with the key the workers hold. Neither is a genuine letter whose
// body was altered and published again.
func TestReplayRefusesUnauthenticatedLetters(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	forged := nats.NewMsg(cfg.DLQPrefix + "." + stream.ReasonMaxDeliveries)
	forged.Data = body("m_victim", "forged", 99_999_999)
	for k, v := range map[string]string{
		stream.HeaderIdempotencyKey: "forged",
		stream.HeaderDLQReason:      stream.ReasonMaxDeliveries, stream.HeaderDLQError: "x",
		stream.HeaderDLQOrigSubject: cfg.SubjectPrefix + ".m_victim", stream.HeaderDLQOrigStream: cfg.Name,
		stream.HeaderDLQOrigSeq: "1", stream.HeaderDLQDeliveries: "5",
		stream.HeaderDLQFailedAt: time.Now().UTC().Format(time.RFC3339Nano),
		stream.HeaderDLQAuth:     "v1=0000000000000000000000000000000000000000000000000000000000000000",
	} {
		forged.Header.Set(k, v)
	}
	ack, err := js.PublishMsg(ctx, forged)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := dlq.Replay(ctx, js, cfg, dlq.ReplayOptions{Seqs: []uint64{ack.Sequence}, Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Replayed != 0 || rep.Refused != 1 {
		t.Fatalf("forged letter: %+v", rep)
	}
	st, err := stream.ConsumerState(ctx, js, cfg)
	if err != nil || st.StreamMessages != 0 {
		t.Fatalf("the payments stream holds %d messages after replaying a forged letter (%v)", st.StreamMessages, err)
	}
	all, err := dlq.List(ctx, js, cfg, dlq.Filter{})
	if err != nil || len(all) != 1 {
		t.Fatalf("list %v %v", all, err)
	}
	if all[0].Verified || all[0].Unverified == "" {
		t.Fatalf("forged letter listed as verified: %+v", all[0])
	}
}

// A genuine letter whose body or headers are altered no longer verifies,
// and a letter's age is judged by the time the stream stored it: a
// Dlq-Failed-At set in the future does not make an old letter replayable.
func TestDeadLetterAuthAndStoredAge(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	now := time.Now()
	// Dlq-Failed-At claims the letter is 72 h younger than it is.
	fresh := fileDeadLetter(t, js, cfg, stream.ReasonMaxDeliveries, "m_1", "fresh", now.Add(72*time.Hour))
	d, err := dlq.Get(ctx, js, cfg, fresh)
	if err != nil || !d.Verified {
		t.Fatalf("a worker's letter does not verify: %+v %v", d, err)
	}
	later := dlq.ReplayOptions{Seqs: []uint64{fresh}, DryRun: true, Now: now.Add(72 * time.Hour)}
	rep, err := dlq.Replay(ctx, js, cfg, later)
	if err != nil || rep.Refused != 1 {
		t.Fatalf("72 h after it was stored, with a forged Dlq-Failed-At: %+v %v", rep, err)
	}

	alter := func(edit func(m *nats.Msg)) uint64 {
		m := nats.NewMsg(d.Subject)
		m.Data = append([]byte(nil), d.Data...)
		for k, vs := range d.Header {
			if k != nats.MsgIdHdr {
				m.Header[k] = append([]string(nil), vs...)
			}
		}
		edit(m)
		ack, err := js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	same := alter(func(*nats.Msg) {})
	seqs := []uint64{
		alter(func(m *nats.Msg) { m.Data = body("m_1", "fresh", 99_999_999) }),
		alter(func(m *nats.Msg) { m.Header.Set(stream.HeaderDLQOrigSubject, cfg.SubjectPrefix+".m_2") }),
		alter(func(m *nats.Msg) { m.Header.Set("X-Custom", "changed") }),
		alter(func(m *nats.Msg) { m.Header.Add(stream.HeaderIdempotencyKey, "second") }),
		alter(func(m *nats.Msg) { m.Header.Del("X-Custom") }),
	}
	rep, err = dlq.Replay(ctx, js, cfg, dlq.ReplayOptions{Seqs: append(seqs, same), DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		want := dlq.Refused
		if r.Seq == same {
			want = dlq.WouldReplay // a byte-for-byte copy still verifies
		}
		if r.Outcome != want {
			t.Errorf("letter %d: %s (%s), want %s", r.Seq, r.Outcome, r.Detail, want)
		}
	}

	// Without the key: listed as unverified; replay refuses to start.
	nokey := cfg
	nokey.DLQKey = nil
	l, err := dlq.List(ctx, js, nokey, dlq.Filter{Limit: 1})
	if err != nil || len(l) != 1 || l[0].Verified || l[0].Unverified == "" {
		t.Fatalf("listed without a key: %+v %v", l, err)
	}
	for _, key := range [][]byte{nil, []byte("short")} {
		nokey.DLQKey = key
		if _, err := dlq.Replay(ctx, js, nokey, dlq.ReplayOptions{All: true}); !errors.Is(err, stream.ErrDLQKey) {
			t.Fatalf("replay with key %q: %v", key, err)
		}
	}
	other := cfg
	other.DLQKey = []byte("another-key-of-at-least-thirty-two-bytes")
	if d, err := dlq.Get(ctx, js, other, fresh); err != nil || d.Verified {
		t.Fatalf("verified with another key: %+v %v", d, err)
	}
}

// Two replays of one dead letter that both read it before either deleted
// it publish one message: the replay's Nats-Msg-Id is
// ~replay:<seq>:<dlq stream> (stream.ReplayMsgID), so the second is a
// duplicate, and the letter already deleted by the first counts as
// replayed, not as a failure.
func TestConcurrentReplaysPublishOnce(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	seq := fileDeadLetter(t, js, cfg, stream.ReasonMaxDeliveries, "m_1", "twice", time.Now())
	d, err := dlq.Get(ctx, js, cfg, seq)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		res, err := dlq.ReplayOneForTest(ctx, js, cfg, d)
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome != dlq.Replayed || res.MsgID != stream.ReplayMsgID(cfg, seq) {
			t.Fatalf("replay %d: %+v", i+1, res)
		}
	}
	st, err := stream.ConsumerState(ctx, js, cfg)
	if err != nil || st.StreamMessages != 1 {
		t.Fatalf("two replays of one letter left %d messages in the payments stream, want 1 (%v)", st.StreamMessages, err)
	}
}

// replay --all leaves provider_idempotency_mismatch and ledger_conflict,
// which need a person to look first, unless their reason is named.
func TestReplayAllSkipsReasonsToInvestigate(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	now := time.Now()
	fileDeadLetter(t, js, cfg, stream.ReasonMaxDeliveries, "m_1", "a", now)
	fileDeadLetter(t, js, cfg, stream.ReasonProviderMismatch, "m_1", "b", now)
	fileDeadLetter(t, js, cfg, stream.ReasonLedgerConflict, "m_1", "c", now)
	all, err := dlq.Replay(ctx, js, cfg, dlq.ReplayOptions{All: true, DryRun: true, Force: true})
	if err != nil || all.WouldReplay != 1 || all.Skipped != 2 {
		t.Fatalf("--all: %+v %v", all, err)
	}
	for _, r := range all.Results {
		if r.Outcome == dlq.Skipped && !strings.Contains(r.Detail, "--reason "+r.Reason) {
			t.Errorf("skip of %s does not say how to replay it: %q", r.Reason, r.Detail)
		}
	}
	named, err := dlq.Replay(ctx, js, cfg, dlq.ReplayOptions{All: true, DryRun: true, Reason: stream.ReasonLedgerConflict})
	if err != nil || named.WouldReplay != 1 || named.Skipped != 0 {
		t.Fatalf("--all --reason ledger_conflict: %+v %v", named, err)
	}
}

// Rate bounds the republishes per second.
func TestReplayIsRateLimited(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c", "d"} {
		fileDeadLetter(t, js, cfg, stream.ReasonMaxDeliveries, "m_1", k, time.Now())
	}
	start := time.Now()
	rep, err := dlq.Replay(ctx, js, cfg, dlq.ReplayOptions{All: true, Rate: 10})
	if err != nil || rep.Replayed != 4 {
		t.Fatalf("replay %+v %v", rep, err)
	}
	// Four republishes at 10/s: three intervals of 100 ms at least.
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("four letters replayed in %v at 10/s", d)
	}
	if _, err := dlq.Replay(ctx, js, cfg, dlq.ReplayOptions{All: true, Rate: -1}); err == nil {
		t.Fatal("a negative rate was accepted")
	}
}

// Replay judges a letter's age by the failure time its Dlq-Auth covers,
// not only by when the stream stored it: a verified letter copied back
// onto the DLQ's subjects (by anyone who may publish there) gets a new
// stored time, but keeps its authenticated Dlq-Failed-At, so an old
// letter stays too old to replay.
func TestReplayAgeFromAuthenticatedFailureTime(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	now := time.Now()
	orig := fileDeadLetter(t, js, cfg, stream.ReasonMaxDeliveries, "m_1", "old", now.Add(-72*time.Hour))
	d, err := dlq.Get(ctx, js, cfg, orig)
	if err != nil || !d.Verified {
		t.Fatalf("original: %+v %v", d, err)
	}
	// Re-filed byte for byte (a new Nats-Msg-Id, or the stream drops it).
	m := nats.NewMsg(d.Subject)
	m.Data = d.Data
	for k, vs := range d.Header {
		m.Header[k] = append([]string(nil), vs...)
	}
	m.Header.Set(nats.MsgIdHdr, "refiled")
	ack, err := js.PublishMsg(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := dlq.Get(ctx, js, cfg, ack.Sequence); err != nil || !c.Verified || now.Sub(c.Stored) > time.Minute {
		t.Fatalf("the copy: %+v %v", c, err)
	}
	rep, err := dlq.Replay(ctx, js, cfg, dlq.ReplayOptions{Seqs: []uint64{orig, ack.Sequence}, DryRun: true, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.Outcome != dlq.Refused || !strings.Contains(r.Detail, "key retention") {
			t.Errorf("letter %d that failed 72 h ago: %s (%s), want refused for the key retention", r.Seq, r.Outcome, r.Detail)
		}
	}
	// A young letter is still replayable.
	young := fileDeadLetter(t, js, cfg, stream.ReasonMaxDeliveries, "m_1", "young", now.Add(-time.Hour))
	rep, err = dlq.Replay(ctx, js, cfg, dlq.ReplayOptions{Seqs: []uint64{young}, DryRun: true, Now: now})
	if err != nil || rep.WouldReplay != 1 {
		t.Fatalf("a letter that failed an hour ago: %+v %v", rep, err)
	}
}

// TestReplayByReasonReadsTheSignedReason: a letter's reason is the signed
// one, not its subject's (Dlq-Auth does not cover the subject). A signed
// provider_mismatch letter moved onto max_deliveries' subject is not
// replayed by --reason max_deliveries.
func TestReplayByReasonReadsTheSignedReason(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	seq := fileDeadLetter(t, js, cfg, stream.ReasonProviderMismatch, "m_1", "moved", time.Now())
	s, err := js.Stream(ctx, cfg.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.GetMsg(ctx, seq)
	if err != nil {
		t.Fatal(err)
	}
	moved := nats.NewMsg(cfg.DLQPrefix + "." + stream.ReasonMaxDeliveries)
	for k, v := range raw.Header {
		if k != nats.MsgIdHdr {
			moved.Header[k] = v
		}
	}
	moved.Data = raw.Data
	if _, err := js.PublishMsg(ctx, moved); err != nil {
		t.Fatal(err)
	}
	rep, err := dlq.Replay(ctx, js, cfg, dlq.ReplayOptions{All: true, DryRun: true, Reason: stream.ReasonMaxDeliveries})
	if err != nil || rep.WouldReplay != 0 {
		t.Fatalf("--all --reason max_deliveries over a moved provider_mismatch letter: %+v %v", rep, err)
	}
}
