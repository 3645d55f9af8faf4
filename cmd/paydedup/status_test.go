package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/pg"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// seedStore writes rows at known times relative to now (status reads the
// wall clock): 2 pending (one stuck for two hours), 4 completed (3 of them
// in the last hour, one declined, 1 in the last minute), 1 failed.
func seedStore(t *testing.T, dbURL string, now time.Time) {
	t.Helper()
	ctx := context.Background()
	pool, err := pg.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	clk := clock.NewFake(now.Add(-2 * time.Hour))
	store, err := dedup.New(pool, dedup.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	claim := func(holder, key string, lease time.Duration) ledger.Lease {
		t.Helper()
		c := &payment.Command{MerchantID: "m_1", IdempotencyKey: key, Amount: 100, Currency: "usd", PaymentMethod: "pm_card_visa"}
		res, err := store.Claim(ctx, holder, lease, ledger.NewClaimRequest(c))
		if err != nil || res.Lease == nil {
			t.Fatalf("claim %s: %v %+v", key, err, res)
		}
		return *res.Lease
	}
	complete := func(l ledger.Lease, declined bool) {
		t.Helper()
		c := ledger.Completion{ChargeID: "pi_" + l.IdempotencyKey, ResponseStatus: 200, Response: json.RawMessage(`{"ok":true}`)}
		if declined {
			c = ledger.Completion{Declined: true, ResponseStatus: 402, Response: json.RawMessage(`{"declined":true}`)}
		}
		if err := store.Complete(ctx, l, c); err != nil {
			t.Fatal(err)
		}
	}
	complete(claim("w", "old", time.Minute), false)
	claim("gone", "stuck", 30*time.Second)
	clk.Set(now.Add(-30 * time.Minute))
	complete(claim("w", "half-hour", time.Minute), false)
	complete(claim("w", "half-hour-declined", time.Minute), true)
	if _, err := store.Fail(ctx, claim("w", "failed", time.Minute), "429"); err != nil {
		t.Fatal(err)
	}
	clk.Set(now.Add(-5 * time.Second))
	complete(claim("w", "recent", time.Minute), false)
	claim("w", "live", time.Hour)
}

func TestStatusJSON(t *testing.T) {
	t.Parallel()
	dbURL := testenv.PostgresURL(t)
	w := newCLIWorld(t, dbURL, true)
	now := time.Now()
	seedStore(t, dbURL, now)
	ctx := context.Background()
	for i := range 3 {
		key := fmt.Sprintf("queued-%d", i)
		if _, err := w.js.PublishMsg(ctx, stream.CommandMsg(w.cfg, "m_1", key, []byte(`{}`))); err != nil {
			t.Fatal(err)
		}
	}
	for i, reason := range []string{stream.ReasonMaxDeliveries, stream.ReasonMaxDeliveries, stream.ReasonKeyReused} {
		d := stream.Letter{Reason: reason, Err: errors.New("x"), OrigSubject: w.cfg.SubjectPrefix + ".m_1", OrigStream: w.cfg.Name,
			OrigSeq: uint64(i + 1), Deliveries: 1, Header: nats.Header{}, Data: []byte(`{}`), FailedAt: now}
		if _, err := w.js.PublishMsg(ctx, d.Msg(w.cfg)); err != nil {
			t.Fatal(err)
		}
	}

	// Two commands committed to the intake and not yet relayed, one
	// rejected.
	ipool, err := pg.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer ipool.Close()
	if _, err := ipool.Exec(ctx, `INSERT INTO intake_commands (merchant_id, idempotency_key, body, created_at, rejected_at, reject_reason)
		VALUES ('m_1', 'i1', '{}', now() - interval '90 seconds', NULL, NULL), ('m_1', 'i2', '{}', now(), NULL, NULL),
		       ('m_1', 'i3', '{}', now(), now(), 'malformed_json')`); err != nil {
		t.Fatal(err)
	}

	out, errOut, err := w.run("", "status", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	var rep statusReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	if rep.Keys != (keyCounts{Pending: 2, Completed: 4, Failed: 1, Total: 7}) {
		t.Errorf("keys %+v", rep.Keys)
	}
	p := rep.Pending
	if p.OldestPending == nil || p.OldestPending.Sub(now.Add(-2*time.Hour)).Abs() > time.Second ||
		p.OldestPendingAgeSeconds < 7200 || p.OldestPendingAgeSeconds > 7260 {
		t.Errorf("oldest pending %v, age %v s", p.OldestPending, p.OldestPendingAgeSeconds)
	}
	if p.Stuck != 1 || p.GraceSeconds != 30 || p.MaybeCharged != 0 {
		t.Errorf("pending %+v", p)
	}
	if c := rep.Completed; c.LastMinute != 1 || c.LastHour != 3 || c.DeclinedLastHour != 1 {
		t.Errorf("completed %+v", c)
	}
	if dl := rep.DeadLetters; dl == nil || dl.Total != 3 || dl.ByReason["max_deliveries"] != 2 || dl.ByReason["key_reused"] != 1 || dl.Stream != w.cfg.DLQStream {
		t.Errorf("dead letters %+v", dl)
	}
	if c := rep.Consumer; c == nil || c.NumPending != 3 || c.NumAckPending != 0 || c.Durable != "w" || c.Stream != w.cfg.Name {
		t.Errorf("consumer %+v", c)
	}
	// The stream's fill against its bound, and the age of the oldest
	// command not settled: the first of the three queued.
	if c := rep.Consumer; c == nil || c.StreamMessages != 3 || c.StreamBytes == 0 || c.StreamMaxBytes != w.cfg.WithDefaults().StreamMaxBytes ||
		c.StreamMaxMsgs != w.cfg.WithDefaults().StreamMaxMsgs || c.OldestUnsettled.IsZero() || time.Since(c.OldestUnsettled) > time.Minute {
		t.Errorf("stream fill %+v", c)
	}
	if ic := rep.Intake; ic == nil || ic.Waiting != 2 || ic.Rejected != 1 || ic.OldestWaiting == nil || ic.OldestAgeSeconds < 90 || ic.OldestAgeSeconds > 150 {
		t.Errorf("intake %+v", ic)
	}
	if oc := rep.Outcomes; oc == nil || oc.Unrelayed != 4 || oc.OldestAgeSeconds < 7200 {
		t.Errorf("outcome events %+v, want the four ledger rows' events unrelayed, the oldest two hours old", oc)
	}
	if len(rep.Errors) != 0 {
		t.Errorf("errors %v", rep.Errors)
	}

	// The human table says the same.
	out, _, err = w.run("", "status", "--grace", "1h")
	if err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{`completed\s+4`, `pending\s+2`, `stuck\s+1\s+\(pending for more than 1h0m0s\)`, `oldest pending\s+2h0m\d+s ago`,
		`max_deliveries\s+2`, `key_reused\s+1`, `last hour\s+3\s+\(1 declined\)`, `pending\s+3\s+\(not yet delivered\)`,
		`stream holds\s+3\s+\(of \d+ messages; \d+ \(0\.0%\) of \d+ bytes`, `oldest unsettled\s+\d+s`,
		`waiting\s+2\s+\(committed, not yet published`, `oldest waiting\s+1m\d+s ago`, `rejected\s+1\s+\(not valid commands`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("status output does not match %q:\n%s", re, out)
		}
	}
}

func TestStatusWithoutStreams(t *testing.T) {
	t.Parallel()
	dbURL := testenv.PostgresURL(t)
	w := newCLIWorld(t, dbURL, false) // no worker ever started: no streams
	out, _, err := w.run("", "status", "--json")
	if err == nil {
		t.Fatal("status without streams exited zero")
	}
	var rep statusReport
	if jerr := json.Unmarshal([]byte(out), &rep); jerr != nil {
		t.Fatalf("database figures not printed: %v\n%s", jerr, out)
	}
	if rep.Keys.Total != 0 || len(rep.Errors) != 2 || !strings.Contains(strings.Join(rep.Errors, " "), "start a worker") {
		t.Fatalf("report %+v", rep)
	}
	if _, _, err := w.run("", "status", "--grace", "-1s"); err == nil || !strings.Contains(err.Error(), "--grace") {
		t.Fatalf("negative grace: %v", err)
	}
}

// TestStatusSaysWhyPaymentsWait: what the workers note for the gateway's
// GET (a pause's cause, rate_limited, behind_another_merchant) status
// shows too, with since when and how many workers.
func TestStatusSaysWhyPaymentsWait(t *testing.T) {
	t.Parallel()
	dbURL := testenv.PostgresURL(t)
	w := newCLIWorld(t, dbURL, true)
	pool, err := pg.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	notes, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	since := time.Now().Add(-time.Minute).UTC().Truncate(time.Millisecond)
	for _, holder := range []string{"w1", "w2"} {
		if err := notes.NotePause(context.Background(), holder, consumer.WaitBehindMerchant, since, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	out, errOut, err := w.run("", "status", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	var rep statusReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	if wt := rep.Waiting; wt == nil || wt.Cause != consumer.WaitBehindMerchant || wt.Workers != 2 || !wt.Since.Equal(since) {
		t.Fatalf("workers waiting %+v, want %s since %v, 2 workers", wt, consumer.WaitBehindMerchant, since)
	}
	out, _, err = w.run("", "status")
	if err != nil {
		t.Fatal(err)
	}
	if re := `payments wait\s+behind_another_merchant\s+\(2 workers, for 1m\d+s\)`; !regexp.MustCompile(re).MatchString(out) {
		t.Errorf("status output does not match %q:\n%s", re, out)
	}
}
