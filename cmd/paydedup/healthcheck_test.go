package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ops"
)

func TestHealthcheckTarget(t *testing.T) {
	t.Parallel()
	tests := []struct {
		addr, path, url, want string
		bad                   bool
	}{
		{addr: ":9090", path: "/readyz", want: "http://127.0.0.1:9090/readyz"},
		{addr: "0.0.0.0:9091", path: "/livez", want: "http://127.0.0.1:9091/livez"},
		{addr: "[::]:9090", path: "/readyz", want: "http://127.0.0.1:9090/readyz"},
		{addr: "10.0.0.5:9090", path: "/readyz", want: "http://10.0.0.5:9090/readyz"},
		{url: "http://127.0.0.1:12111/_sim/ledger", want: "http://127.0.0.1:12111/_sim/ledger"},
		{addr: "9090", path: "/readyz", bad: true},
		{addr: ":9090", path: "readyz", bad: true},
		{url: "127.0.0.1:9090/readyz", bad: true},
	}
	for _, tt := range tests {
		h := &healthcheckCmd{addr: tt.addr, path: tt.path, rawURL: tt.url}
		got, err := h.target()
		if (err != nil) != tt.bad || got != tt.want {
			t.Errorf("target(%q, %q, %q) = %q, %v; want %q (error %v)", tt.addr, tt.path, tt.url, got, err, tt.want, tt.bad)
		}
	}
}

// TestWorkerWaitsForMigrations runs "paydedup worker" against a database
// missing this build's last migration: it stays unready, says why in
// /readyz and in one log line, and does not create its consumer; once the
// migration is there it becomes ready, exports the consumer's lag, and
// "paydedup healthcheck" (what compose runs) follows /readyz throughout.
func TestWorkerWaitsForMigrations(t *testing.T) {
	t.Parallel()
	ownerURL := testenv.PostgresURL(t)
	w := newCLIWorld(t, withUser(t, ownerURL, "paydedup_worker"), false)
	adminAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	w.env["PAYDEDUP_PROVIDER"] = "sim"
	w.env["PAYDEDUP_ADMIN_ADDR"] = adminAddr
	w.env["PAYDEDUP_LOG_LEVEL"] = "info"
	ctx := context.Background()
	owner, err := pg.Connect(ctx, ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	built := dedup.BuiltSchemaVersion()
	if _, err := owner.Exec(ctx, `DELETE FROM goose_db_version WHERE version_id = $1`, built); err != nil {
		t.Fatal(err)
	}

	healthcheck := func() error {
		_, _, err := runCLI(ctx, map[string]string{"PAYDEDUP_ADMIN_ADDR": adminAddr}, "healthcheck")
		return err
	}
	var logs testenv.Buffer
	defer startCommand(t, w.env, &logs, "worker")()

	// Unready, with the reason, and the log says it once.
	waitFor(t, 20*time.Second, "the schema log line", func() bool {
		return strings.Contains(logs.String(), "not ready: database schema")
	})
	err = healthcheck()
	if err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "schema:") ||
		!strings.Contains(err.Error(), fmt.Sprintf("needs %d", built)) || !strings.Contains(err.Error(), "migrate up") {
		t.Fatalf("healthcheck on a worker waiting for migrations: %v", err)
	}
	// Every probe checks again; none of them logs again.
	for range 3 {
		if healthcheck() == nil {
			t.Fatal("ready before the migration")
		}
	}
	if n := strings.Count(logs.String(), "not ready: database schema"); n != 1 {
		t.Errorf("logged the schema state %d times, want once:\n%s", n, logs.String())
	}
	if _, err := w.js.Consumer(ctx, w.cfg.Name, w.cfg.Durable); err == nil {
		t.Error("the worker created its consumer before the schema was current")
	}

	// The migration lands: ready, consuming, the lag exported.
	if _, err := owner.Exec(ctx, `INSERT INTO goose_db_version (version_id, is_applied) VALUES ($1, true)`, built); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "ready", func() bool { return healthcheck() == nil })
	if !strings.Contains(logs.String(), "database schema is current") {
		t.Errorf("no log line when the schema became current:\n%s", logs.String())
	}
	scrape := func() string {
		resp, err := http.Get("http://" + adminAddr + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	// The worker creates its consumer just after the schema check, and a
	// failed read is kept for the lag cache's TTL.
	wants := []string{
		fmt.Sprintf(`paydedup_consumer_pending_messages{consumer=%q,stream=%q} 0`, w.cfg.Durable, w.cfg.Name),
		fmt.Sprintf(`paydedup_consumer_info_up{consumer=%q,stream=%q} 1`, w.cfg.Durable, w.cfg.Name),
		"paydedup_pending_rows 0",
	}
	waitFor(t, 3*ops.DefaultConsumerLagTTL, "the consumer's lag on /metrics", func() bool {
		body := scrape()
		for _, want := range wants {
			if !strings.Contains(body, want) {
				return false
			}
		}
		return true
	})
}

// startCommand runs a long-running command of the tree (worker, gateway)
// with env, its logs to logs; the func it returns stops it and fails the
// test unless it drained and exited 0.
func startCommand(t *testing.T, env map[string]string, logs io.Writer, args ...string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		root := newRootCmd(&testenv.Buffer{}, logs, func(k string) string { return env[k] })
		root.SetArgs(args)
		done <- root.ExecuteContext(ctx)
	}()
	return func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v", args[0], err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("%s did not stop", args[0])
		}
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
