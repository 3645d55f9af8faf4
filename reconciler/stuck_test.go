package reconciler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/ops"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/reconciler"
)

// metricValue reads one series from reg: the counter or gauge named name
// whose labels include want; 0 when there is none.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) (float64, bool) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			}
		}
		return 0, true
	}
	return 0, false
}

// TestFailingLookupsKeepRowStuck: the provider's lookups fail for a row,
// pass after pass. Each failure releases the row, which must not reset its
// stuck age: it stays stuck (Stats, and the gauge's CountPending) and its
// oldest-pending time stays its claim's. Each failure is exported
// (paydedup_reconciler_lookup_errors_total), the passes are not counted ok
// and not as the last successful pass, and the row's next lookup backs off
// exponentially, so that after a few failures a pass that would have taken
// it leaves it alone.
func TestFailingLookupsKeepRowStuck(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{})
	b.claim(t, "dark")
	claimed := b.clk.Now()
	down := lookerFunc(func(context.Context, provider.LookupRequest) (provider.LookupResult, error) {
		return provider.LookupResult{}, errors.New("provider search: 503 service unavailable")
	})
	reg := prometheus.NewRegistry()
	r := b.reconciler(t, down, reconciler.Config{Metrics: ops.NewMetrics(reg, "test")})
	const grace = reconciler.DefaultGrace

	checkStuck := func(step string) {
		t.Helper()
		st, err := b.store.Stats(b.ctx, grace)
		if err != nil {
			t.Fatal(err)
		}
		if st.Stuck != 1 || !st.OldestPending.Equal(claimed) {
			t.Errorf("%s: stats stuck %d, oldest pending %v; want 1, pending since the claim at %v (age %v)",
				step, st.Stuck, st.OldestPending, claimed, b.clk.Now().Sub(claimed))
		}
		c, err := b.store.CountPending(b.ctx, grace)
		if err != nil {
			t.Fatal(err)
		}
		if c.Stuck != 1 {
			t.Errorf("%s: the stuck gauge reads %d, want 1", step, c.Stuck)
		}
	}
	nextLookup := func() time.Time {
		t.Helper()
		var next *time.Time
		if err := b.pool.QueryRow(b.ctx, `SELECT next_lookup_at FROM idempotency_keys WHERE idempotency_key = 'dark'`).Scan(&next); err != nil {
			t.Fatalf("read next_lookup_at: %v", err)
		}
		if next == nil {
			return time.Time{}
		}
		return *next
	}

	// Past Grace and SearchLag the row is examined; its lookup fails, and
	// its next lookup is 1, 2, then 4 minutes later.
	b.clk.Advance(stuckFor)
	failures := 0
	for i, backoff := range []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute} {
		res := runOnce(t, r)
		if res.Examined != 1 || res.Left != 1 || res.Errors != 1 {
			t.Fatalf("pass %d: %+v, want the row examined and left after a failed lookup", i, res)
		}
		failures++
		if want := b.clk.Now().Add(backoff); !nextLookup().Equal(want) {
			t.Errorf("pass %d: next lookup at %v, want %v (back-off %v)", i, nextLookup(), want, backoff)
		}
		checkStuck("after failed lookup")
		if got := runOnce(t, r); got.Examined != 0 {
			t.Fatalf("pass %d: the row was looked up again at once: %+v", i, got)
		}
		checkStuck("right after the release")
		b.clk.Advance(reconciler.DefaultSearchLag + time.Second)
	}
	// 3 min after the third failure: the lease is old enough, but the row's
	// next lookup (4 min) is not due yet.
	if got := runOnce(t, r); got.Examined != 0 {
		t.Fatalf("a row backed off for 4 min was looked up after 3: %+v", got)
	}
	checkStuck("while backed off")
	b.clk.Advance(time.Minute)
	if got := runOnce(t, r); got.Examined != 1 {
		t.Fatalf("once due, the row was not looked up: %+v", got)
	}
	failures++
	checkStuck("after the fourth failure")

	if v, ok := metricValue(t, reg, "paydedup_reconciler_lookup_errors_total", nil); !ok || v != float64(failures) {
		t.Errorf("paydedup_reconciler_lookup_errors_total = %v (exported: %v), want %d", v, ok, failures)
	}
	if v, _ := metricValue(t, reg, "paydedup_reconciler_runs_total", map[string]string{"result": "ok"}); v != 4 {
		// Only the passes that examined nothing were ok.
		t.Errorf("passes counted ok: %v, want the 4 that looked nothing up", v)
	}
	if v, _ := metricValue(t, reg, "paydedup_reconciler_runs_total", map[string]string{"result": "lookup_errors"}); v != float64(failures) {
		t.Errorf("passes counted lookup_errors: %v, want %d", v, failures)
	}
	rec := b.get(t, "dark")
	if rec.Status != ledger.StatusPending || !rec.MaybeCharged {
		t.Errorf("row %s maybe_charged=%v, want still pending and maybe charged", rec.Status, rec.MaybeCharged)
	}
}
