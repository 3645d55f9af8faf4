package ops_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/ops"
	"github.com/paydedup/paydedup/reconciler"
)

// TestPendingGaugesQueryOncePerScrape: the two row gauges come from one
// query, however many of them a scrape reads.
func TestPendingGaugesQueryOncePerScrape(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	var calls atomic.Int32
	ops.WatchPending(reg, func(context.Context) (int64, int64, error) {
		calls.Add(1)
		return 7, 2, nil
	})
	for i := 1; i <= 3; i++ {
		if _, err := reg.Gather(); err != nil {
			t.Fatal(err)
		}
		if got := calls.Load(); got != int32(i) {
			t.Fatalf("after %d scrapes: %d queries, want %d", i, got, i)
		}
	}
	want := `
# HELP paydedup_pending_rows Idempotency rows claimed and not finished.
# TYPE paydedup_pending_rows gauge
paydedup_pending_rows 7
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "paydedup_pending_rows"); err != nil {
		t.Error(err)
	}
}

func TestConsumerLagGauges(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	var calls atomic.Int32
	var fail atomic.Bool
	ops.WatchConsumer(reg, "PAYMENTS", "paydedup-worker", time.Hour, func(context.Context) (ops.ConsumerLag, error) {
		calls.Add(1)
		if fail.Load() {
			return ops.ConsumerLag{}, errors.New("nats: timeout")
		}
		return ops.ConsumerLag{Pending: 1200, AckPending: 64, Redelivered: 3, Waiting: 2,
			StreamBytes: 1 << 20, StreamMsgs: 1300, StreamMaxBytes: 4 << 30, StreamMaxMsgs: -1, OldestUnsettledAge: 90 * time.Second}, nil
	})
	want := `
# HELP paydedup_consumer_pending_messages Messages in the stream not yet delivered to the workers' consumer (JetStream num_pending): the backlog KEDA scales on.
# TYPE paydedup_consumer_pending_messages gauge
paydedup_consumer_pending_messages{consumer="paydedup-worker",stream="PAYMENTS"} 1200
# HELP paydedup_consumer_redelivered_messages Unacked messages delivered more than once (JetStream num_redelivered).
# TYPE paydedup_consumer_redelivered_messages gauge
paydedup_consumer_redelivered_messages{consumer="paydedup-worker",stream="PAYMENTS"} 3
# HELP paydedup_consumer_info_up 1 when the last read of the consumer's info from JetStream succeeded, else 0.
# TYPE paydedup_consumer_info_up gauge
paydedup_consumer_info_up{consumer="paydedup-worker",stream="PAYMENTS"} 1
# HELP paydedup_stream_bytes Bytes the payments stream holds: the commands not yet settled, and the settled ones until the workers trim them.
# TYPE paydedup_stream_bytes gauge
paydedup_stream_bytes{consumer="paydedup-worker",stream="PAYMENTS"} 1.048576e+06
# HELP paydedup_stream_max_bytes The payments stream's bound in bytes (PAYDEDUP_STREAM_MAX_BYTES; -1: none). At the bound it refuses publishes (the gateway answers 503).
# TYPE paydedup_stream_max_bytes gauge
paydedup_stream_max_bytes{consumer="paydedup-worker",stream="PAYMENTS"} 4.294967296e+09
# HELP paydedup_stream_max_messages The payments stream's bound in messages (PAYDEDUP_STREAM_MAX_MSGS; -1: none).
# TYPE paydedup_stream_max_messages gauge
paydedup_stream_max_messages{consumer="paydedup-worker",stream="PAYMENTS"} -1
# HELP paydedup_stream_oldest_unsettled_age_seconds How long ago the oldest command the workers have not settled was stored; 0 when none waits.
# TYPE paydedup_stream_oldest_unsettled_age_seconds gauge
paydedup_stream_oldest_unsettled_age_seconds{consumer="paydedup-worker",stream="PAYMENTS"} 90
`
	names := []string{"paydedup_consumer_pending_messages", "paydedup_consumer_redelivered_messages", "paydedup_consumer_info_up",
		"paydedup_stream_bytes", "paydedup_stream_max_bytes", "paydedup_stream_max_messages", "paydedup_stream_oldest_unsettled_age_seconds"}
	for range 3 {
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
			t.Fatal(err)
		}
	}
	if got := calls.Load(); got != 1 {
		t.Errorf("three scrapes within the TTL asked the server %d times, want 1", got)
	}

	// A failing read drops the gauges rather than report stale numbers.
	reg2 := prometheus.NewRegistry()
	fail.Store(true)
	ops.WatchConsumer(reg2, "PAYMENTS", "paydedup-worker", time.Millisecond, func(ctx context.Context) (ops.ConsumerLag, error) {
		return ops.ConsumerLag{}, errors.New("nats: timeout")
	})
	if n, err := testutil.GatherAndCount(reg2, "paydedup_consumer_pending_messages"); err != nil || n != 0 {
		t.Errorf("failed read: %d pending series (err %v), want none", n, err)
	}
	if v := gaugeValue(t, reg2, "paydedup_consumer_info_up"); v != 0 {
		t.Errorf("failed read: info_up %v, want 0", v)
	}
}

func gaugeValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no single series %s", name)
	return 0
}

// TestMetricsLint runs promlint on the /metrics a worker serves, every
// family populated.
func TestMetricsLint(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := ops.NewMetrics(reg, "test")
	ops.WatchPending(reg, func(context.Context) (int64, int64, error) { return 1, 0, nil })
	ops.WatchConsumer(reg, "PAYMENTS", "paydedup-worker", 0, func(context.Context) (ops.ConsumerLag, error) {
		return ops.ConsumerLag{Pending: 1}, nil
	})
	m.Settled(consumer.Completed, consumer.Action{Kind: consumer.Ack})
	m.Settled(consumer.DeadLetter, consumer.Action{Kind: consumer.DeadLetterTerm, Reason: "invalid_amount"})
	m.ProviderCalled(30*time.Millisecond, "unknown_outcome")
	m.Claimed(time.Millisecond, 1)
	m.Committed(time.Millisecond, 1)
	m.InFlight(1)
	m.ObserveRun(reconciler.RunResult{Completed: 1, Purged: 1, LookupErrors: 1}, nil)
	a := serve(t, reg)
	_, body := get(t, "http://"+a.Addr()+"/metrics")
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "paydedup_") {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}
}

// TestOperationGauges: the refunds, captures and cancels stuck or
// unknown, by kind, from one query per scrape; every kind is exported,
// 0 when none; NaN on every kind when the query fails.
func TestOperationGauges(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	var calls atomic.Int32
	var fail atomic.Bool
	ops.WatchOperations(reg, func(context.Context) (map[string]ops.OpCounts, error) {
		calls.Add(1)
		if fail.Load() {
			return nil, errors.New("postgres: down")
		}
		return map[string]ops.OpCounts{"refund": {Stuck: 2, Unknown: 1}, "capture": {Unknown: 3}}, nil
	})
	want := `
# HELP paydedup_stuck_operations Refunds, captures and cancels pending past their lease (their holder is gone), by kind: the reconciler looks them up; alert when it stays above 0.
# TYPE paydedup_stuck_operations gauge
paydedup_stuck_operations{kind="cancel"} 0
paydedup_stuck_operations{kind="capture"} 0
paydedup_stuck_operations{kind="refund"} 2
# HELP paydedup_unknown_operations Refunds, captures and cancels whose call's answer was lost, by kind: looked up before any re-call; alert when it stays above 0.
# TYPE paydedup_unknown_operations gauge
paydedup_unknown_operations{kind="cancel"} 0
paydedup_unknown_operations{kind="capture"} 3
paydedup_unknown_operations{kind="refund"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "paydedup_stuck_operations", "paydedup_unknown_operations"); err != nil {
		t.Error(err)
	}
	if got := calls.Load(); got != 1 {
		t.Errorf("one scrape made %d queries", got)
	}
	fail.Store(true)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if v := m.GetGauge().GetValue(); !math.IsNaN(v) {
				t.Errorf("%s %v = %v while the query fails, want NaN", mf.GetName(), m.GetLabel(), v)
			}
		}
	}
}
