package ops_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/ops"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/reconciler"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func serve(t *testing.T, reg *prometheus.Registry) *ops.Admin {
	t.Helper()
	a, err := ops.NewAdmin("127.0.0.1:0", reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return a
}

func TestReadyzFollowsDependenciesLivezDoesNot(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	a := serve(t, reg)
	base := "http://" + a.Addr()

	// A store on the real Postgres answers; one on a closed port does not.
	good, err := dedup.New(testenv.Pool(t), dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	deadPool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(deadPool.Close)
	dead, err := dedup.New(deadPool, dedup.Config{StatementTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var store atomic.Pointer[dedup.Store]
	store.Store(good)
	var draining atomic.Bool
	a.AddCheck("postgres", func(ctx context.Context) error { return store.Load().Ping(ctx) })
	a.AddCheck("draining", func(context.Context) error {
		if draining.Load() {
			return errors.New("shutting down")
		}
		return nil
	})

	if code, body := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("/readyz with everything up: %d %s", code, body)
	}
	store.Store(dead)
	code, body := get(t, base+"/readyz")
	if code != 503 || !strings.Contains(body, "postgres") {
		t.Fatalf("/readyz with Postgres unreachable: %d %q, want 503 naming postgres", code, body)
	}
	if code, _ := get(t, base+"/livez"); code != 200 {
		t.Fatalf("/livez with Postgres unreachable: %d, want 200", code)
	}
	store.Store(good)
	draining.Store(true)
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.Contains(body, "draining") {
		t.Fatalf("/readyz while draining: %d %q", code, body)
	}
	if code, _ := get(t, base+"/livez"); code != 200 {
		t.Fatalf("/livez while draining: %d", code)
	}
}

func TestMetricsExposed(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := ops.NewMetrics(reg, "test")
	a := serve(t, reg)
	m.Settled(consumer.Duplicate, consumer.Action{Kind: consumer.Ack})
	m.Settled(consumer.DeadLetter, consumer.Action{Kind: consumer.DeadLetterTerm, Reason: "invalid_amount"})
	m.ProviderCalled(30*time.Millisecond, "unknown_outcome")
	m.ObserveRun(reconciler.RunResult{Completed: 2, Purged: 5}, nil)
	_, body := get(t, "http://"+a.Addr()+"/metrics")
	for _, want := range []string{
		`paydedup_messages_total{result="duplicate"} 1`,
		`paydedup_messages_total{result="dead_lettered"} 1`,
		`paydedup_dead_lettered_total{reason="invalid_amount"} 1`,
		`paydedup_provider_errors_total{class="unknown_outcome"} 1`,
		`paydedup_reconciler_rows_total{result="completed"} 2`,
		`paydedup_purged_rows_total 5`,
		`paydedup_build_info{version="test"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestStuckPendingGauge(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	store, err := dedup.New(testenv.Pool(t), dedup.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	ops.WatchPending(reg, func(ctx context.Context) (int64, int64, error) {
		c, err := store.CountPending(ctx, time.Minute)
		return c.Pending, c.Stuck, err
	})
	a := serve(t, reg)
	cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: "k", Amount: 100, Currency: "usd", PaymentMethod: "pm_x"}
	if _, err := store.Claim(context.Background(), "w", 30*time.Second, ledger.NewClaimRequest(cmd)); err != nil {
		t.Fatal(err)
	}
	_, body := get(t, "http://"+a.Addr()+"/metrics")
	if !strings.Contains(body, "paydedup_pending_rows 1") || !strings.Contains(body, "paydedup_stuck_pending_rows 0") {
		t.Fatalf("live lease: %s", grep(body, "pending_rows"))
	}
	clk.Advance(2 * time.Minute)
	_, body = get(t, "http://"+a.Addr()+"/metrics")
	if !strings.Contains(body, "paydedup_stuck_pending_rows 1") {
		t.Fatalf("expired lease past the grace: %s", grep(body, "pending_rows"))
	}
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "; ")
}

// TestReconcilerPassWithFailedLookups: a pass whose lookups failed is
// counted as lookup_errors, not ok, its failures are exported, and it is
// not the last successful pass unless some lookup answered.
func TestReconcilerPassWithFailedLookups(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := ops.NewMetrics(reg, "test")
	a := serve(t, reg)
	m.ObserveRun(reconciler.RunResult{Examined: 3, Left: 3, Errors: 3, LookupErrors: 3}, nil)
	_, body := get(t, "http://"+a.Addr()+"/metrics")
	for _, want := range []string{
		`paydedup_reconciler_runs_total{result="lookup_errors"} 1`,
		`paydedup_reconciler_lookup_errors_total 3`,
		`paydedup_reconciler_last_pass_timestamp_seconds 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("after a pass of failed lookups, /metrics lacks %s", want)
		}
	}
	if strings.Contains(body, `paydedup_reconciler_runs_total{result="ok"}`) {
		t.Errorf("a pass of failed lookups was counted ok: %s", grep(body, "reconciler_runs"))
	}
	m.ObserveRun(reconciler.RunResult{Examined: 2, Completed: 1, Left: 1, Errors: 1, LookupErrors: 1}, nil)
	_, body = get(t, "http://"+a.Addr()+"/metrics")
	if !strings.Contains(body, `paydedup_reconciler_lookup_errors_total 4`) || strings.Contains(body, `paydedup_reconciler_last_pass_timestamp_seconds 0`) {
		t.Errorf("a pass where one lookup answered: %s; %s", grep(body, "lookup_errors"), grep(body, "last_pass"))
	}
}
