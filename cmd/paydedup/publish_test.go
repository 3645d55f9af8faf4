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

	"github.com/paydedup/paydedup/lab/testenv"
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
		OutcomeStream: name + "_OUTCOMES", OutcomePrefix: u + ".outcomes",
		StreamMaxBytes: 256 << 20, DLQMaxAge: time.Hour, DLQKey: []byte(testenv.DLQKey),
	}
	w := &cliWorld{t: t, cfg: cfg, nc: testenv.NATSConn(t), env: map[string]string{
		"NATS_URL":                testenv.NATSURL(t),
		"DATABASE_URL":            dbURL,
		"PAYDEDUP_STREAM":         cfg.Name,
		"PAYDEDUP_SUBJECT_PREFIX": cfg.SubjectPrefix,
		"PAYDEDUP_DLQ_STREAM":     cfg.DLQStream,
		"PAYDEDUP_DLQ_PREFIX":     cfg.DLQPrefix,
		"PAYDEDUP_DURABLE":        cfg.Durable,
		"PAYDEDUP_OUTCOME_STREAM": cfg.OutcomeStream,
		"PAYDEDUP_OUTCOME_PREFIX": cfg.OutcomePrefix,
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
		_ = js.DeleteStream(ctx, cfg.OutcomeStream)
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
	if !strings.Contains(out, "publish: 2 published, 1 duplicates dropped by the stream's window, 0 reused keys, 0 refused, 0 unknown, 2 malformed lines skipped") {
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
	if !strings.Contains(out, "publish: 40 published, 20 duplicates dropped by the stream's window, 0 reused keys, 0 refused, 0 unknown") {
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

// A key published again with another payment inside the duplicate window
// is a reused key, not a duplicate: the stream dropped this payment and
// holds the other, so publish names merchant, key and the sequence holding
// the other payload and exits non-zero. The same payment again, byte for
// byte or written otherwise, is a harmless duplicate and exits zero.
func TestPublishReusedKeyExitsNonZero(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, "", true)
	first := `{"merchant_id":"m_1","idempotency_key":"k-1","amount":1999,"currency":"usd","payment_method":"pm_card_visa"}`
	if out, errOut, err := w.run(first+"\n", "publish"); err != nil || !strings.Contains(out, "1 published") {
		t.Fatalf("first publish: %v\n%s%s", err, out, errOut)
	}

	rewritten := `{"payment_method":"pm_card_visa", "currency":"usd", "amount":1999, "idempotency_key":"k-1", "merchant_id":"m_1"}`
	out, errOut, err := w.run(first+"\n"+rewritten+"\n", "publish")
	if err != nil || !strings.Contains(out, "0 published, 2 duplicates dropped by the stream's window, 0 reused keys") || strings.Contains(errOut, "reused") {
		t.Fatalf("the same payment again: %v\n%s%s", err, out, errOut)
	}

	other := strings.Replace(first, `"amount":1999`, `"amount":2500`, 1)
	out, errOut, err = w.run(other+"\n", "publish")
	if err == nil {
		t.Fatalf("another payment under key k-1 exited zero:\n%s%s", out, errOut)
	}
	if !strings.Contains(err.Error(), "reused") || !strings.Contains(err.Error(), "new idempotency key") {
		t.Errorf("error %q does not say the key was reused and what to do", err)
	}
	if !strings.Contains(out, "0 published, 0 duplicates dropped by the stream's window, 1 reused keys") {
		t.Errorf("summary:\n%s", out)
	}
	for _, want := range []string{"reused key", "merchant m_1", `key "k-1"`, w.cfg.Name + " #1", "not published"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr does not say %q:\n%s", want, errOut)
		}
	}

	// Within one run: a new key, then another payment under it.
	k2 := strings.Replace(first, `"k-1"`, `"k-2"`, 1)
	out, errOut, err = w.run(k2+"\n"+strings.Replace(k2, `"usd"`, `"eur"`, 1)+"\n", "publish")
	if err == nil || !strings.Contains(out, "1 published, 0 duplicates dropped by the stream's window, 1 reused keys") ||
		!strings.Contains(errOut, `key "k-2"`) || !strings.Contains(errOut, w.cfg.Name+" #2") {
		t.Fatalf("a key reused within one run: %v\n%s%s", err, out, errOut)
	}

	msgs := w.streamMsgs()
	if len(msgs) != 2 || string(msgs[0].Data) != first || string(msgs[1].Data) != k2 {
		t.Fatalf("the stream holds %d messages, want the first payment of each key", len(msgs))
	}

	// The message holding k-1's id is gone while the id is still in the
	// window: a duplicate that cannot be checked is unknown, not done.
	s, err := w.js.Stream(context.Background(), w.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteMsg(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	out, errOut, err = w.run(first+"\n", "publish")
	if err == nil || !strings.Contains(out, "0 duplicates dropped by the stream's window, 0 reused keys, 0 refused, 1 unknown") ||
		!strings.Contains(errOut, "could not be read") || !strings.Contains(err.Error(), "may have been stored") {
		t.Fatalf("a duplicate of a message that cannot be read: %v\n%s%s", err, out, errOut)
	}
}

// A message whose PubAck never came is unknown, never "failed": it may have
// been stored, and publish says to publish it again with the same
// Nats-Msg-Id, and exits non-zero. One the stream refused is not stored.
func TestPublishWithoutPubAckIsUnknown(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, "", false)
	if _, _, err := stream.EnsureStreams(context.Background(), w.js, w.cfg); err != nil {
		t.Fatal(err)
	}
	line := `{"merchant_id":"m_1","idempotency_key":"k-1","amount":1999,"currency":"usd","payment_method":"pm_card_visa"}`
	// The stream exists and no leader answers for the subject (as in a
	// leader election): no PubAck.
	out, errOut, err := w.run(line+"\n", "publish", "--retry", "300ms", "--ack-timeout", "1s", "--subject-prefix", w.cfg.SubjectPrefix+"-elsewhere")
	if err == nil {
		t.Fatalf("publish without a PubAck exited zero:\n%s%s", out, errOut)
	}
	all := out + errOut + err.Error()
	if strings.Contains(all, "failed") || strings.Contains(all, "not published") {
		t.Errorf("a message without a PubAck is reported as failed or not published:\n%s", all)
	}
	if !strings.Contains(out, "0 published, 0 duplicates dropped by the stream's window, 0 reused keys, 0 refused, 1 unknown") {
		t.Errorf("summary:\n%s", out)
	}
	for _, want := range []string{"unknown", "merchant m_1", `key "k-1"`, "may have been stored", "same Nats-Msg-Id"} {
		if !strings.Contains(errOut, want) || !strings.Contains(err.Error(), "may have been stored") {
			t.Errorf("stderr or the error does not say %q:\n%s\n%v", want, errOut, err)
		}
	}

	// The stream refuses a message over its size limit: not stored.
	s, err := w.js.Stream(context.Background(), w.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	sc := s.CachedInfo().Config
	sc.MaxMsgSize = 64
	if _, err := w.js.UpdateStream(context.Background(), sc); err != nil {
		t.Fatal(err)
	}
	out, errOut, err = w.run(line+"\n", "publish", "--retry", "300ms")
	if err == nil || !strings.Contains(out, "0 reused keys, 1 refused, 0 unknown") || !strings.Contains(errOut, "refused") ||
		!strings.Contains(errOut, "not stored") {
		t.Fatalf("a message the stream refused: %v\n%s%s", err, out, errOut)
	}
}

// With no payments stream (no worker has started yet), publish stops at
// once, naming the stream and saying to start a worker, instead of
// resending every message for --retry.
func TestPublishMissingStreamFailsFast(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, "", false)
	start := time.Now()
	_, _, err := w.run("", "publish", "--generate", "3")
	if err == nil || !strings.Contains(err.Error(), "start a worker") || !strings.Contains(err.Error(), w.cfg.Name) {
		t.Fatalf("publish without a stream: %v, want it to name %s and say to start a worker", err, w.cfg.Name)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("publish without a stream took %v, want an answer at once", took)
	}
}

// TestPublishKinds: a line may name its kind: an authorize is published
// as written; a kind the worker does not handle is skipped with its
// reason, never published.
func TestPublishKinds(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, "", true)
	auth := `{"merchant_id":"m_1","idempotency_key":"a-1","amount":1999,"currency":"usd","payment_method":"pm_card_visa","kind":"authorize"}`
	refund := `{"merchant_id":"m_1","idempotency_key":"r-1","amount":1999,"currency":"usd","payment_method":"pm_card_visa","kind":"payout"}`
	out, errOut, err := w.run(auth+"\n"+refund+"\n", "publish")
	if err == nil {
		t.Fatal("publish with a kind not handled exited zero")
	}
	if !strings.Contains(errOut, "line 2 skipped") || !strings.Contains(errOut, "invalid_kind") {
		t.Errorf("stderr:\n%s", errOut)
	}
	if !strings.Contains(out, "publish: 1 published") {
		t.Errorf("summary:\n%s", out)
	}
	msgs := w.streamMsgs()
	if len(msgs) != 1 || string(msgs[0].Data) != auth {
		t.Fatalf("%d messages, want the authorize as written", len(msgs))
	}
}
