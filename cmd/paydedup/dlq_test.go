package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/internal/redact"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
	"github.com/paydedup/paydedup/stream"
)

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func paymentLine(key string, amount int64) string {
	return fmt.Sprintf(`{"merchant_id":"m_1","idempotency_key":%q,"amount":%d,"currency":"usd","payment_method":"pm_card_visa"}`, key, amount)
}

func TestDLQListShowReplay(t *testing.T) {
	t.Parallel()
	dbURL := testenv.PostgresURL(t)
	w := newCLIWorld(t, dbURL, false)
	ctx := context.Background()

	// A worker on the test's streams, charging at a simulator we can break.
	pool, err := pg.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sim := stripesim.New(stripesim.Config{Seed: 5})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	stripe, err := stripe.New(stripe.Config{SecretKey: "sk_test_dlq", APIBase: srv.URL, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cfg := consumer.Config{Stream: w.cfg}
	cfg.Stream.MaxDeliver, cfg.Lease, cfg.Stream.AckWait = 2, 2*time.Second, 3*time.Second
	cfg.ProviderTry = provider.RetryPolicy{MaxTries: 1, AttemptTimeout: 500 * time.Millisecond}
	cfg.RetryBase, cfg.RetryMax, cfg.DrainTimeout = 50*time.Millisecond, 200*time.Millisecond, time.Second
	cfg.Concurrency, cfg.FetchBatch, cfg.Holder = 4, 10, "dlq-test-worker"
	// A charger without Lookup: a last delivery that fails is then not
	// taken for an outage (the worker cannot ask), so the lone payment the
	// provider answers 500 runs out of deliveries and is dead-lettered.
	chargeOnly := struct{ consumer.Charger }{stripe}
	worker, err := consumer.NewWorker(testenv.NATSConn(t), consumer.NewProcessor(store, chargeOnly, cfg, nil), cfg, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- worker.Run(wctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	eventually(t, "streams created", func() bool {
		_, err := stream.ConsumerState(ctx, w.js, w.cfg)
		return err == nil
	})
	status := func(key string) ledger.Record {
		rec, err := store.Get(ctx, "m_1", key)
		if err != nil && !errors.Is(err, ledger.ErrNotFound) {
			t.Fatal(err)
		}
		return rec
	}
	deadLetters := func() []dlq.Info {
		l, err := dlq.List(ctx, w.js, w.cfg, dlq.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	quiescent := func() bool {
		st, err := stream.ConsumerState(ctx, w.js, w.cfg)
		return err == nil && st.NumPending == 0 && st.NumAckPending == 0
	}

	// "done" is charged; then the provider fails every call and "down" runs
	// out of deliveries.
	if _, _, err := w.run(paymentLine("done", 100)+"\n", "publish"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "done completed", func() bool { return status("done").Status == ledger.StatusCompleted })
	if err := sim.SetFaults(stripesim.Faults{Rate5xx: 1}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.run(paymentLine("down", 200)+"\n", "publish"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "down dead-lettered", func() bool { return len(deadLetters()) == 1 })
	eventually(t, "quiescent", quiescent)

	// Three more dead letters: a copy of the completed "done" (a duplicate
	// that ran out of deliveries), a reused key, and one published straight
	// to the DLQ, without the workers' key.
	file := func(reason, key string, amount int64, failedAt time.Time) uint64 {
		h := nats.Header{}
		h.Set(stream.HeaderIdempotencyKey, key)
		d := stream.Letter{Reason: reason, Err: errors.New("filed by the test"), OrigSubject: w.cfg.SubjectPrefix + ".m_1",
			OrigStream: w.cfg.Name, OrigSeq: uint64(time.Now().UnixNano()), Deliveries: 2, Header: h,
			Data: []byte(paymentLine(key, amount)), FailedAt: failedAt}
		m := d.Msg(w.cfg)
		if key == "ancient" {
			m.Header.Del(stream.HeaderDLQAuth)
		}
		ack, err := w.js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	downSeq := deadLetters()[0].Seq
	file(stream.ReasonMaxDeliveries, "done", 100, time.Now())
	reusedSeq := file(stream.ReasonKeyReused, "done", 999, time.Now())
	file(stream.ReasonMaxDeliveries, "ancient", 300, time.Now().Add(-72*time.Hour))

	// list
	out, _, err := w.run("", "dlq", "list", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var listed []dlqEntry
	if err := json.Unmarshal([]byte(out), &listed); err != nil || len(listed) != 4 {
		t.Fatalf("list --json: %v\n%s", err, out)
	}
	if l := listed[0]; l.Seq != downSeq || l.Reason != stream.ReasonMaxDeliveries || l.MerchantID != "m_1" || l.IdempotencyKey != "down" || l.Deliveries != 2 || l.Error == "" {
		t.Fatalf("first dead letter %+v", l)
	}
	out, _, err = w.run("", "dlq", "list", "--reason", "max_deliveries", "--since", "1h")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^SEQ\s+REASON\s+MERCHANT\s+KEY\s+DELIVERIES\s+FAILED AT\s+AUTH\s+ERROR`).MatchString(out) ||
		!regexp.MustCompile(fmt.Sprintf(`(?m)^%d\s+max_deliveries\s+m_1\s+down\s+2\s+\S+ \S+\s+ok\s`, downSeq)).MatchString(out) ||
		!regexp.MustCompile(`(?m)^\d+\s+max_deliveries\s+m_1\s+ancient\s+2\s+\S+ \S+\s+UNVERIFIED\s`).MatchString(out) ||
		strings.Contains(out, "key_reused") || strings.Count(out, "max_deliveries") != 3 {
		t.Fatalf("list --reason:\n%s", out)
	}
	out, _, err = w.run("", "dlq", "list", "--limit", "1")
	if err != nil || strings.Count(out, "m_1") != 1 || !strings.Contains(out, "--limit 0 shows all") {
		t.Fatalf("list --limit 1: %v\n%s", err, out)
	}

	// show
	out, _, err = w.run("", "dlq", "show", fmt.Sprint(downSeq))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Dlq-Reason: max_deliveries", "Idempotency-Key: down", "Dlq-Orig-Subject: " + w.cfg.SubjectPrefix + ".m_1", redact.ShownBody([]byte(paymentLine("down", 200)))} {
		if !strings.Contains(out, want) {
			t.Errorf("show does not contain %q:\n%s", want, out)
		}
	}
	if _, _, err := w.run("", "dlq", "show", "99999"); err == nil || !strings.Contains(err.Error(), "no dead letter 99999") {
		t.Errorf("show of a missing sequence: %v", err)
	}
	if _, _, err := w.run("", "dlq", "show", "abc"); err == nil || !strings.Contains(err.Error(), "dlq list") {
		t.Errorf("show abc: %v", err)
	}

	// replay --dry-run changes nothing.
	streamBefore, _ := stream.ConsumerState(ctx, w.js, w.cfg)
	out, _, err = w.run("", "dlq", "replay", "--all", "--dry-run")
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	if !strings.Contains(out, "2 would be replayed, 1 skipped, 1 refused") || !strings.Contains(out, "nothing changed") {
		t.Fatalf("dry run:\n%s", out)
	}
	streamAfter, _ := stream.ConsumerState(ctx, w.js, w.cfg)
	if len(deadLetters()) != 4 || streamAfter.StreamMessages != streamBefore.StreamMessages {
		t.Fatalf("the dry run changed something: %d dead letters, stream %d → %d messages",
			len(deadLetters()), streamBefore.StreamMessages, streamAfter.StreamMessages)
	}

	// The provider recovers: replay the max_deliveries dead letters.
	if err := sim.SetFaults(stripesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	out, _, err = w.run("", "dlq", "replay", "--all", "--reason", "max_deliveries")
	if err != nil {
		t.Fatalf("replay: %v\n%s", err, out)
	}
	if !strings.Contains(out, "dlq replay: 2 replayed, 0 skipped, 1 refused, 0 not found, 0 failed") || !strings.Contains(out, "not authenticated") {
		t.Fatalf("replay:\n%s", out)
	}
	eventually(t, "down completed", func() bool { return status("down").Status == ledger.StatusCompleted })
	eventually(t, "quiescent after the replay", quiescent)
	charges := sim.ChargesByKey()
	if charges["m_1:down"] != 1 {
		t.Errorf("down charged %d times after the replay, want 1", charges["m_1:down"])
	}
	if charges["m_1:done"] != 1 || status("done").Attempts != 1 {
		t.Errorf("the replayed copy of a completed key was charged again: %d charges, %d attempts", charges["m_1:done"], status("done").Attempts)
	}
	left := deadLetters()
	if len(left) != 2 || left[0].Seq != reusedSeq || left[1].IdempotencyKey != "ancient" {
		t.Fatalf("dead letters left: %+v", left)
	}

	// key_reused is skipped without --force, and says how to override.
	out, _, err = w.run("", "dlq", "replay", "--seq", fmt.Sprint(reusedSeq))
	if err == nil || !strings.Contains(out, "--force") {
		t.Fatalf("replay of key_reused: %v\n%s", err, out)
	}
	if _, _, err := w.run("", "dlq", "replay"); err == nil || !strings.Contains(err.Error(), "--seq N") {
		t.Fatalf("replay without a selection: %v", err)
	}
}

// Dead letters are authenticated with PAYDEDUP_DLQ_KEY: the worker and dlq
// replay refuse to start without a usable one, naming the variable; list
// and show still work and say that letters are unverified.
func TestDLQKeyRequired(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, testenv.PostgresURL(t), true)
	d := stream.Letter{Reason: stream.ReasonMaxDeliveries, Err: errors.New("x"), OrigSubject: w.cfg.SubjectPrefix + ".m_1",
		OrigStream: w.cfg.Name, OrigSeq: 1, Deliveries: 2, Header: nats.Header{}, Data: []byte(paymentLine("k", 100)), FailedAt: time.Now()}
	if _, err := w.js.PublishMsg(context.Background(), d.Msg(w.cfg)); err != nil {
		t.Fatal(err)
	}
	out, _, err := w.run("", "dlq", "list")
	if err != nil || !strings.Contains(out, " ok ") {
		t.Fatalf("list with the key: %v\n%s", err, out)
	}
	for _, key := range []string{"", "too-short"} {
		w.env["PAYDEDUP_DLQ_KEY"] = key
		for _, args := range [][]string{{"worker"}, {"dlq", "replay", "--all"}} {
			_, _, err := w.run("", args...)
			if err == nil || !strings.Contains(err.Error(), "PAYDEDUP_DLQ_KEY") {
				t.Errorf("%v with key %q: %v", args, key, err)
			}
		}
		out, _, err := w.run("", "dlq", "list")
		if err != nil || !strings.Contains(out, "UNVERIFIED") || !strings.Contains(out, "PAYDEDUP_DLQ_KEY") {
			t.Errorf("list with key %q: %v\n%s", key, err, out)
		}
		out, _, err = w.run("", "dlq", "show", "1")
		if err != nil || !strings.Contains(out, "UNVERIFIED") {
			t.Errorf("show with key %q: %v\n%s", key, err, out)
		}
	}
}

// A dead letter's body and headers come from whoever published the
// message: show and list print their control bytes (clear screen, a
// window title, an OSC 52 clipboard write, a C1 CSI) and invalid UTF-8
// escaped, so nothing reaches the operator's terminal raw.
func TestDLQShowEscapesTerminalControls(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, testenv.PostgresURL(t), true)
	h := nats.Header{}
	h.Set("X-Title", "\x1b]0;owned\x07")
	h.Set(stream.HeaderIdempotencyKey, "k\x1b[2J")
	evil := "{\"merchant_id\":\"m_1\"}\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07\xff\xfe\u009b31m\r"
	d := stream.Letter{Reason: "malformed_json", Err: errors.New("x"), OrigSubject: w.cfg.SubjectPrefix + ".m_1",
		OrigStream: w.cfg.Name, OrigSeq: 1, Deliveries: 1, Header: h, Data: []byte(evil), FailedAt: time.Now()}
	m := d.Msg(w.cfg)
	m.Header.Set(stream.HeaderDLQError, "bad\x1b]52;c;eA==\x07") // forged, as a letter published straight to the DLQ
	if _, err := w.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	raw := func(out string) string {
		for i, r := range out {
			switch {
			case r == utf8.RuneError:
				return fmt.Sprintf("invalid UTF-8 at byte %d", i)
			case r < 0x20 && r != '\n' && r != '\t', r >= 0x7f && r < 0xa0:
				return fmt.Sprintf("control %U at byte %d", r, i)
			}
		}
		return ""
	}
	for _, args := range [][]string{{"dlq", "show", "1"}, {"dlq", "list"}} {
		out, _, err := w.run("", args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if bad := raw(out); bad != "" {
			t.Errorf("%v prints a %s:\n%q", args, bad, out)
		}
	}
	out, _, _ := w.run("", "dlq", "show", "1")
	for _, want := range []string{`\x1b[2J`, `\x1b]52;c;cm0gLXJmIH4=\x07`, `\xff\xfe`, `\u009b`, `X-Title: \x1b]0;owned\x07`} {
		if !strings.Contains(out, want) {
			t.Errorf("show does not print %s escaped:\n%s", want, out)
		}
	}
}

// A dead letter is whatever its publisher sent: a card number in its body,
// headers, error or original subject (payments.requests.<PAN>), joined to
// other digits by any separator, never reaches dlq list, show or replay's
// output, nor status's dead letters by reason, as text or JSON
// (body_base64 included).
func TestDLQOutputMasksCardNumbers(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, testenv.PostgresURL(t), true)
	const pan = "4111111111111111"
	h := nats.Header{}
	h.Set("X-Card", pan+" 12/28")
	h.Set(stream.HeaderIdempotencyKey, "k-"+pan)
	body := `{"merchant_id":"` + pan + `","idempotency_key":"k-` + pan + `","amount":5,"currency":"usd","payment_method":"pm_card_visa",` +
		`"description":"order 12 ` + pan + `","metadata":{"a":"4111.1111.1111.1111","b":"4111\t1111\t1111\t1111","c":"378282246310005 1"}}`
	d := stream.Letter{Reason: stream.ReasonMaxDeliveries, Err: errors.New("provider: card " + pan + " 123 declined"),
		OrigSubject: w.cfg.SubjectPrefix + "." + pan, OrigStream: w.cfg.Name, OrigSeq: 1, Deliveries: 6, Header: h, Data: []byte(body), FailedAt: time.Now()}
	if _, err := w.js.PublishMsg(context.Background(), d.Msg(w.cfg)); err != nil {
		t.Fatal(err)
	}
	// A letter published straight to the DLQ's subjects, a card number as
	// its reason (what status counts by).
	forged := d.Msg(w.cfg)
	forged.Subject = w.cfg.DLQPrefix + "." + pan
	forged.Header.Set(stream.HeaderDLQReason, pan)
	forged.Header.Set(nats.MsgIdHdr, "forged")
	if _, err := w.js.PublishMsg(context.Background(), forged); err != nil {
		t.Fatal(err)
	}
	leaks := func(out string) []string {
		var found []string
		for _, s := range []string{pan, "4111.1111", "4111\t1111", `4111\t1111`, "378282246310005"} {
			if strings.Contains(out, s) {
				found = append(found, s)
			}
		}
		return found
	}
	for _, args := range [][]string{
		{"dlq", "list"}, {"dlq", "list", "--json"}, {"dlq", "show", "1"}, {"dlq", "show", "1", "--json"},
		{"dlq", "replay", "--seq", "1", "--dry-run"}, {"dlq", "replay", "--seq", "1", "--dry-run", "--json"},
		{"status"}, {"status", "--json"},
	} {
		out, _, err := w.run("", args...)
		if err != nil && args[0] != "status" { // status exits non-zero here: the world has no consumer
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		if false {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		if l := leaks(out); len(l) > 0 {
			t.Errorf("%v shows card numbers %q:\n%s", args, l, out)
		}
		if !strings.Contains(out, "[card number redacted]") {
			t.Errorf("%v shows no masked card number:\n%s", args, out)
		}
		if args[len(args)-1] == "--json" && args[1] == "show" {
			var v struct {
				Body    string              `json:"body"`
				Base64  []byte              `json:"body_base64"`
				Headers map[string][]string `json:"headers"`
			}
			if err := json.Unmarshal([]byte(out), &v); err != nil {
				t.Fatal(err)
			}
			if l := leaks(string(v.Base64) + v.Body + fmt.Sprint(v.Headers)); len(l) > 0 || string(v.Base64) != v.Body {
				t.Errorf("show --json: body_base64 %q and body %q, want the same masked bytes", v.Base64, v.Body)
			}
		}
	}
}

// The skip message and the runbook say to replay an investigated reason by
// name: --reason alone selects every letter with it, with --all's checks
// (card_data is never replayed), and a sequence may be given as show takes
// it, without --seq.
func TestDLQReplayByReasonOrSequence(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, testenv.PostgresURL(t), true)
	ctx := context.Background()
	origSeq := uint64(0)
	file := func(reason, key string) uint64 {
		t.Helper()
		origSeq++ // the letter's Nats-Msg-Id names it
		h := nats.Header{}
		h.Set(stream.HeaderIdempotencyKey, key)
		d := stream.Letter{Reason: reason, Err: errors.New("filed by the test"), OrigSubject: w.cfg.SubjectPrefix + ".m_1",
			OrigStream: w.cfg.Name, OrigSeq: origSeq, Deliveries: 1, Header: h, Data: []byte(paymentLine(key, 100)), FailedAt: time.Now()}
		ack, err := w.js.PublishMsg(ctx, d.Msg(w.cfg))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	rejected1 := file(stream.ReasonProviderRejected, "rej-1")
	maxSeq := file(stream.ReasonMaxDeliveries, "max-1")
	rejected2 := file(stream.ReasonProviderRejected, "rej-2")
	cardSeq := file(string(payment.ReasonCardData), "card-1")

	// --all skips the reason, and says what to run: the test runs it next.
	out, _, err := w.run("", "dlq", "replay", "--all", "--dry-run")
	if err != nil || !strings.Contains(out, "paydedup dlq replay --reason provider_rejected,") {
		t.Fatalf("replay --all --dry-run: %v\n%s", err, out)
	}

	out, _, err = w.run("", "dlq", "replay", "--reason", stream.ReasonProviderRejected, "--dry-run")
	if err != nil {
		t.Fatalf("replay --reason provider_rejected --dry-run: %v\n%s", err, out)
	}
	if !strings.Contains(out, "2 would be replayed, 0 skipped, 0 refused") ||
		!strings.Contains(out, fmt.Sprintf("would replay %d", rejected1)) || !strings.Contains(out, fmt.Sprintf("would replay %d", rejected2)) {
		t.Fatalf("replay --reason provider_rejected --dry-run:\n%s", out)
	}
	out, _, err = w.run("", "dlq", "replay", "--reason", string(payment.ReasonCardData), "--force")
	if err != nil || !strings.Contains(out, "0 replayed, 0 skipped, 1 refused") || !strings.Contains(out, fmt.Sprintf("refused      %d", cardSeq)) {
		t.Fatalf("replay --reason card_data --force: %v\n%s", err, out)
	}

	out, _, err = w.run("", "dlq", "replay", fmt.Sprint(maxSeq), "--dry-run")
	if err != nil || !strings.Contains(out, fmt.Sprintf("would replay %d", maxSeq)) || !strings.Contains(out, "1 would be replayed, 0 skipped") {
		t.Fatalf("replay %d --dry-run: %v\n%s", maxSeq, err, out)
	}
	// A sequence with --reason names that letter only, never every letter
	// with the reason.
	out, _, err = w.run("", "dlq", "replay", fmt.Sprint(rejected1), "--reason", stream.ReasonProviderRejected, "--dry-run")
	if err != nil || !strings.Contains(out, "1 would be replayed, 0 skipped") || strings.Contains(out, fmt.Sprintf("would replay %d", rejected2)) {
		t.Fatalf("replay %d --reason provider_rejected --dry-run: %v\n%s", rejected1, err, out)
	}
	if _, _, err := w.run("", "dlq", "replay", "abc"); err == nil || !strings.Contains(err.Error(), "dlq list") {
		t.Errorf("replay abc: %v", err)
	}
	if _, _, err := w.run("", "dlq", "replay", fmt.Sprint(maxSeq), "--all"); err == nil {
		t.Errorf("replay with a sequence and --all: no error")
	}

	out, _, err = w.run("", "dlq", "replay", "--reason", stream.ReasonProviderRejected)
	if err != nil || !strings.Contains(out, "dlq replay: 2 replayed, 0 skipped, 0 refused, 0 not found, 0 failed") {
		t.Fatalf("replay --reason provider_rejected: %v\n%s", err, out)
	}
	left, err := dlq.List(ctx, w.js, w.cfg, dlq.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 2 || left[0].Seq != maxSeq || left[1].Seq != cardSeq {
		t.Fatalf("dead letters left: %+v", left)
	}
}
