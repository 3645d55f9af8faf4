package dlq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/stream"
)

// rotated is cfg after a DLQ key rotation: a new current key, the old one
// (testenv.DLQKey, which fileDeadLetter signs with) as the previous one.
func rotated(cfg stream.Config) stream.Config {
	cfg.DLQKey = []byte("dlq-rotated-current-key-0123456789abcdef")
	cfg.DLQPreviousKeys = [][]byte{[]byte(testenv.DLQKey)}
	return cfg
}

// Resign files each letter signed with a previous key anew under the
// current one and deletes the old: once the previous key is dropped every
// re-signed letter still verifies, keeps its body, headers and original
// failure time (so replay's age rule still holds: one that failed 72 h
// ago stays refused), and is replayable. A letter signed with a key
// configured nowhere is never re-signed; one already current is left.
func TestResignMovesLettersToTheCurrentKey(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	now := time.Now()
	a := fileDeadLetter(t, js, cfg, stream.ReasonMaxDeliveries, "m_1", "a", now)
	old := fileDeadLetter(t, js, cfg, stream.ReasonMaxDeliveries, "m_1", "old", now.Add(-72*time.Hour))
	unknown := cfg
	unknown.DLQKey = []byte("dlq-unknown-key-nobody-has-0123456789ab")
	forged := fileDeadLetter(t, js, unknown, stream.ReasonMaxDeliveries, "m_1", "forged", now)
	rot := rotated(cfg)
	current := fileDeadLetter(t, js, rot, stream.ReasonMaxDeliveries, "m_1", "current", now)
	before, err := dlq.Get(ctx, js, rot, a)
	if err != nil || !before.Verified || !before.PreviousKey {
		t.Fatalf("letter a under the rotated keys: %+v %v", before, err)
	}

	dry, err := dlq.Resign(ctx, js, rot, dlq.ResignOptions{All: true, DryRun: true})
	if err != nil || dry.WouldResign != 2 || dry.Current != 1 || dry.Refused != 1 {
		t.Fatalf("dry run: %+v %v", dry, err)
	}
	if l, _ := dlq.List(ctx, js, rot, dlq.Filter{}); len(l) != 4 || l[0].Seq != a {
		t.Fatalf("the dry run changed the stream: %+v", l)
	}
	rep, err := dlq.Resign(ctx, js, rot, dlq.ResignOptions{All: true})
	if err != nil || rep.Resigned != 2 || rep.Current != 1 || rep.Refused != 1 || rep.Failed != 0 {
		t.Fatalf("resign --all: %+v %v", rep, err)
	}
	moved := map[uint64]uint64{}
	for _, r := range rep.Results {
		if r.Outcome == dlq.Resigned {
			moved[r.Seq] = r.NewSeq
		}
	}

	// The previous key dropped.
	dropped := rot
	dropped.DLQPreviousKeys = nil
	after, err := dlq.Get(ctx, js, dropped, moved[a])
	if err != nil || !after.Verified || after.PreviousKey || after.KeyID != stream.DLQKeyID(dropped.DLQKey) {
		t.Fatalf("re-signed a: %+v %v", after, err)
	}
	if string(after.Data) != string(before.Data) || !after.FailedAt.Equal(before.FailedAt) || after.Header.Get("X-Custom") != "kept" ||
		after.Header.Get(stream.HeaderDLQOrigMsgID) != before.Header.Get(stream.HeaderDLQOrigMsgID) || after.OrigSeq != before.OrigSeq {
		t.Fatalf("re-signing changed the letter:\nbefore %+v\nafter  %+v", before, after)
	}
	for _, seq := range []uint64{a, old} {
		if _, err := dlq.Get(ctx, js, dropped, seq); !errors.Is(err, dlq.ErrNotFound) {
			t.Errorf("old letter %d kept after re-signing: %v", seq, err)
		}
	}
	if d, err := dlq.Get(ctx, js, dropped, forged); err != nil || d.Verified {
		t.Errorf("a letter under an unknown key: %+v %v", d, err)
	}
	if d, err := dlq.Get(ctx, js, dropped, current); err != nil || !d.Verified {
		t.Errorf("the current key's letter: %+v %v", d, err)
	}
	rp, err := dlq.Replay(ctx, js, dropped, dlq.ReplayOptions{Seqs: []uint64{moved[a], moved[old], forged}, DryRun: true})
	if err != nil || rp.WouldReplay != 1 || rp.Refused != 2 {
		t.Fatalf("replay after the previous key was dropped: %+v %v", rp, err)
	}
	for _, r := range rp.Results {
		if want := map[uint64]dlq.ReplayOutcome{moved[a]: dlq.WouldReplay, moved[old]: dlq.Refused, forged: dlq.Refused}[r.Seq]; r.Outcome != want {
			t.Errorf("replay of %d: %s (%s), want %s", r.Seq, r.Outcome, r.Detail, want)
		}
	}

	// Without a current key, or with a bad previous one, nothing runs.
	badPrev, noKey := rot, rot
	badPrev.DLQPreviousKeys = [][]byte{[]byte("short")}
	noKey.DLQKey = nil
	for _, bad := range []stream.Config{badPrev, noKey} {
		if _, err := dlq.Resign(ctx, js, bad, dlq.ResignOptions{All: true}); !errors.Is(err, stream.ErrDLQKey) {
			t.Errorf("resign with keys %q / %q: %v", bad.DLQKey, bad.DLQPreviousKeys, err)
		}
	}
}

// Two runs that both read a letter before either deleted it file one
// copy: the second's copy is a duplicate of the first's (its Nats-Msg-Id
// is stream.ResignMsgID), and the letter already deleted counts as
// re-signed.
func TestConcurrentResignsFileOnce(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	seq := fileDeadLetter(t, js, cfg, stream.ReasonMaxDeliveries, "m_1", "twice", time.Now())
	rot := rotated(cfg)
	d, err := dlq.Get(ctx, js, rot, seq)
	if err != nil {
		t.Fatal(err)
	}
	var first uint64
	for i := range 2 {
		res, err := dlq.ResignOneForTest(ctx, js, rot, d)
		if err != nil || res.Outcome != dlq.Resigned {
			t.Fatalf("run %d: %+v %v", i+1, res, err)
		}
		if i == 0 {
			first = res.NewSeq
		} else if res.NewSeq != first {
			t.Fatalf("second run filed #%d, the first #%d", res.NewSeq, first)
		}
	}
	l, err := dlq.List(ctx, js, rot, dlq.Filter{})
	if err != nil || len(l) != 1 || l[0].Seq != first || l[0].PreviousKey {
		t.Fatalf("letters after two runs: %+v %v", l, err)
	}
}
