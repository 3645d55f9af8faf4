package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/stream"
)

// TestWorkerRelaysOutcomes: the worker command relays each payment's
// outcome to the outcomes stream (which it creates), its /metrics shows
// the outbox drained, and `paydedup outcomes` prints the events, as JSON
// and for people. Before the outbox no outcome was published: the stream
// did not exist and `outcomes` failed.
func TestWorkerRelaysOutcomes(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, testenv.PostgresURL(t), true)
	w.env["PAYDEDUP_PROVIDER"] = "sim"
	admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	w.env["PAYDEDUP_ADMIN_ADDR"] = admin
	stop := startCommand(t, w.env, &testenv.Buffer{}, "worker")
	defer stop()
	ctx := context.Background()
	for key, pm := range map[string]string{"k-ok": "pm_card_visa", "k-no": "pm_card_chargeDeclined"} {
		body := `{"merchant_id":"m_1","idempotency_key":"` + key + `","amount":700,"currency":"usd","payment_method":"` + pm + `"}`
		if _, err := w.js.PublishMsg(ctx, stream.CommandMsg(w.cfg, "m_1", key, []byte(body))); err != nil {
			t.Fatal(err)
		}
	}
	metrics := func() string {
		resp, err := http.Get("http://" + admin + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	waitFor(t, 30*time.Second, "the outcome events relayed", func() bool {
		m := metrics()
		return strings.Contains(m, "\npaydedup_outcome_events_unrelayed 0\n") && strings.Contains(m, "\npaydedup_outcome_relay_lag_seconds 0\n") &&
			w.outcomes(t) == 2
	})
	out, _, err := w.run("", "outcomes", "--all", "--max", "2", "--json")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]stream.OutcomeEvent{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		e, err := stream.DecodeOutcomeEvent([]byte(line))
		if err != nil {
			t.Fatalf("%v in %q", err, out)
		}
		got[e.EventID] = e
	}
	if e := got["m_1:k-ok:charged"]; e.Status != "succeeded" || e.Amount != 700 || e.ChargeID == "" {
		t.Errorf("charged event %+v", e)
	}
	if e := got["m_1:k-no:declined"]; e.Status != "declined" || e.Reason == "" {
		t.Errorf("declined event %+v, want its reason", e)
	}
	out, _, err = w.run("", "outcomes", "--all", "--max", "1", "--merchant", "m_1")
	if err != nil || !strings.Contains(out, "m_1  k-") {
		t.Fatalf("outcomes: %q %v", out, err)
	}
}

// outcomes is how many events the world's outcomes stream holds.
func (w *cliWorld) outcomes(t *testing.T) uint64 {
	s, err := w.js.Stream(context.Background(), w.cfg.OutcomeStream)
	if err != nil {
		return 0
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// TestWorkerRelaysIntake: a command a publisher committed to the intake
// (the SQL of docs/intake.md) is published by the worker command's relay
// and charged; a row that is not a command is rejected, counted on
// /metrics, and shown by status. Before the intake, nothing read the
// table.
func TestWorkerRelaysIntake(t *testing.T) {
	t.Parallel()
	dbURL := testenv.PostgresURL(t)
	w := newCLIWorld(t, dbURL, true)
	ctx := context.Background()
	pool, err := pg.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `INSERT INTO intake_commands (merchant_id, idempotency_key, body) VALUES
		('m_1', 'in-1', '{"merchant_id":"m_1","idempotency_key":"in-1","amount":900,"currency":"usd","payment_method":"pm_card_visa"}'),
		('m_1', 'in-bad', '{"merchant_id":"m_1","idempotency_key":"in-bad","amount":900}')`); err != nil {
		t.Fatal(err)
	}
	w.env["PAYDEDUP_PROVIDER"] = "sim"
	admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	w.env["PAYDEDUP_ADMIN_ADDR"] = admin
	stop := startCommand(t, w.env, &testenv.Buffer{}, "worker")
	defer stop()
	metrics := func() string {
		resp, err := http.Get("http://" + admin + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	waitFor(t, 30*time.Second, "the intake relayed and the payment charged", func() bool {
		m := metrics()
		var charged int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM payments WHERE idempotency_key = 'in-1' AND status = 'succeeded'`).Scan(&charged)
		return strings.Contains(m, "\npaydedup_intake_commands_waiting 0\n") && strings.Contains(m, "\npaydedup_intake_relay_lag_seconds 0\n") &&
			strings.Contains(m, "\npaydedup_intake_commands_rejected 1\n") && charged == 1
	})
	out, _, err := w.run("", "status")
	if err != nil || !strings.Contains(out, "rejected") || !regexp.MustCompile(`waiting\s+0`).MatchString(out) {
		t.Fatalf("status: %v\n%s", err, out)
	}
}
