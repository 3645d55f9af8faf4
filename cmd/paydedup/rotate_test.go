package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
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
	out, _, err = w.run("", "dlq", "list")
	if err != nil || !strings.Contains(out, " ok(previous) ") || !strings.Contains(out, " ok ") || !strings.Contains(out, " UNVERIFIED ") {
		t.Fatalf("list: %v\n%s", err, out)
	}
	out, _, err = w.run("", "dlq", "show", fmt.Sprint(old))
	if err != nil || !strings.Contains(out, "signed with a previous DLQ key (Dlq-Key-Id "+stream.DLQKeyID([]byte(testenv.DLQKey))+", listed in PAYDEDUP_DLQ_PREVIOUS_KEYS)") {
		t.Fatalf("show: %v\n%s", err, out)
	}
	out, _, err = w.run("", "dlq", "show", fmt.Sprint(unknown))
	if err != nil || !strings.Contains(out, "UNVERIFIED") || !strings.Contains(out, "signed with DLQ key "+stream.DLQKeyID([]byte(unknownDLQKey))) {
		t.Fatalf("show of the letter under an unknown key: %v\n%s", err, out)
	}
	delete(w.env, "PAYDEDUP_DLQ_PREVIOUS_KEYS")
	if _, _, err := w.run("", "dlq", "resign", "--all"); err == nil || !strings.Contains(err.Error(), "PAYDEDUP_DLQ_PREVIOUS_KEYS is not set") {
		t.Fatalf("resign without previous keys: %v", err)
	}

	for _, bad := range []string{"too-short", testenv.DLQKey + ",short", testenv.DLQKey + ","} {
		w.env["PAYDEDUP_DLQ_PREVIOUS_KEYS"] = bad
		for _, args := range [][]string{{"worker"}, {"dlq", "replay", "--all"}, {"dlq", "resign", "--all"}, {"console"}} {
			if _, _, err := w.run("", args...); err == nil || !strings.Contains(err.Error(), "PAYDEDUP_DLQ_PREVIOUS_KEYS") {
				t.Errorf("%v with PAYDEDUP_DLQ_PREVIOUS_KEYS=%q: %v", args, bad, err)
			}
		}
	}
}

// rejecting is a provider that refuses (400 invalid_request_error) the
// payments whose key starts with "rej-" while broken: each is
// dead-lettered provider_rejected at once, uncharged, and charges once
// replayed after the fix.
type rejecting struct {
	consumer.Charger
	broken atomic.Bool
}

func (r *rejecting) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	if r.broken.Load() && strings.HasPrefix(req.IdempotencyKey, "rej-") {
		return nil, &provider.Error{Class: provider.ClassRejected, HTTPStatus: 400, Type: "invalid_request_error", Code: "parameter_invalid", Message: "rejected by the test"}
	}
	return r.Charger.Charge(ctx, req)
}

// The DLQ key is rotated while payments flow and workers file dead
// letters: workers on the old key, then a rolling restart to the new key
// with the old one previous (both kinds of worker filing letters at
// once), then the old workers gone; one old letter replayed while the old
// key is still listed, the rest re-signed with dlq resign, the old key
// dropped, and everything replayed. Every letter a worker filed stays
// verified at every step, every payment ends charged exactly once, and
// the one letter signed with a key nobody configured is never replayed.
func TestDLQKeyRotationWhileTrafficFlows(t *testing.T) {
	t.Parallel()
	dbURL := testenv.PostgresURL(t)
	w := newCLIWorld(t, dbURL, true)
	ctx := context.Background()
	pool, err := pg.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sim := stripesim.New(stripesim.Config{Seed: 54})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	client, err := stripe.New(stripe.Config{SecretKey: "sk_test_rotate", APIBase: srv.URL, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	prov := &rejecting{Charger: client}
	prov.broken.Store(true)

	// startWorker runs a worker signing with current and knowing previous,
	// and returns its stop.
	startWorker := func(holder string, current string, previous ...string) func() {
		cfg := consumer.Config{Stream: w.cfg}
		cfg.Stream.DLQKey, cfg.Stream.DLQPreviousKeys = []byte(current), nil
		for _, p := range previous {
			cfg.Stream.DLQPreviousKeys = append(cfg.Stream.DLQPreviousKeys, []byte(p))
		}
		cfg.Lease, cfg.Stream.AckWait = 2*time.Second, 3*time.Second
		cfg.ProviderTry = provider.RetryPolicy{MaxTries: 1, AttemptTimeout: 500 * time.Millisecond}
		cfg.RetryBase, cfg.RetryMax, cfg.DrainTimeout = 50*time.Millisecond, 200*time.Millisecond, time.Second
		cfg.Concurrency, cfg.FetchBatch, cfg.Holder = 4, 4, holder
		worker, err := consumer.NewWorker(testenv.NATSConn(t), consumer.NewProcessor(store, prov, cfg, nil), cfg, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- worker.Run(wctx) }()
		stopped := false
		stop := func() {
			if !stopped {
				stopped = true
				cancel()
				if err := <-done; err != nil {
					t.Errorf("worker %s: %v", holder, err)
				}
			}
		}
		t.Cleanup(stop)
		return stop
	}
	var keys []string
	publish := func(n int) {
		t.Helper()
		for range n {
			for _, prefix := range []string{"ok-", "rej-"} {
				key := fmt.Sprintf("%s%d", prefix, len(keys))
				keys = append(keys, key)
				if _, err := w.js.PublishMsg(ctx, stream.CommandMsg(w.cfg, "m_1", key, []byte(paymentLine(key, 100)))); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// letters lists the dead letters as the CLI, with the world's
	// environment, sees them.
	letters := func() []dlqEntry {
		t.Helper()
		out, _, err := w.run("", "dlq", "list", "--json", "--limit", "0")
		if err != nil {
			t.Fatal(err)
		}
		var l []dlqEntry
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			t.Fatalf("list --json: %v\n%s", err, out)
		}
		return l
	}
	// allVerified checks that every letter but the forged one verifies,
	// and returns how many were signed with a previous key.
	forged := w.fileLetterWith(unknownDLQKey, "forged")
	allVerified := func(want int) (previous []uint64) {
		t.Helper()
		l := letters()
		if len(l) != want {
			t.Fatalf("%d dead letters, want %d: %+v", len(l), want, l)
		}
		for _, d := range l {
			if d.Verified == (d.Seq == forged) {
				t.Fatalf("letter %d (%s): verified %v (%s)", d.Seq, d.IdempotencyKey, d.Verified, d.Unverified)
			}
			if d.PreviousKey {
				previous = append(previous, d.Seq)
			}
		}
		return previous
	}
	rejected := func() int {
		n, err := dlq.Counts(ctx, w.js, w.cfg)
		if err != nil {
			t.Fatal(err)
		}
		return int(n[stream.ReasonProviderRejected])
	}

	// 1. Workers on the old key.
	stopOld := startWorker("old-1", testenv.DLQKey)
	publish(3)
	eventually(t, "3 letters under the old key", func() bool { return rejected() == 3 })
	if prev := allVerified(4); len(prev) != 0 {
		t.Fatalf("before the rotation, letters %v are said to be signed with a previous key", prev)
	}

	// 2. The rotation: the CLI, then a new worker, on the new key with the
	// old one previous, beside an old worker still running.
	w.env["PAYDEDUP_DLQ_KEY"] = newDLQKey
	w.env["PAYDEDUP_DLQ_PREVIOUS_KEYS"] = testenv.DLQKey
	if prev := allVerified(4); len(prev) != 3 {
		t.Fatalf("after the rotation, %d letters under the previous key, want 3", len(prev))
	}
	startWorker("new-1", newDLQKey, testenv.DLQKey)
	publish(6)
	eventually(t, "9 letters under both keys", func() bool { return rejected() == 9 })
	allVerified(10)

	// 3. The old worker is gone: only the new key signs.
	stopOld()
	publish(2)
	eventually(t, "11 letters", func() bool { return rejected() == 11 })
	prev := allVerified(12)
	// Which worker took the rotation's traffic is the server's choice:
	// phase 1's letters are under the old key, phase 3's under the new.
	if len(prev) < 3 || len(prev) > 9 {
		t.Fatalf("%d of 11 letters under the previous key, want 3 to 9", len(prev))
	}
	t.Logf("%d of 11 letters signed with the previous key", len(prev))

	// 4. The provider is fixed. One old letter is replayed while its key
	// is still listed; dlq resign moves the others to the new key.
	prov.broken.Store(false)
	out, _, err := w.run("", "dlq", "replay", "--seq", fmt.Sprint(prev[0]))
	if err != nil || !strings.Contains(out, "1 replayed") {
		t.Fatalf("replay of a letter under the previous key: %v\n%s", err, out)
	}
	out, _, err = w.run("", "dlq", "resign", "--all")
	if err != nil || !strings.Contains(out, fmt.Sprintf("dlq resign: %d re-signed", len(prev)-1)) || !strings.Contains(out, "1 refused") {
		t.Fatalf("resign --all: %v\n%s", err, out)
	}

	// 5. The old key dropped: every letter still verifies.
	delete(w.env, "PAYDEDUP_DLQ_PREVIOUS_KEYS")
	if prev := allVerified(11); len(prev) != 0 {
		t.Fatalf("letters %v still under the dropped key", prev)
	}
	out, _, err = w.run("", "dlq", "replay", "--all", "--reason", stream.ReasonProviderRejected)
	if err != nil || !strings.Contains(out, "dlq replay: 10 replayed, 0 skipped, 0 refused") {
		t.Fatalf("replay --all: %v\n%s", err, out)
	}
	out, _, err = w.run("", "dlq", "replay", "--seq", fmt.Sprint(forged))
	if err == nil || !strings.Contains(out, "neither the current DLQ key nor a previous one") {
		t.Fatalf("replay of the letter under an unknown key: %v\n%s", err, out)
	}

	// Nothing lost: every payment charged exactly once.
	for _, key := range keys {
		eventually(t, key+" completed", func() bool {
			rec, err := store.Get(ctx, "m_1", key)
			return err == nil && rec.Status == ledger.StatusCompleted
		})
	}
	charges := sim.ChargesByKey()
	for _, key := range keys {
		if n := charges["m_1:"+key]; n != 1 {
			t.Errorf("%s charged %d times, want 1", key, n)
		}
	}
	if l := letters(); len(l) != 1 || l[0].Seq != forged {
		t.Errorf("dead letters left: %+v", l)
	}
}
