package main

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/stream"
)

// fileLetter files a dead letter with reason for key, as a worker would.
func (w *cliWorld) fileLetter(reason, key string) uint64 {
	w.t.Helper()
	cfg := w.cfg.WithDefaults()
	d := stream.Letter{
		Reason: reason, Err: errors.New("it failed"), OrigSubject: cfg.SubjectPrefix + ".m_1", OrigStream: cfg.Name,
		OrigSeq: uint64(time.Now().UnixNano()), Deliveries: 1, Header: nats.Header{}, FailedAt: time.Now(),
		Data: []byte(paymentLine(key, 100)),
	}
	ack, err := w.js.PublishMsg(context.Background(), d.Msg(cfg))
	if err != nil {
		w.t.Fatal(err)
	}
	return ack.Sequence
}

// runAt runs the command tree as at a terminal (tty true) or not.
func (w *cliWorld) runAt(tty bool, stdin string, args ...string) (stdout, stderr string, err error) {
	w.t.Helper()
	return w.runTree(func(io.Writer) bool { return tty }, stdin, args...)
}

func (w *cliWorld) exists(seq uint64) bool {
	w.t.Helper()
	_, err := dlq.Get(context.Background(), w.js, w.cfg, seq)
	if err != nil && !errors.Is(err, dlq.ErrNotFound) {
		w.t.Fatal(err)
	}
	return err == nil
}

func TestDLQDeleteAsksFirst(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, "", true)
	seq := w.fileLetter("malformed_json", "k-1")
	lost := w.fileLetter("max_deliveries", "k-2")

	// No answer (a script's closed stdin): nothing deleted, and it says --yes.
	if _, _, err := w.run("", "dlq", "delete", itoa(seq)); err == nil || !strings.Contains(err.Error(), "--yes") {
		t.Fatalf("no answer: %v, want a refusal naming --yes", err)
	}
	if _, _, err := w.run("n\n", "dlq", "delete", itoa(seq)); err == nil || !w.exists(seq) {
		t.Fatalf("answered n: %v, and the letter exists: %v", err, w.exists(seq))
	}
	out, _, err := w.run("y\n", "dlq", "delete", itoa(seq))
	if err != nil || w.exists(seq) || !strings.Contains(out, "1 deleted") {
		t.Fatalf("answered y: %v, exists %v\n%s", err, w.exists(seq), out)
	}
	// A max_deliveries letter is an uncharged payment: it says so.
	out, _, err = w.run("", "dlq", "delete", itoa(lost), "--yes")
	if err != nil || w.exists(lost) || !strings.Contains(out, "were not charged") {
		t.Fatalf("--yes on max_deliveries: %v, exists %v\n%s", err, w.exists(lost), out)
	}
	if _, _, err := w.run("", "dlq", "delete", itoa(lost), "--yes"); !errors.Is(err, dlq.ErrNotFound) {
		t.Fatalf("deleting a deleted letter: %v, want not found", err)
	}
}

func TestDLQPurge(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, "", true)
	bad := []uint64{w.fileLetter("malformed_json", "k-1"), w.fileLetter("malformed_json", "k-2")}
	other := w.fileLetter("key_reused", "k-3")
	for _, args := range [][]string{{"dlq", "purge", "--older-than", "1h"}, {"dlq", "purge", "--reason", "malformed_json"}} {
		if _, _, err := w.run("y\n", args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
	// Stored a moment ago: none is older than 1h, all older than 1ns.
	out, _, err := w.run("", "dlq", "purge", "--reason", "malformed_json", "--older-than", "1h", "--yes")
	if err != nil || !strings.Contains(out, "nothing deleted") || !w.exists(bad[0]) {
		t.Fatalf("older than 1h: %v\n%s", err, out)
	}
	out, _, err = w.run("y\n", "dlq", "purge", "--reason", "malformed_json", "--older-than", "1ns")
	if err != nil || !strings.Contains(out, "2 deleted") {
		t.Fatalf("purge: %v\n%s", err, out)
	}
	if w.exists(bad[0]) || w.exists(bad[1]) || !w.exists(other) {
		t.Fatalf("after the purge: %v %v deleted, key_reused %v kept", !w.exists(bad[0]), !w.exists(bad[1]), w.exists(other))
	}
}

// At a terminal, dlq replay --all shows a progress bar and the lines it
// prints, and no log line per letter; elsewhere, no bar, and a structured
// log line per replayed letter for the record.
func TestDLQReplayAtATerminal(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, "", true)
	w.env["PAYDEDUP_LOG_LEVEL"] = "info"
	w.fileLetter("max_deliveries", "k-1")
	out, errOut, err := w.runAt(true, "", "dlq", "replay", "--all")
	if err != nil || !strings.Contains(out, "1 replayed") {
		t.Fatalf("replay: %v\n%s\n%s", err, out, errOut)
	}
	if strings.Contains(errOut, "dead letter replayed") || strings.Contains(errOut, "{") {
		t.Errorf("a log line per letter at a terminal:\n%s", errOut)
	}
	if !strings.Contains(errOut, "dlq replay") || !strings.Contains(errOut, "letters") {
		t.Errorf("no progress bar at a terminal:\n%q", errOut)
	}

	w.fileLetter("max_deliveries", "k-2")
	out, errOut, err = w.runAt(false, "", "dlq", "replay", "--all")
	if err != nil || !strings.Contains(out, "1 replayed") {
		t.Fatalf("replay: %v\n%s\n%s", err, out, errOut)
	}
	if !strings.Contains(errOut, `"msg":"dead letter replayed"`) || strings.Contains(errOut, "letters") {
		t.Errorf("not at a terminal: want a JSON log line per letter and no bar:\n%s", errOut)
	}
}

// Logs are text at a terminal and JSON elsewhere, unless --log-format says.
func TestLogFormatFollowsTheTerminal(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, "", true)
	w.env["PAYDEDUP_LOG_LEVEL"] = "info"
	for _, c := range []struct {
		tty  bool
		args []string
		want string
	}{
		{true, nil, "level=INFO"},
		{false, nil, `"level":"INFO"`},
		{true, []string{"--log-format", "json"}, `"level":"INFO"`},
		{false, []string{"--log-format", "text"}, "level=INFO"},
	} {
		w.fileLetter("max_deliveries", "k-"+itoa(uint64(time.Now().UnixNano())))
		// stdout is not a terminal, so the per-letter line is logged.
		var errOut testenv.Buffer
		r, app := newRoot(io.Discard, &errOut, func(k string) string { return w.env[k] })
		app.tty = func(wr io.Writer) bool { return c.tty && wr == io.Writer(&errOut) }
		r.SetArgs(append([]string{"dlq", "replay", "--all"}, c.args...))
		if err := r.ExecuteContext(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(errOut.String(), c.want) {
			t.Errorf("tty %v %v: want %q in\n%s", c.tty, c.args, c.want, errOut.String())
		}
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
