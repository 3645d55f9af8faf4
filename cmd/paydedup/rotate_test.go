package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/stream"
)

// Two more DLQ keys besides testenv.DLQKey: the one rotated to, and one
// nobody configures.
const (
	newDLQKey     = "paydedup-rotated-dlq-key-fedcba9876543210"
	unknownDLQKey = "paydedup-unknown-dlq-key-0000000000000000"
)

// fileLetterWith files a max_deliveries letter for key, signed with dlqKey.
func (w *cliWorld) fileLetterWith(dlqKey, key string) uint64 {
	w.t.Helper()
	h := nats.Header{}
	h.Set(stream.HeaderIdempotencyKey, key)
	d := stream.Letter{Reason: stream.ReasonMaxDeliveries, Err: errors.New("filed by the test"), OrigSubject: w.cfg.SubjectPrefix + ".m_1",
		OrigStream: w.cfg.Name, OrigSeq: uint64(time.Now().UnixNano()), Deliveries: 2, Header: h,
		Data: []byte(paymentLine(key, 100)), FailedAt: time.Now()}
	cfg := w.cfg
	cfg.DLQKey = []byte(dlqKey)
	ack, err := w.js.PublishMsg(context.Background(), d.Msg(cfg))
	if err != nil {
		w.t.Fatal(err)
	}
	return ack.Sequence
}

// After PAYDEDUP_DLQ_KEY changes, the letters signed with the key before
// it still verify and replay when that key is listed in
// PAYDEDUP_DLQ_PREVIOUS_KEYS; a letter signed with a key listed nowhere
// does not. A previous key too short is refused by name, as the current
// one is.
func TestDLQPreviousKeysVerify(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, testenv.PostgresURL(t), true)
	old := w.fileLetterWith(testenv.DLQKey, "old")
	unknown := w.fileLetterWith(unknownDLQKey, "unknown")
	w.env["PAYDEDUP_DLQ_KEY"] = newDLQKey
	w.env["PAYDEDUP_DLQ_PREVIOUS_KEYS"] = testenv.DLQKey
	current := w.fileLetterWith(newDLQKey, "current")

	out, _, err := w.run("", "dlq", "list", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var listed []dlqEntry
	if err := json.Unmarshal([]byte(out), &listed); err != nil || len(listed) != 3 {
		t.Fatalf("list --json: %v\n%s", err, out)
	}
	for _, l := range listed {
		if want := l.Seq != unknown; l.Verified != want {
			t.Errorf("letter %d (%s): verified %v, want %v (%s)", l.Seq, l.IdempotencyKey, l.Verified, want, l.Unverified)
		}
	}
	out, _, err = w.run("", "dlq", "replay", "--dry-run", "--seq", fmt.Sprint(old), "--seq", fmt.Sprint(current), "--seq", fmt.Sprint(unknown))
	if err == nil || !strings.Contains(out, "2 would be replayed, 0 skipped, 1 refused") {
		t.Fatalf("replay --dry-run: %v\n%s", err, out)
	}

	for _, bad := range []string{"too-short", testenv.DLQKey + ",short", testenv.DLQKey + ","} {
		w.env["PAYDEDUP_DLQ_PREVIOUS_KEYS"] = bad
		for _, args := range [][]string{{"worker"}, {"dlq", "replay", "--all"}} {
			if _, _, err := w.run("", args...); err == nil || !strings.Contains(err.Error(), "PAYDEDUP_DLQ_PREVIOUS_KEYS") {
				t.Errorf("%v with PAYDEDUP_DLQ_PREVIOUS_KEYS=%q: %v", args, bad, err)
			}
		}
	}
}
