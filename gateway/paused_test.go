package gateway_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/stream"
)

// TestGetSaysWorkersArePaused: during a provider outage the workers pause
// and spend no delivery, so a payment taken in reads "retrying" or
// "queued" for as long as the outage lasts. GET says why: a delay with the
// pause's cause, since when, and how many workers; once the provider
// answers, the payment is charged and the delay is gone.
func TestGetSaysWorkersArePaused(t *testing.T) {
	t.Parallel()
	// The provider cannot be reached (a refused connection: provably not
	// charged, so the rows are failed and read "retrying"); a 429 would
	// be no outage.
	down := new(atomic.Bool)
	down.Store(true)
	w := setupWith(t, gateway.Config{}, options{worker: func(c *consumer.Config) {
		c.PauseFirst, c.PauseLongest = 100*time.Millisecond, 400*time.Millisecond
	}, charger: func(next consumer.Charger) consumer.Charger { return unreachable{next: next, down: down} }})
	w.startWorker()
	body := payBody(700, "pm_card_visa")
	for i := range 4 {
		wantStatus(t, w.post(fmt.Sprintf("out-%d", i), body), http.StatusAccepted)
	}
	var p gateway.Payment
	w.eventually("GET says the workers are paused", func() bool {
		r := w.do(http.MethodGet, "/v1/payments/out-0", w.keyA, "", nil)
		if r.status != http.StatusOK {
			return false
		}
		p = r.payment(t)
		return p.Delay != nil
	})
	if p.Status != gateway.StateRetrying && p.Status != gateway.StateQueued {
		t.Errorf("status %q during the outage, want retrying or queued", p.Status)
	}
	if d := p.Delay; d.Cause != consumer.PauseProviderUnavailable || d.WorkersPaused != 1 || d.Since.IsZero() || time.Since(d.Since) > time.Minute {
		t.Errorf("delay %+v, want provider_unavailable, 1 worker, since moments ago", *d)
	}

	down.Store(false)
	w.eventually("charged after the outage, no delay", func() bool {
		r := w.do(http.MethodGet, "/v1/payments/out-0", w.keyA, "", nil)
		if r.status != http.StatusOK {
			return false
		}
		p = r.payment(t)
		return p.Status == gateway.StateSucceeded
	})
	if p.Delay != nil {
		t.Errorf("a charged payment carries a delay %+v", *p.Delay)
	}
	// A payment that still waits once the workers work again shows no
	// delay either: the worker cleared its note.
	w.eventually("the worker's note cleared", func() bool {
		return w.count(`SELECT count(*) FROM worker_pauses`) == 0
	})
}

// TestGetSaysWhyAProcessingPaymentWaits: during an outage whose calls end
// unknown (the provider drops the connection before it processes
// anything), a payment's key stays pending and GET says "processing".
// It says why it waits too: the workers' pause.
func TestGetSaysWhyAProcessingPaymentWaits(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, options{worker: func(c *consumer.Config) {
		c.PauseFirst, c.PauseLongest = 100*time.Millisecond, 400*time.Millisecond
	}})
	if err := w.sim.SetFaults(stripesim.Faults{RateFailBeforeCharge: 1}); err != nil {
		t.Fatal(err)
	}
	w.startWorker()
	body := payBody(700, "pm_card_visa")
	for i := range 4 {
		wantStatus(t, w.post(fmt.Sprintf("unk-%d", i), body), http.StatusAccepted)
	}
	w.eventually("the worker paused", func() bool { return w.count(`SELECT count(*) FROM worker_pauses`) > 0 })
	var p gateway.Payment
	w.eventually("GET says processing", func() bool {
		r := w.do(http.MethodGet, "/v1/payments/unk-0", w.keyA, "", nil)
		p = r.payment(t)
		return r.status == http.StatusOK && p.Status == gateway.StateProcessing
	})
	// The pause is read at most once a second.
	for end := time.Now().Add(3 * time.Second); p.Delay == nil && p.Status == gateway.StateProcessing && time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		p = w.do(http.MethodGet, "/v1/payments/unk-0", w.keyA, "", nil).payment(t)
	}
	if p.Delay == nil || p.Delay.Cause != consumer.PauseProviderUnavailable {
		t.Fatalf("GET of a %s payment during the outage: delay %+v, want the workers' pause (provider_unavailable)", p.Status, p.Delay)
	}
	// And when it is tried again: the worker's next probe, within its
	// longest pause (400 ms here) of now, give or take a note's age (5 s).
	if r := p.Delay.RetryAt; r == nil || r.Before(p.Delay.Since) || time.Until(*r) > time.Second {
		t.Fatalf("delay %+v: want retry_at, the worker's next try, after since and within its longest pause", p.Delay)
	}
}

// unreachable refuses the connection to every charge while down.
type unreachable struct {
	next consumer.Charger
	down *atomic.Bool
}

func (u unreachable) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	if u.down.Load() {
		err := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
		return nil, &provider.Error{Class: provider.Classify(0, "", "", err), Err: err}
	}
	return u.next.Charge(ctx, req)
}

// throttledCharger answers every charge 429 rate_limit while limited.
type throttledCharger struct {
	next    consumer.Charger
	limited *atomic.Bool
}

func (c throttledCharger) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	if c.limited.Load() {
		return nil, &provider.Error{Class: provider.ClassRetryable, HTTPStatus: http.StatusTooManyRequests, Code: "rate_limit",
			RateLimitReason: provider.ReasonGlobalRate, Message: "Too many requests hit the API too quickly."}
	}
	return c.next.Charge(ctx, req)
}

// TestGetSaysPaymentsWaitForTheRateLimit: while the provider answers 429,
// the worker is not paused but its payments wait under their leases; GET
// of such a payment says processing with a delay rate_limited, and once
// the provider answers the payment is charged and the delay is gone.
func TestGetSaysPaymentsWaitForTheRateLimit(t *testing.T) {
	t.Parallel()
	limited := new(atomic.Bool)
	limited.Store(true)
	w := setupWith(t, gateway.Config{}, options{
		charger: func(next consumer.Charger) consumer.Charger { return throttledCharger{next: next, limited: limited} }})
	w.startWorker()
	wantStatus(t, w.post("rl-0", payBody(700, "pm_card_visa")), http.StatusAccepted)
	var p gateway.Payment
	w.eventually("GET says the payment waits for the rate limit", func() bool {
		r := w.do(http.MethodGet, "/v1/payments/rl-0", w.keyA, "", nil)
		if r.status != http.StatusOK {
			return false
		}
		p = r.payment(t)
		return p.Delay != nil
	})
	if p.Status != gateway.StateProcessing || p.Delay.Cause != consumer.WaitRateLimited || p.Delay.WorkersPaused != 1 {
		t.Errorf("payment %s with delay %+v during the rate limit, want processing, rate_limited, 1 worker", p.Status, *p.Delay)
	}
	limited.Store(false)
	w.eventually("charged after the rate limit, no delay", func() bool {
		r := w.do(http.MethodGet, "/v1/payments/rl-0", w.keyA, "", nil)
		if r.status != http.StatusOK {
			return false
		}
		p = r.payment(t)
		return p.Status == gateway.StateSucceeded
	})
	if p.Delay != nil {
		t.Errorf("a charged payment carries a delay %+v", *p.Delay)
	}
	if n := w.charges("m_a", "rl-0"); n != 1 {
		t.Errorf("charged %d times, want 1", n)
	}
}

// TestGetSaysNoWorkerConsumes: with no worker running, a payment taken in
// reads "queued" for ever. GET says why: a delay no_worker, once commands
// have waited stream.IdleAfter with nobody asking for them (the test moves
// Idle's clock rather than sleeping); once a worker runs, the payment is
// charged and the delay is gone.
func TestGetSaysNoWorkerConsumes(t *testing.T) {
	t.Parallel()
	var w *world
	var ahead atomic.Int64 // how far Idle's clock runs ahead
	gcfg := gateway.Config{Idle: func(ctx context.Context) (bool, time.Time, error) {
		return stream.Idle(ctx, w.js, w.cfg.Stream, time.Now().Add(time.Duration(ahead.Load())))
	}}
	w = setupWith(t, gcfg, options{})
	wantStatus(t, w.post("nobody-1", payBody(700, "pm_card_visa")), http.StatusAccepted)
	get := func() gateway.Payment {
		t.Helper()
		r := w.do(http.MethodGet, "/v1/payments/nobody-1", w.keyA, "", nil)
		if r.status != http.StatusOK {
			t.Fatalf("GET: %d %s", r.status, r.body)
		}
		return r.payment(t)
	}
	if p := get(); p.Status != gateway.StateQueued || p.Delay != nil {
		t.Fatalf("at once: %q delay %+v, want queued with no delay (a worker may be about to fetch it)", p.Status, p.Delay)
	}
	ahead.Store(int64(stream.IdleAfter + time.Second))
	var p gateway.Payment
	w.eventually("GET says no worker consumes", func() bool {
		p = get()
		return p.Delay != nil
	})
	if d := p.Delay; p.Status != gateway.StateQueued || d.Cause != gateway.DelayNoWorker || d.WorkersPaused != 0 || d.Since.IsZero() {
		t.Errorf("%q delay %+v, want queued, no_worker, since the consumer was last active", p.Status, *d)
	}

	w.startWorker()
	w.eventually("charged once a worker runs", func() bool {
		p = get()
		return p.Status == gateway.StateSucceeded
	})
	if p.Delay != nil {
		t.Errorf("a charged payment carries a delay %+v", *p.Delay)
	}
}

// heldCharger holds merchant m_a's charges until release is closed.
type heldCharger struct {
	next    consumer.Charger
	release chan struct{}
}

func (c heldCharger) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	if req.MerchantID == "m_a" {
		select {
		case <-c.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return c.next.Charge(ctx, req)
}

// TestGetSaysPaymentsWaitBehindAnotherMerchant: with one call slot, held
// by merchant A's call, A's next payment and merchant B's wait in line for
// the slot, each while the other merchant's calls are served in turn. GET
// of B's payment says processing with a delay behind_another_merchant;
// once A's calls end, both are charged and the delay is gone.
func TestGetSaysPaymentsWaitBehindAnotherMerchant(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	w := setupWith(t, gateway.Config{}, options{
		worker:  func(c *consumer.Config) { c.Concurrency = 1 },
		charger: func(next consumer.Charger) consumer.Charger { return heldCharger{next: next, release: release} }})
	w.startWorker()
	wantStatus(t, w.post("behind-a1", payBody(700, "pm_card_visa")), http.StatusAccepted)
	wantStatus(t, w.post("behind-a2", payBody(700, "pm_card_visa")), http.StatusAccepted)
	wantStatus(t, w.do(http.MethodPost, "/v1/payments", w.keyB, payBody(700, "pm_card_visa"),
		map[string]string{"Idempotency-Key": "behind-b1"}), http.StatusAccepted)
	get := func() gateway.Payment {
		t.Helper()
		r := w.do(http.MethodGet, "/v1/payments/behind-b1", w.keyB, "", nil)
		if r.status != http.StatusOK {
			t.Fatalf("GET: %d %s", r.status, r.body)
		}
		return r.payment(t)
	}
	var p gateway.Payment
	w.eventually("GET says the payment waits behind another merchant", func() bool {
		p = get()
		return p.Delay != nil
	})
	if p.Status != gateway.StateProcessing || p.Delay.Cause != consumer.WaitBehindMerchant || p.Delay.WorkersPaused != 1 {
		t.Errorf("payment %s with delay %+v while another merchant's call holds the slot, want processing, %s, 1 worker",
			p.Status, *p.Delay, consumer.WaitBehindMerchant)
	}
	close(release)
	w.eventually("charged, no delay", func() bool {
		p = get()
		return p.Status == gateway.StateSucceeded && p.Delay == nil
	})
	for _, k := range []struct{ merchant, key string }{{"m_a", "behind-a1"}, {"m_a", "behind-a2"}, {"m_b", "behind-b1"}} {
		if n := w.charges(k.merchant, k.key); n != 1 {
			t.Errorf("%s charged %d times, want 1", k.key, n)
		}
	}
}
