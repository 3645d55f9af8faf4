package reconciler_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
	"github.com/paydedup/paydedup/reconciler"
)

const (
	merchant    = "m_rec"
	amount      = 1999
	workerLease = 30 * time.Second
	// stuckFor is how far to move the clock after a claim for its row to be
	// one the reconciler takes with the default Grace and SearchLag: the
	// worker's lease, then SearchLag and a second.
	stuckFor = workerLease + reconciler.DefaultSearchLag + time.Second
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

type bundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	clk    *clock.Fake
	store  *dedup.Store
	sim    *stripesim.Simulator
	stripe *stripe.Client
}

// setup gives a test a migrated schema, a store on a fake clock, and the
// simulator (on the same clock) behind the real Stripe adapter.
func setup(t *testing.T, simCfg stripesim.Config) *bundle {
	t.Helper()
	pool := testenv.Pool(t)
	clk := clock.NewFake(t0)
	store, err := dedup.New(pool, dedup.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if simCfg.Seed == 0 {
		simCfg.Seed = 42
	}
	simCfg.Now = clk.Now
	sim := stripesim.New(simCfg)
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	st, err := stripe.New(stripe.Config{SecretKey: "sk_test_x", APIBase: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	// Runs before srv.Close: no client connection outlives the test.
	t.Cleanup(st.CloseIdleConnections)
	return &bundle{ctx: t.Context(), pool: pool, clk: clk, store: store, sim: sim, stripe: st}
}

func command(key string) *payment.Command {
	return &payment.Command{MerchantID: merchant, IdempotencyKey: key, Amount: amount, Currency: "usd", PaymentMethod: "pm_card_visa"}
}

// claim makes a pending row held by a worker, as a worker does before it
// calls the provider.
func (b *bundle) claim(t *testing.T, key string) ledger.Lease {
	t.Helper()
	res, err := b.store.Claim(b.ctx, "worker", workerLease, ledger.NewClaimRequest(command(key)))
	if err != nil {
		t.Fatalf("claim %s: %v", key, err)
	}
	if res.Outcome != ledger.Claimed {
		t.Fatalf("claim %s: %v, want claimed", key, res.Outcome)
	}
	return *res.Lease
}

// charge makes the provider charge (or decline, with pm) under the row's key,
// as the worker's call would have before it crashed.
func (b *bundle) charge(t *testing.T, l ledger.Lease, pm string) *provider.Outcome {
	t.Helper()
	out, err := b.stripe.Charge(b.ctx, provider.ChargeRequest{
		ProviderKey: l.ProviderKey, MerchantID: l.MerchantID, IdempotencyKey: l.IdempotencyKey,
		Amount: amount, Currency: "usd", PaymentMethod: pm,
	})
	if err != nil {
		t.Fatalf("charge %s: %v", l.IdempotencyKey, err)
	}
	return out
}

func (b *bundle) reconciler(t *testing.T, looker reconciler.Looker, cfg reconciler.Config) *reconciler.Reconciler {
	t.Helper()
	cfg.Clock = b.clk
	r, err := reconciler.New(b.store, looker, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (b *bundle) get(t *testing.T, key string) ledger.Record {
	t.Helper()
	rec, err := b.store.Get(b.ctx, merchant, key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return rec
}

func (b *bundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func runOnce(t *testing.T, r *reconciler.Reconciler) reconciler.RunResult {
	t.Helper()
	res, err := r.RunOnce(t.Context())
	if err != nil {
		t.Fatalf("run once: %v", err)
	}
	return res
}

func wantResult(t *testing.T, got, want reconciler.RunResult) {
	t.Helper()
	if got != want {
		t.Fatalf("run result %+v, want %+v", got, want)
	}
}

type lookerFunc func(ctx context.Context, req provider.LookupRequest) (provider.LookupResult, error)

func (f lookerFunc) Lookup(ctx context.Context, req provider.LookupRequest) (provider.LookupResult, error) {
	return f(ctx, req)
}

// countingLooker counts lookups per idempotency key.
type countingLooker struct {
	next  reconciler.Looker
	mu    sync.Mutex
	calls map[string]int
}

func counting(next reconciler.Looker) *countingLooker {
	return &countingLooker{next: next, calls: map[string]int{}}
}

func (c *countingLooker) Lookup(ctx context.Context, req provider.LookupRequest) (provider.LookupResult, error) {
	c.mu.Lock()
	c.calls[req.IdempotencyKey]++
	c.mu.Unlock()
	return c.next.Lookup(ctx, req)
}

func (c *countingLooker) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.calls {
		n += v
	}
	return n
}

type metricsFunc func(reconciler.RunResult, error)

func (f metricsFunc) ObserveRun(res reconciler.RunResult, err error) { f(res, err) }

func responseID(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var v struct {
		ID    string `json:"id"`
		Error struct {
			PaymentIntent struct {
				ID string `json:"id"`
			} `json:"payment_intent"`
		} `json:"error"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("stored response %s: %v", raw, err)
	}
	return v.ID + v.Error.PaymentIntent.ID
}

func TestChargedRowIsCompleted(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{})
	l := b.claim(t, "charged")
	out := b.charge(t, l, "pm_card_visa") // then the worker crashed
	b.clk.Advance(stuckFor)

	var logs bytes.Buffer
	r := b.reconciler(t, b.stripe, reconciler.Config{Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	wantResult(t, runOnce(t, r), reconciler.RunResult{Examined: 1, Completed: 1})

	rec := b.get(t, "charged")
	if rec.Status != ledger.StatusCompleted || rec.ChargeID != out.ChargeID || rec.ResponseStatus != 200 || rec.LockedBy != r.Holder() {
		t.Fatalf("record %+v: want completed by %s with %s and 200", rec, r.Holder(), out.ChargeID)
	}
	if id := responseID(t, rec.Response); id != out.ChargeID {
		t.Fatalf("stored response is for %q, want the provider's %q", id, out.ChargeID)
	}
	if n := b.count(t, `SELECT count(*) FROM payments WHERE merchant_id = $1 AND idempotency_key = $2 AND charge_id = $3 AND status = 'succeeded'`,
		merchant, "charged", out.ChargeID); n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
	// The reconciler only looked: the provider still has exactly one charge.
	if got := b.sim.ChargesByKey()[merchant+":charged"]; got != 1 || len(b.sim.Charges()) != 1 {
		t.Fatalf("simulator charges for the key = %d (total %d), want 1", got, len(b.sim.Charges()))
	}
	// A second pass has nothing to do.
	wantResult(t, runOnce(t, r), reconciler.RunResult{})

	for _, key := range []string{`"merchant_id":"m_rec"`, `"idempotency_key":"charged"`, `"provider_key":"pdk_`, `"charge_id":"` + out.ChargeID} {
		if !strings.Contains(logs.String(), key) {
			t.Errorf("logs lack %s:\n%s", key, logs.String())
		}
	}
	if strings.Contains(logs.String(), "pm_card") {
		t.Errorf("logs carry a payment method:\n%s", logs.String())
	}
}

func TestDeclinedRowIsCompletedAsDeclined(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{})
	l := b.claim(t, "declined")
	out := b.charge(t, l, "pm_card_chargeDeclined")
	if !out.Declined {
		t.Fatalf("simulator did not decline: %+v", out)
	}
	b.clk.Advance(stuckFor)
	r := b.reconciler(t, b.stripe, reconciler.Config{})
	wantResult(t, runOnce(t, r), reconciler.RunResult{Examined: 1, Declined: 1})

	rec := b.get(t, "declined")
	if rec.Status != ledger.StatusCompleted || rec.ResponseStatus != 402 {
		t.Fatalf("record %+v: want completed with 402", rec)
	}
	if id := responseID(t, rec.Response); id != out.ChargeID {
		t.Fatalf("stored decline is for %q, want %q", id, out.ChargeID)
	}
	if n := b.count(t, `SELECT count(*) FROM payments WHERE idempotency_key = 'declined' AND status = 'declined'`); n != 1 {
		t.Fatalf("%d declined ledger rows, want 1", n)
	}
	if len(b.sim.Charges()) != 0 || b.sim.Declines() != 1 {
		t.Fatalf("simulator: %d charges, %d declines; want 0 and 1", len(b.sim.Charges()), b.sim.Declines())
	}
}

func TestNotChargedRowFailsOnlyAfterSearchLag(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{})
	b.claim(t, "nothing")
	looker := counting(b.stripe)
	r := b.reconciler(t, looker, reconciler.Config{}) // Grace 30s, SearchLag 60s

	// Past Grace but not SearchLag: not found would prove nothing yet, so the
	// row is not even taken.
	b.clk.Advance(workerLease + reconciler.DefaultGrace + time.Second)
	wantResult(t, runOnce(t, r), reconciler.RunResult{})
	if rec := b.get(t, "nothing"); rec.Status != ledger.StatusPending || rec.LockedBy != "worker" || rec.Attempts != 1 {
		t.Fatalf("young row was touched: %+v", rec)
	}
	if n := looker.total(); n != 0 {
		t.Fatalf("%d lookups of a young row, want 0", n)
	}

	b.clk.Advance(reconciler.DefaultSearchLag - reconciler.DefaultGrace)
	wantResult(t, runOnce(t, r), reconciler.RunResult{Examined: 1, Failed: 1})
	rec := b.get(t, "nothing")
	if rec.Status != ledger.StatusFailed || rec.MaybeCharged || !strings.Contains(rec.LastError, "no charge") {
		t.Fatalf("record %+v: want failed, not maybe charged", rec)
	}
	if n := b.count(t, `SELECT count(*) FROM payments`); n != 0 {
		t.Fatalf("%d ledger rows, want 0", n)
	}
	// The next delivery may now charge: it re-acquires a known-not-charged row.
	res, err := b.store.Claim(b.ctx, "worker-2", workerLease, ledger.NewClaimRequest(command("nothing")))
	if err != nil || res.Outcome != ledger.Reacquired || res.Lease.MaybeCharged {
		t.Fatalf("redelivery claim: %+v %v, want reacquired, not maybe charged", res, err)
	}
	if len(b.sim.Charges()) != 0 {
		t.Fatalf("simulator has %d charges, want 0", len(b.sim.Charges()))
	}
}

// TestSearchLagHidesLateCharge charges at the very end of the worker's lease
// against a provider whose search lags by SearchLag: the reconciler must not
// look before the charge is searchable.
func TestSearchLagHidesLateCharge(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{SearchLag: reconciler.DefaultSearchLag})
	l := b.claim(t, "late")
	b.clk.Advance(workerLease)
	out := b.charge(t, l, "pm_card_visa")
	r := b.reconciler(t, b.stripe, reconciler.Config{})

	b.clk.Advance(reconciler.DefaultSearchLag - time.Second)
	got, err := b.stripe.Lookup(b.ctx, provider.LookupRequest{ProviderKey: l.ProviderKey, MerchantID: merchant, IdempotencyKey: "late"})
	if err != nil || got.Found {
		t.Fatalf("search before the lag: %+v %v, want not found (the lag is what this test is about)", got, err)
	}
	wantResult(t, runOnce(t, r), reconciler.RunResult{})

	b.clk.Advance(time.Second + time.Millisecond)
	wantResult(t, runOnce(t, r), reconciler.RunResult{Examined: 1, Completed: 1})
	if rec := b.get(t, "late"); rec.Status != ledger.StatusCompleted || rec.ChargeID != out.ChargeID {
		t.Fatalf("record %+v: want completed with %s", rec, out.ChargeID)
	}
}

func TestLookupErrorLeavesRowPending(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{})
	l := b.claim(t, "flaky")
	out := b.charge(t, l, "pm_card_visa")
	b.clk.Advance(stuckFor)
	if err := b.sim.SetFaults(stripesim.Faults{Rate5xx: 1}); err != nil {
		t.Fatal(err)
	}
	r := b.reconciler(t, b.stripe, reconciler.Config{})
	wantResult(t, runOnce(t, r), reconciler.RunResult{Examined: 1, Left: 1, Errors: 1, LookupErrors: 1})
	rec := b.get(t, "flaky")
	if rec.Status != ledger.StatusPending || !rec.MaybeCharged || rec.LockedBy != r.Holder() ||
		!rec.LockedUntil.Equal(b.clk.Now()) || !strings.Contains(rec.LastError, "lookup") {
		t.Fatalf("record %+v: want pending, released by the reconciler now, with the lookup error", rec)
	}
	// Released now, the row waits out Grace and SearchLag again.
	wantResult(t, runOnce(t, r), reconciler.RunResult{})

	if err := b.sim.SetFaults(stripesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	b.clk.Advance(reconciler.DefaultSearchLag + time.Second)
	wantResult(t, runOnce(t, r), reconciler.RunResult{Examined: 1, Completed: 1})
	if rec := b.get(t, "flaky"); rec.Status != ledger.StatusCompleted || rec.ChargeID != out.ChargeID {
		t.Fatalf("record %+v: want completed with %s", rec, out.ChargeID)
	}
}

// TestUnusableAnswersLeaveRowPending covers answers the reconciler cannot
// record: each leaves the row pending, released, and counted as an error.
func TestUnusableAnswersLeaveRowPending(t *testing.T) {
	t.Parallel()
	resp := json.RawMessage(`{"id":"pi_x","status":"succeeded"}`)
	tests := []struct {
		name   string
		prior  func(t *testing.T, b *bundle) // runs before the row is stuck
		answer func() (provider.LookupResult, error)
		// lookupFailed: the answer counts as a failed lookup (backed off)
		lookupFailed bool
	}{
		{"lookup error", nil, func() (provider.LookupResult, error) {
			return provider.LookupResult{}, &provider.Error{Class: provider.ClassUnknown, Message: "multiple charges under one key"}
		}, true},
		{"found without outcome", nil, func() (provider.LookupResult, error) {
			return provider.LookupResult{Found: true}, nil
		}, true},
		{"charge without id", nil, func() (provider.LookupResult, error) {
			return provider.LookupResult{Found: true, Outcome: &provider.Outcome{Status: "succeeded", HTTPStatus: 200, Response: resp}}, nil
		}, false},
		{"charge without response", nil, func() (provider.LookupResult, error) {
			return provider.LookupResult{Found: true, Outcome: &provider.Outcome{ChargeID: "pi_x", Status: "succeeded"}}, nil
		}, false},
		{"charge id already in the ledger", func(t *testing.T, b *bundle) {
			other := b.claim(t, "other")
			if err := b.store.Complete(b.ctx, other, ledger.Completion{ChargeID: "pi_x", ResponseStatus: 200, Response: resp}); err != nil {
				t.Fatal(err)
			}
		}, func() (provider.LookupResult, error) {
			return provider.LookupResult{Found: true, Outcome: &provider.Outcome{ChargeID: "pi_x", Status: "succeeded", HTTPStatus: 200, Response: resp}}, nil
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, stripesim.Config{})
			if tt.prior != nil {
				tt.prior(t, b)
			}
			b.claim(t, "k")
			b.clk.Advance(stuckFor)
			r := b.reconciler(t, lookerFunc(func(context.Context, provider.LookupRequest) (provider.LookupResult, error) {
				return tt.answer()
			}), reconciler.Config{})
			want := reconciler.RunResult{Examined: 1, Left: 1, Errors: 1}
			if tt.lookupFailed {
				want.LookupErrors = 1
			}
			wantResult(t, runOnce(t, r), want)
			rec := b.get(t, "k")
			if rec.Status != ledger.StatusPending || !rec.MaybeCharged || !rec.LockedUntil.Equal(b.clk.Now()) || rec.LastError == "" {
				t.Fatalf("record %+v: want pending, maybe charged, released now, with the reason", rec)
			}
			if n := b.count(t, `SELECT count(*) FROM payments WHERE idempotency_key = 'k'`); n != 0 {
				t.Fatalf("%d ledger rows for the row, want 0", n)
			}
		})
	}
}

func TestLiveLeaseIsNotTouched(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{})
	b.claim(t, "live")
	before := b.get(t, "live")
	looker := counting(b.stripe)
	r := b.reconciler(t, looker, reconciler.Config{})
	for range 2 {
		wantResult(t, runOnce(t, r), reconciler.RunResult{})
		b.clk.Advance(workerLease / 2)
	}
	if after := b.get(t, "live"); fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatalf("live row changed:\n%+v\n%+v", before, after)
	}
	if n := looker.total(); n != 0 {
		t.Fatalf("%d lookups, want 0", n)
	}
}

func TestConcurrentReconcilersResolveEachRowOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{})
	const rows = 50
	for i := range rows {
		l := b.claim(t, fmt.Sprintf("c-%02d", i))
		if i%2 == 0 {
			b.charge(t, l, "pm_card_visa")
		}
	}
	b.clk.Advance(stuckFor)
	looker := counting(b.stripe)
	rs := []*reconciler.Reconciler{
		b.reconciler(t, looker, reconciler.Config{Holder: "rec-a", BatchSize: 7}),
		b.reconciler(t, looker, reconciler.Config{Holder: "rec-b", BatchSize: 7}),
	}
	totals := make([]reconciler.RunResult, len(rs))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Go(func() {
			<-start
			for {
				res, err := r.RunOnce(b.ctx)
				if err != nil {
					t.Errorf("%s: %v", r.Holder(), err)
					return
				}
				if res.Examined == 0 {
					return
				}
				tot := &totals[i]
				tot.Examined += res.Examined
				tot.Completed += res.Completed
				tot.Failed += res.Failed
				tot.Left += res.Left
				tot.LeaseLost += res.LeaseLost
				tot.Errors += res.Errors
			}
		})
	}
	close(start)
	wg.Wait()

	var sum reconciler.RunResult
	for _, tot := range totals {
		sum.Examined += tot.Examined
		sum.Completed += tot.Completed
		sum.Failed += tot.Failed
		sum.Left += tot.Left + tot.LeaseLost + tot.Errors
	}
	if sum.Examined != rows || sum.Completed != rows/2 || sum.Failed != rows/2 || sum.Left != 0 {
		t.Fatalf("totals %+v, want %d examined, %d completed, %d failed, nothing else", totals, rows, rows/2, rows/2)
	}
	if totals[0].Examined == 0 || totals[1].Examined == 0 {
		t.Logf("one reconciler did all the work: %+v", totals)
	}
	looker.mu.Lock()
	for i := range rows {
		if n := looker.calls[fmt.Sprintf("c-%02d", i)]; n != 1 {
			t.Errorf("c-%02d looked up %d times, want 1", i, n)
		}
	}
	looker.mu.Unlock()
	if n := b.count(t, `SELECT count(*) FROM idempotency_keys WHERE status = 'pending'`); n != 0 {
		t.Fatalf("%d rows still pending", n)
	}
	if n := b.count(t, `SELECT count(*) FROM payments`); n != rows/2 {
		t.Fatalf("%d ledger rows, want %d", n, rows/2)
	}
	if n := len(b.sim.Charges()); n != rows/2 {
		t.Fatalf("simulator has %d charges, want %d: the reconciler must never charge", n, rows/2)
	}
}

func TestFencing(t *testing.T) {
	t.Parallel()

	t.Run("late worker after the reconciler", func(t *testing.T) {
		t.Parallel()
		b := setup(t, stripesim.Config{})
		w := b.claim(t, "k")
		out := b.charge(t, w, "pm_card_visa") // the worker stalls here past its lease
		b.clk.Advance(stuckFor)
		r := b.reconciler(t, b.stripe, reconciler.Config{})
		wantResult(t, runOnce(t, r), reconciler.RunResult{Examined: 1, Completed: 1})

		c := ledger.Completion{ChargeID: out.ChargeID, ResponseStatus: out.HTTPStatus, Response: out.Response}
		if err := b.store.Complete(b.ctx, w, c); !errors.Is(err, ledger.ErrLeaseLost) {
			t.Fatalf("late worker's complete: %v, want ErrLeaseLost", err)
		}
		if _, err := b.store.Heartbeat(b.ctx, w, workerLease); !errors.Is(err, ledger.ErrLeaseLost) {
			t.Fatalf("late worker's heartbeat: %v, want ErrLeaseLost", err)
		}
		if n := b.count(t, `SELECT count(*) FROM payments WHERE idempotency_key = 'k'`); n != 1 {
			t.Fatalf("%d ledger rows, want 1", n)
		}
	})

	for _, charged := range []bool{true, false} {
		t.Run(fmt.Sprintf("reconciler after a redelivery, charged=%v", charged), func(t *testing.T) {
			t.Parallel()
			b := setup(t, stripesim.Config{})
			w := b.claim(t, "k")
			if charged {
				b.charge(t, w, "pm_card_visa")
			}
			b.clk.Advance(stuckFor)
			var redelivery *ledger.Lease
			// The lookup stalls past the reconciler's lease, and a redelivery
			// takes the row meanwhile.
			stall := lookerFunc(func(ctx context.Context, req provider.LookupRequest) (provider.LookupResult, error) {
				b.clk.Advance(reconciler.DefaultLease + time.Second)
				res, err := b.store.Claim(ctx, "worker-2", workerLease, ledger.NewClaimRequest(command(req.IdempotencyKey)))
				if err != nil || res.Outcome != ledger.Reacquired {
					t.Errorf("redelivery claim: %+v %v, want reacquired", res, err)
				} else {
					redelivery = res.Lease
				}
				return b.stripe.Lookup(ctx, req)
			})
			r := b.reconciler(t, stall, reconciler.Config{})
			wantResult(t, runOnce(t, r), reconciler.RunResult{Examined: 1, LeaseLost: 1})
			if redelivery == nil {
				t.FailNow()
			}
			rec := b.get(t, "k")
			if rec.Status != ledger.StatusPending || rec.LockedBy != "worker-2" || rec.Attempts != redelivery.Attempt {
				t.Fatalf("record %+v: want still pending under worker-2", rec)
			}
			// The redelivery's own outcome still records.
			out := b.charge(t, *redelivery, "pm_card_visa")
			if err := b.store.Complete(b.ctx, *redelivery, ledger.Completion{ChargeID: out.ChargeID, ResponseStatus: 200, Response: out.Response}); err != nil {
				t.Fatalf("redelivery's complete: %v", err)
			}
			if n := len(b.sim.Charges()); n != 1 {
				t.Fatalf("simulator has %d charges, want 1", n)
			}
		})
	}
}

// TestLeaseRenewedDuringLongBatch makes every lookup take 20s of a 30s
// lease: the reconciler must renew each row's lease before its lookup, so
// that no redelivery can take the row meanwhile.
func TestLeaseRenewedDuringLongBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{})
	for i := range 3 {
		b.claim(t, fmt.Sprintf("slow-%d", i))
	}
	b.clk.Advance(stuckFor)
	slow := lookerFunc(func(ctx context.Context, req provider.LookupRequest) (provider.LookupResult, error) {
		rec, err := b.store.Get(ctx, merchant, req.IdempotencyKey)
		if err != nil {
			return provider.LookupResult{}, err
		}
		if left := rec.LockedUntil.Sub(b.clk.Now()); left <= reconciler.DefaultLookupTimeout {
			t.Errorf("%s looked up with %s of lease left, want more than the lookup timeout", req.IdempotencyKey, left)
		}
		b.clk.Advance(20 * time.Second)
		return provider.LookupResult{}, nil
	})
	r := b.reconciler(t, slow, reconciler.Config{})
	wantResult(t, runOnce(t, r), reconciler.RunResult{Examined: 3, Failed: 3})
}

func TestPurge(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{})
	for i := range 5 {
		l := b.claim(t, fmt.Sprintf("done-%d", i))
		id := fmt.Sprintf("pi_done_%d", i)
		if err := b.store.Complete(b.ctx, l, ledger.Completion{ChargeID: id, ResponseStatus: 200, Response: json.RawMessage(`{"id":"` + id + `"}`)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		l := b.claim(t, fmt.Sprintf("failed-%d", i))
		if st, err := b.store.Fail(b.ctx, l, "429"); err != nil || st != ledger.StatusFailed {
			t.Fatalf("fail: %v %v", st, err)
		}
	}
	b.claim(t, "stuck")
	live := b.claim(t, "live")

	down := lookerFunc(func(context.Context, provider.LookupRequest) (provider.LookupResult, error) {
		return provider.LookupResult{}, &provider.Error{Class: provider.ClassUnknown, HTTPStatus: 503}
	})
	r := b.reconciler(t, down, reconciler.Config{PurgeBatch: 2, MaxPurgeBatches: 2})
	wantResult(t, runOnce(t, r), reconciler.RunResult{})

	// Every row is now past expires_at; "live" still has a live lease and
	// "stuck" is pending for good (its lookups fail).
	b.clk.Advance(ledger.DefaultRetention + time.Hour)
	if _, err := b.store.Heartbeat(b.ctx, live, workerLease); err != nil {
		t.Fatal(err)
	}
	wantResult(t, runOnce(t, r), reconciler.RunResult{Examined: 1, Left: 1, Errors: 1, LookupErrors: 1, Purged: 4})
	wantResult(t, runOnce(t, r), reconciler.RunResult{Purged: 3})
	wantResult(t, runOnce(t, r), reconciler.RunResult{})

	if n := b.count(t, `SELECT count(*) FROM idempotency_keys`); n != 2 {
		t.Fatalf("%d rows left, want the 2 pending ones", n)
	}
	for _, key := range []string{"stuck", "live"} {
		if rec := b.get(t, key); rec.Status != ledger.StatusPending {
			t.Fatalf("%s is %s, want pending", key, rec.Status)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM payments`); n != 5 {
		t.Fatalf("%d ledger rows, want 5: purge removes keys, never the ledger", n)
	}
}

func TestStartStop(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{})
	l := b.claim(t, "bg")
	b.charge(t, l, "pm_card_visa")
	b.clk.Advance(stuckFor)

	var stopped atomic.Bool
	passes := make(chan reconciler.RunResult, 1000)
	r := b.reconciler(t, b.stripe, reconciler.Config{Interval: 5 * time.Millisecond, Metrics: metricsFunc(func(res reconciler.RunResult, err error) {
		if stopped.Load() {
			t.Errorf("pass after Stop returned")
		}
		if err != nil {
			t.Errorf("pass: %v", err)
		}
		select {
		case passes <- res:
		default:
		}
	})})
	r.Stop() // not started: a no-op

	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(b.ctx); err == nil {
		t.Fatal("second Start succeeded, want an error")
	}
	deadline := time.After(10 * time.Second)
	completed, after := 0, 0
	for after < 3 { // the row resolved, and passes keep coming
		select {
		case res := <-passes:
			completed += res.Completed
			if completed == 1 {
				after++
			}
		case <-deadline:
			t.Fatalf("no passes within 10s: completed %d", completed)
		}
	}
	if completed != 1 {
		t.Fatalf("completed %d, want 1", completed)
	}
	began := time.Now()
	r.Stop()
	stopped.Store(true)
	if d := time.Since(began); d > 2*time.Second {
		t.Fatalf("Stop took %s", d)
	}
	if rec := b.get(t, "bg"); rec.Status != ledger.StatusCompleted {
		t.Fatalf("record %+v: want completed", rec)
	}

	// Startable again after Stop; the context ending ends the loop too.
	stopped.Store(false)
	ctx, cancel := context.WithCancel(b.ctx)
	if err := r.Start(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	select {
	case <-passes:
	case <-time.After(10 * time.Second):
		t.Fatal("no pass after restart")
	}
	cancel()
	r.Stop()
	stopped.Store(true)
}

func TestStopDuringLookupReleasesRow(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Config{})
	b.claim(t, "hang")
	b.clk.Advance(stuckFor)
	entered := make(chan struct{}, 1)
	hang := lookerFunc(func(ctx context.Context, _ provider.LookupRequest) (provider.LookupResult, error) {
		entered <- struct{}{}
		<-ctx.Done()
		return provider.LookupResult{}, ctx.Err()
	})
	results := make(chan reconciler.RunResult, 10)
	r := b.reconciler(t, hang, reconciler.Config{Interval: time.Hour, Metrics: metricsFunc(func(res reconciler.RunResult, _ error) {
		results <- res
	})})
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no lookup within 10s")
	}
	stopDone := make(chan struct{})
	go func() {
		r.Stop()
		close(stopDone)
	}()
	select {
	case <-stopDone:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not return within 5s of a hanging lookup")
	}
	wantResult(t, <-results, reconciler.RunResult{Examined: 1, Left: 1})
	rec := b.get(t, "hang")
	if rec.Status != ledger.StatusPending || rec.LockedBy != r.Holder() || !rec.LockedUntil.Equal(b.clk.Now()) {
		t.Fatalf("record %+v: want pending, released by the reconciler", rec)
	}
}

// unreachableStore is a store on a database that does not answer.
func unreachableStore(t *testing.T) *dedup.Store {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestRunOnceFailsWhenDatabaseIsDown(t *testing.T) {
	t.Parallel()
	var observed error
	r, err := reconciler.New(unreachableStore(t), lookerFunc(nil), reconciler.Config{
		Metrics: metricsFunc(func(_ reconciler.RunResult, err error) { observed = err }),
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.RunOnce(t.Context())
	if !errors.Is(err, ledger.ErrUnavailable) || !strings.HasPrefix(err.Error(), "lease stuck payments: ") {
		t.Fatalf("err = %v, want ErrUnavailable wrapped as \"lease stuck payments: ...\"", err)
	}
	if observed != err {
		t.Fatalf("metrics saw %v, want %v", observed, err)
	}
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	store := unreachableStore(t)
	looker := lookerFunc(nil)
	tests := []struct {
		name   string
		store  reconciler.Store
		looker reconciler.Looker
		cfg    reconciler.Config
		want   string // "" means valid
	}{
		{"defaults", store, looker, reconciler.Config{}, ""},
		{"nil store", nil, looker, reconciler.Config{}, "store"},
		{"nil looker", store, nil, reconciler.Config{}, "looker"},
		{"negative interval", store, looker, reconciler.Config{Interval: -1}, "Interval"},
		{"negative grace", store, looker, reconciler.Config{Grace: -1}, "Grace"},
		{"negative search lag", store, looker, reconciler.Config{SearchLag: -1}, "SearchLag"},
		{"negative lease", store, looker, reconciler.Config{Lease: -1}, "Lease"},
		{"negative lookup timeout", store, looker, reconciler.Config{LookupTimeout: -1}, "LookupTimeout"},
		{"negative batch", store, looker, reconciler.Config{BatchSize: -1}, "BatchSize"},
		{"negative purge batch", store, looker, reconciler.Config{PurgeBatch: -1}, "PurgeBatch"},
		{"negative purge batches", store, looker, reconciler.Config{MaxPurgeBatches: -1}, "MaxPurgeBatches"},
		{"lease shorter than lookup", store, looker, reconciler.Config{Lease: 5 * time.Second}, "Lease 5s must exceed LookupTimeout 10s"},
		{"lease equal to lookup", store, looker, reconciler.Config{Lease: time.Minute, LookupTimeout: time.Minute}, "must exceed LookupTimeout"},
		{"grace below search lag", store, looker, reconciler.Config{Grace: time.Second, SearchLag: time.Hour}, ""},
		{"search lag below the provider's floor", store, looker,
			reconciler.Config{SearchLag: time.Minute, MinSearchLag: reconciler.StripeMinSearchLag}, "SearchLag 1m0s is shorter than the provider's MinSearchLag 2m20s"},
		{"default search lag covers Stripe", store, looker, reconciler.Config{MinSearchLag: reconciler.StripeMinSearchLag}, ""},
		{"negative lookup back-off", store, looker, reconciler.Config{LookupBackoff: -1}, "LookupBackoff"},
		{"back-off cap below its start", store, looker,
			reconciler.Config{LookupBackoff: time.Hour, LookupBackoffMax: time.Minute}, "LookupBackoffMax 1m0s is shorter than LookupBackoff 1h0m0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, err := reconciler.New(tt.store, tt.looker, tt.cfg)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				if !strings.HasPrefix(r.Holder(), "reconciler-") {
					t.Fatalf("default holder %q", r.Holder())
				}
				return
			}
			if !errors.Is(err, reconciler.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalidConfig naming %q", err, tt.want)
			}
		})
	}

	a, _ := reconciler.New(store, looker, reconciler.Config{})
	c, _ := reconciler.New(store, looker, reconciler.Config{})
	if a.Holder() == c.Holder() {
		t.Errorf("two reconcilers share the holder %q", a.Holder())
	}
	if r, _ := reconciler.New(store, looker, reconciler.Config{Holder: "pod-7"}); r.Holder() != "pod-7" {
		t.Errorf("holder %q, want pod-7", r.Holder())
	}
}
