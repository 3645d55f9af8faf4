package stripesim_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
)

// within reports whether got is within frac of want.
func within(got, want, frac float64) bool { return math.Abs(got-want) <= frac*want }

// TestModelLatencyIsLogNormal draws a seeded sample from the model's
// distribution without sleeping: its median and 99th percentile are the
// model's.
func TestModelLatencyIsLogNormal(t *testing.T) {
	t.Parallel()
	m := stripesim.Model{LatencyMedian: 300 * time.Millisecond, LatencyP99: 900 * time.Millisecond}
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 50000
	ds := make([]float64, n)
	for i := range ds {
		ds[i] = float64(m.Latency(rng.NormFloat64()))
	}
	slices.Sort(ds)
	p50, p99 := ds[n/2], ds[n*99/100]
	if !within(p50, float64(m.LatencyMedian), 0.02) || !within(p99, float64(m.LatencyP99), 0.04) {
		t.Errorf("sample p50 %v p99 %v, want %v and %v", time.Duration(p50), time.Duration(p99), m.LatencyMedian, m.LatencyP99)
	}
	if c := (stripesim.Model{LatencyMedian: 20 * time.Millisecond}); c.Latency(3) != 20*time.Millisecond || c.Latency(-3) != 20*time.Millisecond {
		t.Errorf("no p99: %v, %v, want the median always", c.Latency(3), c.Latency(-3))
	}
	if (stripesim.Model{}).Latency(1) != 0 {
		t.Error("the zero model waits")
	}
}

// TestModelLatencyOverHTTP serves requests with a model latency: the
// simulator's stats report the median and 99th percentile it gave them
// (what it slept), close to the model's.
func TestModelLatencyOverHTTP(t *testing.T) {
	t.Parallel()
	m := stripesim.Model{LatencyMedian: 2 * time.Millisecond, LatencyP99: 6 * time.Millisecond}
	sim, srv := simServer(t, stripesim.Config{Seed: 7, Model: m})
	const n, par = 2000, 50
	var wg sync.WaitGroup
	for g := range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n / par {
				if r := get(t, srv, "/v1/payment_intents/pi_missing"+string(rune('a'+g%26)), "sk_test_1"); r.status != http.StatusNotFound {
					t.Errorf("retrieve: %d %s", r.status, r.body)
					return
				}
			}
		}()
	}
	wg.Wait()
	st := sim.Stats()
	if st.LatencyCount != n || st.Requests[stripesim.KindRetrieve] != n || st.RequestsTotal != n {
		t.Fatalf("stats %+v, want %d retrieves, each given a latency", st, n)
	}
	if !within(st.LatencyP50MS, 2, 0.08) || !within(st.LatencyP99MS, 6, 0.2) {
		t.Errorf("latency p50 %.2f ms p99 %.2f ms, want about 2 and 6", st.LatencyP50MS, st.LatencyP99MS)
	}
	if st.InFlight != 0 || st.PeakInFlight < 1 || st.PeakInFlight > par || st.InFlightSeconds < 0.9*float64(n)*0.002 {
		t.Errorf("in flight now %d, peak %d (of %d clients), %.2f s in all; want 0, 1..%d, about %d × 2 ms or more",
			st.InFlight, st.PeakInFlight, par, st.InFlightSeconds, par, n)
	}
	if st.Model != m {
		t.Errorf("stats model %+v, want %+v", st.Model, m)
	}
}

// TestRateLimitAnswers429LikeStripe drains an account's bucket: the next
// request, of any endpoint, is answered as Stripe answers it (429, code
// rate_limit, Stripe-Rate-Limited-Reason: global-rate) and not processed:
// nothing charged, nothing kept under its key. Another account is not
// limited; the bucket refills with time.
func TestRateLimitAnswers429LikeStripe(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	sim, srv := simServer(t, stripesim.Config{Now: clk.Now, Model: stripesim.Model{RateLimit: 2}})
	for _, k := range []string{"k-a", "k-b"} {
		if r := post(t, srv, "/v1/payment_intents", "sk_test_1", k, intentForm("100")); r.status != http.StatusOK {
			t.Fatalf("create %s within the limit: %d %s", k, r.status, r.body)
		}
	}
	r := post(t, srv, "/v1/payment_intents", "sk_test_1", "k-over", intentForm("100"))
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("create past the limit: %d %s, want 429", r.status, r.body)
	}
	var body struct {
		Error struct{ Type, Code, Message string } `json:"error"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Fatalf("429 body %q: %v", r.body, err)
	}
	if body.Error.Type != "invalid_request_error" || body.Error.Code != "rate_limit" || !strings.HasPrefix(body.Error.Message, "Too many requests hit the API too quickly.") {
		t.Errorf("429 body %+v, want Stripe's rate_limit error", body.Error)
	}
	if got := r.header.Get("Stripe-Rate-Limited-Reason"); got != stripesim.ReasonGlobalRate {
		t.Errorf("Stripe-Rate-Limited-Reason %q, want global-rate", got)
	}
	if !strings.HasPrefix(r.header.Get("Request-Id"), "req_") || r.header.Get("Content-Type") != "application/json" {
		t.Errorf("429 headers %v, want a Request-Id and JSON", r.header)
	}
	// Stripe documents neither on a rate limit.
	if r.header.Get("Retry-After") != "" || r.header.Get("Stripe-Should-Retry") != "" || r.header.Get("Idempotency-Key") != "" {
		t.Errorf("429 headers %v, want no Retry-After, Stripe-Should-Retry or Idempotency-Key", r.header)
	}
	if g := get(t, srv, "/v1/payment_intents/search?query=metadata['merchant_id']:'m_1'", "sk_test_1"); g.status != http.StatusTooManyRequests {
		t.Errorf("search past the limit: %d, want 429 (the limit is the account's, every endpoint)", g.status)
	}
	if g := get(t, srv, "/v1/payment_intents", "sk_test_other"); g.status != http.StatusOK {
		t.Errorf("another account's list: %d %s, want 200 (limits are per account)", g.status, g.body)
	}
	if n := len(sim.Charges()); n != 2 {
		t.Errorf("%d charges, want the 2 let through", n)
	}

	// A second later the bucket holds two again, and k-over is a new key:
	// other parameters under it are no idempotency_error.
	clk.Advance(time.Second)
	if r := post(t, srv, "/v1/payment_intents", "sk_test_1", "k-over", intentForm("999")); r.status != http.StatusOK || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("k-over after the refill: %d %v %s, want a fresh 200", r.status, r.header, r.body)
	}

	// The adapter reads the answer as Stripe's: a 429 rate_limit.
	s := newStripe(t, stripe.Config{APIBase: srv.URL, SecretKey: "sk_test_1"})
	mustCharge(t, s, chargeReq("k-adapter"))
	_, err := s.Charge(context.Background(), chargeReq("k-adapter-2"))
	var pe *provider.Error
	if !errors.As(err, &pe) || pe.HTTPStatus != http.StatusTooManyRequests || pe.Code != "rate_limit" {
		t.Fatalf("adapter past the limit: %v, want a 429 rate_limit *provider.Error", err)
	}

	st := sim.Stats()
	want := map[string]int64{stripesim.KindCreate: 6, stripesim.KindSearch: 1, stripesim.KindList: 1}
	if !mapsEqual(st.Requests, want) || st.RequestsTotal != 8 {
		t.Errorf("requests %v (total %d), want %v", st.Requests, st.RequestsTotal, want)
	}
	if st.RateLimited[stripesim.ReasonGlobalRate] != 3 || st.RateLimitedTotal != 3 {
		t.Errorf("rate limited %v (total %d), want 3 global-rate", st.RateLimited, st.RateLimitedTotal)
	}
	if st.LatencyCount != 5 {
		t.Errorf("%d requests let through, want 5", st.LatencyCount)
	}
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestConcurrencyLimitAnswers429 holds two creates in flight (blocked in
// OnCharge) under a limit of two: a third request is answered 429 with
// Stripe-Rate-Limited-Reason global-concurrency, unprocessed; once they
// are answered, requests pass again.
func TestConcurrencyLimitAnswers429(t *testing.T) {
	t.Parallel()
	entered, unblock := make(chan struct{}, 2), make(chan struct{})
	sim, srv := simServer(t, stripesim.Config{Model: stripesim.Model{ConcurrencyLimit: 2}, OnCharge: func(stripesim.Charge) {
		entered <- struct{}{}
		<-unblock
	}})
	var wg sync.WaitGroup
	for _, k := range []string{"k-1", "k-2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r := post(t, srv, "/v1/payment_intents", "sk_test_1", k, intentForm("100")); r.status != http.StatusOK {
				t.Errorf("create %s: %d %s", k, r.status, r.body)
			}
		}()
	}
	<-entered
	<-entered
	if st := sim.Stats(); st.InFlight != 2 {
		t.Errorf("in flight %d, want 2", st.InFlight)
	}
	r := post(t, srv, "/v1/payment_intents", "sk_test_1", "k-3", intentForm("100"))
	if r.status != http.StatusTooManyRequests || r.header.Get("Stripe-Rate-Limited-Reason") != stripesim.ReasonGlobalConcurrency ||
		!strings.Contains(string(r.body), `"rate_limit"`) {
		t.Errorf("a third in flight: %d %v %s, want 429 rate_limit global-concurrency", r.status, r.header, r.body)
	}
	close(unblock)
	wg.Wait()
	if r := post(t, srv, "/v1/payment_intents", "sk_test_1", "k-3", intentForm("200")); r.status != http.StatusOK || r.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("k-3 once the others are answered: %d %s, want a fresh 200", r.status, r.body)
	}
	st := sim.Stats()
	if st.InFlight != 0 || st.PeakInFlight != 2 || st.RateLimited[stripesim.ReasonGlobalConcurrency] != 1 || st.RateLimitedTotal != 1 {
		t.Errorf("stats %+v, want none in flight, a peak of 2, one global-concurrency 429", st)
	}
	if n := len(sim.Charges()); n != 3 {
		t.Errorf("%d charges, want 3", n)
	}
}

// TestInjected429Counted: Faults.Rate429 answers keep their Retry-After
// and are counted apart from the limiters'.
func TestInjected429Counted(t *testing.T) {
	t.Parallel()
	sim, srv := simServer(t, stripesim.Config{Faults: stripesim.Faults{Rate429: 1}})
	r := get(t, srv, "/v1/payment_intents", "sk_test_1")
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "1" || r.header.Get("Stripe-Rate-Limited-Reason") != "" {
		t.Errorf("injected 429: %d %v", r.status, r.header)
	}
	if st := sim.Stats(); st.RateLimited[stripesim.ReasonInjected] != 1 || st.RateLimitedTotal != 1 || st.Requests[stripesim.KindList] != 1 {
		t.Errorf("stats %+v, want one injected 429 of one list", st)
	}
	var served stripesim.Stats
	g := get(t, srv, "/_sim/stats", "")
	if err := json.Unmarshal(g.body, &served); err != nil || served.RateLimitedTotal != 1 || served.RequestsTotal != 1 {
		t.Errorf("GET /_sim/stats: %v %s", err, g.body)
	}
}

func TestModelValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		m    stripesim.Model
		want string // "" for valid
	}{
		{stripesim.Model{}, ""},
		{stripesim.Model{LatencyMedian: time.Second}, ""},
		{stripesim.Model{LatencyMedian: time.Second, LatencyP99: time.Second, RateLimit: 0.5, ConcurrencyLimit: 1}, ""},
		{stripesim.Model{LatencyMedian: -1}, "LatencyMedian"},
		{stripesim.Model{LatencyMedian: time.Second, LatencyP99: -1}, "LatencyP99"},
		{stripesim.Model{LatencyP99: time.Second}, "needs a Model.LatencyMedian"},
		{stripesim.Model{LatencyMedian: time.Second, LatencyP99: time.Millisecond}, "below"},
		{stripesim.Model{RateLimit: -1}, "RateLimit"},
		{stripesim.Model{RateLimit: math.NaN()}, "RateLimit"},
		{stripesim.Model{RateLimit: math.Inf(1)}, "RateLimit"},
		{stripesim.Model{ConcurrencyLimit: -1}, "ConcurrencyLimit"},
	} {
		err := (stripesim.Config{Model: c.m}).Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v, want valid", c.m, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, provider.ErrInvalidConfig)):
			t.Errorf("%+v: %v, want ErrInvalidConfig naming %s", c.m, err, c.want)
		}
	}
}
