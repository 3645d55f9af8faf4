package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ops"
)

// A pool size the worker cannot have stops it before it connects, naming
// the variable or the flag.
func TestWorkerRefusesBadPoolSize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := map[string]string{"PAYDEDUP_DLQ_KEY": strings.Repeat("k", 40), "DATABASE_URL": "postgres://x@127.0.0.1:1/db"}
	for _, n := range []string{"0", "-3", "10001"} {
		env["PAYDEDUP_PG_POOL_SIZE"] = n
		_, _, err := runCLI(ctx, env, "worker")
		if err == nil || !strings.Contains(err.Error(), "PAYDEDUP_PG_POOL_SIZE / --pool-size must be within 1..10000") {
			t.Errorf("PAYDEDUP_PG_POOL_SIZE=%s worker: %v", n, err)
		}
	}
	env["PAYDEDUP_PG_POOL_SIZE"] = "four"
	if _, _, err := runCLI(ctx, env, "worker"); err == nil || !strings.Contains(err.Error(), "PAYDEDUP_PG_POOL_SIZE") {
		t.Errorf("PAYDEDUP_PG_POOL_SIZE=four worker: %v", err)
	}
	delete(env, "PAYDEDUP_PG_POOL_SIZE")
	if _, _, err := runCLI(ctx, env, "worker", "--pool-size", "0"); err == nil || !strings.Contains(err.Error(), "--pool-size must be within") {
		t.Errorf("worker --pool-size 0: %v", err)
	}
}

// TestWorkerPoolOfOne runs "paydedup worker" (the reconciler inside it)
// with PAYDEDUP_PG_POOL_SIZE=1 over a backlog: it never has more than one
// backend, and it still completes every payment, so no path of the worker
// holds a connection while it waits for a second one (claims, group
// commits, releases, heartbeats and the reconciler's scans queue for the
// one connection instead). Its /metrics says the pool's size.
func TestWorkerPoolOfOne(t *testing.T) {
	t.Parallel()
	ownerURL := testenv.PostgresURL(t)
	app := "paydedup-pool-" + testenv.Unique(t)
	u, err := url.Parse(withUser(t, ownerURL, "paydedup_worker"))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	w := newCLIWorld(t, u.String(), true)
	w.env["PAYDEDUP_PROVIDER"] = "sim"
	w.env["PAYDEDUP_PG_POOL_SIZE"] = "1"
	w.env["PAYDEDUP_CONCURRENCY"] = "64"
	w.env["PAYDEDUP_FETCH_BATCH"] = "50"
	w.env["PAYDEDUP_RECONCILE_INTERVAL"] = "100ms"
	adminAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	w.env["PAYDEDUP_ADMIN_ADDR"] = adminAddr
	const payments = 600
	if out, _, err := w.run("", "publish", "--generate", "600", "--merchant", "m_pool", "--seed", "7"); err != nil {
		t.Fatalf("publish: %v\n%s", err, out)
	}

	ctx := context.Background()
	owner, err := pg.Connect(ctx, ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	var most atomic.Int64
	sample := func() {
		var n int64
		if err := owner.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
			t.Error(err)
			return
		}
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				return
			}
		}
	}

	defer startCommand(t, w.env, &testenv.Buffer{}, "worker")()
	completed := func() int {
		var n int
		if err := owner.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, 90*time.Second, "every payment completed", func() bool {
		sample()
		return completed() == payments
	})
	sample()
	if m := most.Load(); m != 1 {
		t.Errorf("the worker had at most %d backends, want 1 (PAYDEDUP_PG_POOL_SIZE=1)", m)
	}
	resp, err := http.Get("http://" + adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\npaydedup_pg_pool_max_connections 1\n", "\npaydedup_pg_pool_connections 1\n"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", strings.TrimSpace(want))
		}
	}
	var ledger, pending int
	if err := owner.QueryRow(ctx, `SELECT (SELECT count(*) FROM payments), (SELECT count(*) FROM pending_keys)`).Scan(&ledger, &pending); err != nil {
		t.Fatal(err)
	}
	if ledger != payments || pending != 0 {
		t.Errorf("ledger %d rows, %d pending names; want %d and 0", ledger, pending, payments)
	}
}

// Without PAYDEDUP_PG_POOL_SIZE the worker opens consumer.DefaultPoolSize
// connections: 2 × GOMAXPROCS, at least 4.
func TestWorkerDefaultPoolSize(t *testing.T) {
	t.Parallel()
	root, _ := newRoot(&testenv.Buffer{}, &testenv.Buffer{}, func(string) string { return "" })
	cmd, _, err := root.Find([]string{"worker"})
	if err != nil {
		t.Fatal(err)
	}
	f := cmd.Flags().Lookup("pool-size")
	want := max(4, 2*runtime.GOMAXPROCS(0))
	if f == nil || f.DefValue != strconv.Itoa(want) || consumer.DefaultPoolSize() != want {
		t.Fatalf("worker --pool-size default %v, DefaultPoolSize() %d; want %d", f, consumer.DefaultPoolSize(), want)
	}
}

// TestPoolMetricsShowWaits exports a real pool of one connection while two
// statements want it: the second one's wait shows in the counters an
// operator sizes PAYDEDUP_PG_POOL_SIZE by.
func TestPoolMetricsShowWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pg.Connect(ctx, testenv.PostgresURL(t), pg.WithMaxConns(1))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	reg := prometheus.NewRegistry()
	ops.WatchPool(reg, func() ops.PoolStat { return pool.Stat() })
	if _, err := pool.Exec(ctx, `SELECT 1`); err != nil { // the connection opens: one acquisition that waited for it
		t.Fatal(err)
	}
	before := gather(t, reg)
	held := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			close(held)
			done <- err
			return
		}
		close(held)
		_, err = conn.Exec(ctx, `SELECT pg_sleep(0.3)`)
		conn.Release()
		done <- err
	}()
	<-held
	if _, err := pool.Exec(ctx, `SELECT 1`); err != nil { // waits for the sleeper's connection
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	after := gather(t, reg)
	if after["paydedup_pg_pool_max_connections"] != 1 || after["paydedup_pg_pool_connections"] != 1 || after["paydedup_pg_pool_acquired_connections"] != 0 {
		t.Errorf("pool gauges %v, want a pool of 1 with 1 connection, none held", after)
	}
	if d := after["paydedup_pg_pool_acquires_total"] - before["paydedup_pg_pool_acquires_total"]; d != 2 {
		t.Errorf("%v acquisitions, want 2", d)
	}
	if d := after["paydedup_pg_pool_waited_acquires_total"] - before["paydedup_pg_pool_waited_acquires_total"]; d != 1 {
		t.Errorf("%v acquisitions waited, want 1 (the statement behind the sleeper)", d)
	}
	if d := after["paydedup_pg_pool_acquire_wait_seconds_total"] - before["paydedup_pg_pool_acquire_wait_seconds_total"]; d < 0.1 || d > 5 {
		t.Errorf("waited %.3fs in all, want about the sleeper's 0.3s", d)
	}
}

// gather returns each unlabelled metric's value.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch {
			case m.GetGauge() != nil:
				out[mf.GetName()] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				out[mf.GetName()] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}
