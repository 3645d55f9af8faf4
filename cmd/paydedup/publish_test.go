package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/internal/testenv"
	"github.com/paydedup/paydedup/stream"
)

// cliWorld is one test's services for the operator commands: its own
// streams on the shared NATS server and, when asked, its own schema.
type cliWorld struct {
	t   *testing.T
	cfg stream.Config
	env map[string]string
	nc  *nats.Conn
	js  jetstream.JetStream
}

// newCLIWorld names the test's streams (created by EnsureStreams when
// ensure is set) and builds the environment the commands read.
func newCLIWorld(t *testing.T, dbURL string, ensure bool) *cliWorld {
	t.Helper()
	u := testenv.Unique(t)
	name := strings.ToUpper(u)
	cfg := stream.Config{
		Name: name, SubjectPrefix: u + ".req", DLQStream: name + "_DLQ", DLQPrefix: u + ".dlq", Durable: "w",
		StreamMaxAge: time.Hour, DLQMaxAge: time.Hour, DLQKey: []byte(testenv.DLQKey),
	}
	w := &cliWorld{t: t, cfg: cfg, nc: testenv.NATSConn(t), env: map[string]string{
		"NATS_URL":                testenv.NATSURL(t),
		"DATABASE_URL":            dbURL,
		"PAYDEDUP_STREAM":         cfg.Name,
		"PAYDEDUP_SUBJECT_PREFIX": cfg.SubjectPrefix,
		"PAYDEDUP_DLQ_STREAM":     cfg.DLQStream,
		"PAYDEDUP_DLQ_PREFIX":     cfg.DLQPrefix,
		"PAYDEDUP_DURABLE":        cfg.Durable,
		"PAYDEDUP_LOG_LEVEL":      "warn",
		"PAYDEDUP_DLQ_KEY":        testenv.DLQKey,
	}}
	js, err := jetstream.New(w.nc)
	if err != nil {
		t.Fatal(err)
	}
	w.js = js
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, cfg.Name)
		_ = js.DeleteStream(ctx, cfg.DLQStream)
		_ = js.DeleteStream(ctx, cfg.WithDefaults().AdvisoryStream)
	})
	if ensure {
		if _, _, err := stream.EnsureStreams(context.Background(), js, cfg); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

// run runs the real command tree with the world's environment.
func (w *cliWorld) run(stdin string, args ...string) (stdout, stderr string, err error) {
	w.t.Helper()
	return w.runTree(nil, stdin, args...)
}

// runTree runs the command tree; tty, when set, says which streams are
// terminals.
func (w *cliWorld) runTree(tty func(io.Writer) bool, stdin string, args ...string) (stdout, stderr string, err error) {
	w.t.Helper()
	var out, errOut testenv.Buffer
	root, a := newRoot(&out, &errOut, func(k string) string { return w.env[k] })
	a.tty = tty
	root.SetArgs(args)
	root.SetIn(strings.NewReader(stdin))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err = root.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

// streamMsgs returns every message of the payments stream.
func (w *cliWorld) streamMsgs() []*jetstream.RawStreamMsg {
	w.t.Helper()
	ctx := context.Background()
	s, err := w.js.Stream(ctx, w.cfg.Name)
	if err != nil {
		w.t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		if m, err := s.GetMsg(ctx, seq); err == nil {
			out = append(out, m)
		}
	}
	return out
}

func TestPublishFileWithMalformedLine(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, "", true)
	lines := []string{
		`{"merchant_id":"m_1","idempotency_key":"k-1","amount":1999,"currency":"usd","payment_method":"pm_card_visa"}`,
		`{"merchant_id":"m_1","idempotency_key":"k-2","amount":`, // line 2: malformed
		``,
		`# a comment`,
		`{"merchant_id":"m_2","idempotency_key":"k-3","amount":500,"currency":"eur","payment_method":"pm_card_visa","metadata":{"order_id":"7"}}`,
		`{"merchant_id":"m_1","idempotency_key":"k-4","amount":0,"currency":"usd","payment_method":"pm_card_visa"}`,    // line 6: bad amount
		`{"merchant_id":"m_1","idempotency_key":"k-1","amount":1999,"currency":"usd","payment_method":"pm_card_visa"}`, // a double publish
	}
	file := filepath.Join(t.TempDir(), "payments.jsonl")
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := w.run("", "publish", "--file", file)
	if err == nil {
		t.Fatal("publish with malformed lines exited zero")
	}
	for _, want := range []string{"line 2 skipped", "malformed_json", "line 6 skipped", "invalid_amount"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr does not say %q:\n%s", want, errOut)
		}
	}
	if !strings.Contains(out, "publish: 2 published, 1 duplicates dropped by the stream's window, 0 failed, 2 malformed lines skipped") {
		t.Errorf("summary:\n%s", out)
	}
	msgs := w.streamMsgs()
	if len(msgs) != 2 {
		t.Fatalf("%d messages in the stream, want the 2 good ones", len(msgs))
	}
	m := msgs[1]
	if m.Subject != w.cfg.SubjectPrefix+".m_2" || m.Header.Get("Idempotency-Key") != "k-3" || m.Header.Get(nats.MsgIdHdr) != "m_2:k-3" || string(m.Data) != lines[4] {
		t.Fatalf("message %s %v %q", m.Subject, m.Header, m.Data)
	}

	// The same lines on stdin, now all good: exit zero.
	good := lines[0] + "\n" + lines[4] + "\n"
	out, _, err = w.run(good, "publish")
	if err != nil || !strings.Contains(out, "0 published, 2 duplicates dropped") {
		t.Fatalf("stdin publish: %v\n%s", err, out)
	}
}

func TestPublishGenerated(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, "", true)
	out, _, err := w.run("", "publish", "--generate", "40", "--duplicates", "0.5", "--declines", "0.25", "--merchant", "m_9", "--seed", "3", "--window", "8")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "publish: 40 published, 20 duplicates dropped by the stream's window, 0 failed") {
		t.Fatalf("summary:\n%s", out)
	}
	msgs := w.streamMsgs()
	declined := 0
	for _, m := range msgs {
		var c struct {
			MerchantID     string `json:"merchant_id"`
			IdempotencyKey string `json:"idempotency_key"`
			PaymentMethod  string `json:"payment_method"`
		}
		if err := json.Unmarshal(m.Data, &c); err != nil {
			t.Fatal(err)
		}
		if c.MerchantID != "m_9" || m.Header.Get(nats.MsgIdHdr) != "m_9:"+c.IdempotencyKey || m.Subject != w.cfg.SubjectPrefix+".m_9" {
			t.Fatalf("generated message %s %v %s", m.Subject, m.Header, m.Data)
		}
		if c.PaymentMethod == "pm_card_chargeDeclined" {
			declined++
		}
	}
	if len(msgs) != 40 || declined == 0 || declined == 40 {
		t.Fatalf("%d messages, %d declined", len(msgs), declined)
	}
}

func TestPublishBadFlags(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, "", false)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"publish", "--generate", "5", "--duplicates", "1.5"}, "--duplicates must be a fraction"},
		{[]string{"publish", "--generate", "5", "--file", "x"}, "--generate and --file exclude each other"},
		{[]string{"publish", "--duplicates", "0.5"}, "only apply with --generate"},
		{[]string{"publish", "--generate", "5", "--merchant", "bad merchant"}, "--merchant"},
		{[]string{"publish", "--file", filepath.Join(t.TempDir(), "missing")}, "--file"},
	} {
		_, _, err := w.run("", c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want it to say %q", c.args, err, c.want)
		}
	}
}
