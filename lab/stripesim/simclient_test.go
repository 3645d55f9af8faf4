package stripesim_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/provider"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider/stripe"
)

// TestSimClientAgainstSimulator runs the behavioural suite through Client,
// which calls the scenario's simulator directly.
func TestSimClientAgainstSimulator(t *testing.T) {
	t.Parallel()
	runProviderSuite(t, func(t *testing.T, sim *stripesim.Simulator, _ string) provider.Provider {
		return sim.Client("sk_test_paydedup")
	}, suiteCaps{})
}

func TestSimClientTimeout(t *testing.T) {
	t.Parallel()
	sim := stripesim.New(stripesim.Config{Faults: stripesim.Faults{Latency: time.Minute}})
	c := sim.Client("sk_test").WithTimeout(100 * time.Millisecond)
	_, err := c.Charge(context.Background(), chargeReq("k-cfg-timeout"))
	wantClass(t, err, provider.ClassUnknown)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want it to wrap context.DeadlineExceeded", err)
	}
	_, err = c.Lookup(context.Background(), provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-cfg-timeout"})
	wantClass(t, err, provider.ClassUnknown)
	wantCharges(t, sim, "k-cfg-timeout", 0)
}

func TestSimClientAnswerAfterDeadline(t *testing.T) {
	t.Parallel()
	// The HTTP adapter gives up at its deadline while the simulator goes on
	// charging; Client runs OnCharge in the caller's goroutine, so it
	// returns when the hook does, with the same unknown outcome.
	release := make(chan struct{})
	sim := stripesim.New(stripesim.Config{OnCharge: func(stripesim.Charge) { <-release }})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	go func() {
		<-ctx.Done()
		close(release)
	}()
	_, err := sim.Client("sk_test").Charge(ctx, chargeReq("k-late"))
	wantClass(t, err, provider.ClassUnknown)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want it to wrap context.DeadlineExceeded", err)
	}
	wantCharges(t, sim, "k-late", 1)
}

func TestSimClientUnauthorizedStopsTheWorker(t *testing.T) {
	t.Parallel()
	sim := stripesim.New(stripesim.Config{})
	_, err := sim.Client("  ").Charge(context.Background(), chargeReq("k-401"))
	pe := wantClass(t, err, provider.ClassUnauthorized)
	if pe.HTTPStatus != http.StatusUnauthorized || pe.Type != "authentication_error" {
		t.Fatalf("error = %+v", pe)
	}
	_, err = sim.Client("").Lookup(context.Background(), provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-401"})
	wantClass(t, err, provider.ClassUnauthorized)
	wantCharges(t, sim, "k-401", 0)
}

func TestSimClientRejectsBadProviderKey(t *testing.T) {
	t.Parallel()
	sim := stripesim.New(stripesim.Config{})
	c := sim.Client("sk_test")
	for _, key := range []string{"", " padded", strings.Repeat("k", provider.MaxProviderKeyLen+1)} {
		req := chargeReq("k")
		req.ProviderKey = key
		_, err := c.Charge(context.Background(), req)
		wantClass(t, err, provider.ClassMismatch)
		if !errors.Is(err, provider.ErrInvalidRequest) {
			t.Fatalf("err = %v, want ErrInvalidRequest", err)
		}
	}
	if _, err := c.Lookup(context.Background(), provider.LookupRequest{MerchantID: "m_123"}); !errors.Is(err, provider.ErrInvalidRequest) {
		t.Fatalf("lookup without key: err = %v", err)
	}
	if n := len(sim.Charges()); n != 0 {
		t.Fatalf("charged %d times", n)
	}
}

func TestSimClientBodyTooLarge(t *testing.T) {
	t.Parallel()
	// The HTTP simulator refuses a body over 1 MiB before reading its
	// parameters; the client measures the body stripe-go would send.
	sim := stripesim.New(stripesim.Config{})
	req := chargeReq("k-big")
	req.Description = strings.Repeat("x", 1<<20)
	_, err := sim.Client("sk_test").Charge(context.Background(), req)
	pe := wantClass(t, err, provider.ClassRejected)
	if pe.HTTPStatus != http.StatusBadRequest || !strings.Contains(pe.Message, "request body too large") {
		t.Fatalf("error = %+v", pe)
	}
}

// parityStep is one call made through both paths.
type parityStep struct {
	name    string
	faults  stripesim.Faults
	advance time.Duration // the simulators' clocks move first
	timeout time.Duration // bounds the call's context when set
	charge  *provider.ChargeRequest
	lookup  *provider.LookupRequest
}

func chargeStep(name string, req provider.ChargeRequest, f stripesim.Faults) parityStep {
	return parityStep{name: name, faults: f, charge: &req}
}

func lookupStep(name string, req provider.LookupRequest, f stripesim.Faults) parityStep {
	return parityStep{name: name, faults: f, lookup: &req}
}

// parityPath is one way to the simulator under the same seed and clock.
type parityPath struct {
	sim *stripesim.Simulator
	clk *clock.Fake
	p   provider.Provider
}

// TestSimClientParity runs the same sequence of calls through the Stripe
// adapter over HTTP and through Client, each against its own simulator
// with the same seed and clock: every outcome and error must be the same
// (intent ids included, since both paths draw the same random numbers), and
// so must the ledgers.
func TestSimClientParity(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	newPath := func() parityPath {
		clk := clock.NewFake(start)
		return parityPath{sim: stripesim.New(stripesim.Config{Seed: 7, Now: clk.Now, SearchLag: time.Minute}), clk: clk}
	}
	httpPath, direct := newPath(), newPath()
	srv := httptest.NewServer(httpPath.sim)
	t.Cleanup(srv.Close)
	// No keep-alive: net/http resends a request that fails on a reused
	// connection (an injected drop), which would roll one more fate.
	httpPath.p = newStripe(t, stripe.Config{APIBase: srv.URL,
		HTTPClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}})
	direct.p = direct.sim.Client("sk_test_paydedup")

	none := stripesim.Faults{}
	tricky := chargeReq("k-tricky")
	tricky.IdempotencyKey = "k-tricky\xff<&>"
	tricky.Description = "naïve \u2028 <b>&amp; \"quoted\" \\ \x01"
	tricky.Metadata = map[string]string{
		"a": "1", "a1": "2", "a b": "3", "A": "4", "x]y": "5", "[": "6", "": "7", "ключ": "значение",
		"<&>": "\xff\xfe", "+%=&;": "+%=&;", "merchant_id": "m_evil",
	}
	trickyLookup := provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: tricky.IdempotencyKey}
	mismatch := chargeReq("k-1")
	mismatch.Amount = 2999
	declined := chargeReq("k-decline")
	declined.PaymentMethod = "pm_card_chargeDeclinedInsufficientFunds"
	badAmount, badCurrency, noCurrency, badPM, noPM := chargeReq("k-bad"), chargeReq("k-bad"), chargeReq("k-bad"), chargeReq("k-bad"), chargeReq("k-bad")
	badAmount.Amount = -5
	badCurrency.Currency = "USD"
	noCurrency.Currency = ""
	badPM.PaymentMethod = "card_123"
	noPM.PaymentMethod = ""
	noDescription := chargeReq("k-desc")
	noDescription.Description = ""
	ctlKey := chargeReq("k-ctl")
	ctlKey.ProviderKey = "pdk_\x01ctl"
	emptyKey := chargeReq("k-empty")
	emptyKey.ProviderKey = ""
	double := chargeReq("k-double")
	doubleAgain := double
	doubleAgain.ProviderKey += "-again"

	steps := []parityStep{
		chargeStep("success", chargeReq("k-1"), none),
		chargeStep("replay", chargeReq("k-1"), none),
		chargeStep("mismatch", mismatch, none),
		chargeStep("tricky metadata", tricky, none),
		chargeStep("tricky replay", tricky, none),
		chargeStep("decline", declined, none),
		chargeStep("decline replay", declined, none),
		chargeStep("invalid amount", badAmount, none),
		chargeStep("invalid currency", badCurrency, none),
		chargeStep("missing currency", noCurrency, none),
		chargeStep("invalid payment method", badPM, none),
		chargeStep("missing payment method", noPM, none),
		chargeStep("fixed after invalid", chargeReq("k-bad"), none),
		chargeStep("no description", noDescription, none),
		chargeStep("description added is a mismatch", chargeReq("k-desc"), none),
		chargeStep("429", chargeReq("k-faults"), stripesim.Faults{Rate429: 1}),
		chargeStep("5xx", chargeReq("k-faults"), stripesim.Faults{Rate5xx: 1}),
		chargeStep("fail before charge", chargeReq("k-faults"), stripesim.Faults{RateFailBeforeCharge: 1}),
		chargeStep("drop after charge", chargeReq("k-faults"), stripesim.Faults{RateDropAfterCharge: 1}),
		chargeStep("replay after drop", chargeReq("k-faults"), none),
		chargeStep("mixed faults 1", chargeReq("k-mixed"), stripesim.Faults{Rate429: 0.3, Rate5xx: 0.3, RateDropAfterCharge: 0.3, Jitter: time.Millisecond}),
		chargeStep("mixed faults 2", chargeReq("k-mixed"), stripesim.Faults{Rate429: 0.3, Rate5xx: 0.3, RateDropAfterCharge: 0.3, Jitter: time.Millisecond}),
		chargeStep("mixed faults 3", chargeReq("k-mixed"), stripesim.Faults{Rate429: 0.3, Rate5xx: 0.3, RateDropAfterCharge: 0.3, Jitter: time.Millisecond}),
		chargeStep("mixed faults 4", chargeReq("k-mixed"), stripesim.Faults{Rate429: 0.3, Rate5xx: 0.3, RateDropAfterCharge: 0.3, Jitter: time.Millisecond}),
		{name: "latency past the deadline", faults: stripesim.Faults{Latency: time.Minute}, timeout: 50 * time.Millisecond, charge: &ctlKey},
		chargeStep("key not a header value", ctlKey, none),
		chargeStep("empty key", emptyKey, none),
		chargeStep("double 1", double, none),
		chargeStep("double 2", doubleAgain, none),

		lookupStep("inside the search lag", provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-1"}, none),
		{name: "after the search lag", advance: time.Minute, lookup: &provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-1"}},
		lookupStep("decline", provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-decline"}, none),
		lookupStep("tricky", trickyLookup, none),
		lookupStep("unknown key", provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-never"}, none),
		lookupStep("multiple charges", provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-double"}, none),
		lookupStep("no idempotency key", provider.LookupRequest{MerchantID: "m_123"}, none),
		lookupStep("stale id", provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-1", ChargeID: "pi_unknown"}, none),
		lookupStep(`id "search"`, provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-1", ChargeID: "search"}, none),
		lookupStep(`id "."`, provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-1", ChargeID: "."}, none),
		lookupStep(`id ".."`, provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-1", ChargeID: ".."}, none),
		lookupStep("429", provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-1"}, stripesim.Faults{Rate429: 1}),
		lookupStep("5xx", provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-1"}, stripesim.Faults{Rate5xx: 1}),
		lookupStep("fail before", provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-1"}, stripesim.Faults{RateFailBeforeCharge: 1}),
		chargeStep("key TTL not yet passed", chargeReq("k-1"), none),
		{name: "key TTL passed", advance: stripesim.DefaultKeyTTL, charge: ptr(chargeReq("k-1"))},
	}
	// Steps that need an id from an earlier answer are added as they run.
	var byID []parityStep
	ids := map[string]string{}
	run := func(steps []parityStep) {
		for _, st := range steps {
			a, b := st.runOn(t, httpPath), st.runOn(t, direct)
			a.compare(t, st.name, b)
			if a.out != nil && a.out.ChargeID != "" && st.charge != nil {
				ids[st.charge.IdempotencyKey] = a.out.ChargeID
			}
		}
	}
	run(steps)
	for key, id := range ids {
		byID = append(byID,
			lookupStep("by id "+key, provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: key, ChargeID: id}, none),
			lookupStep("by id of another key "+key, provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-other", ChargeID: id}, none),
			lookupStep("by id, 429 "+key, provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: key, ChargeID: id}, stripesim.Faults{Rate429: 1}),
		)
	}
	run(byID)

	// Many declines under one key: search pages (100 a page), one fault
	// roll each.
	many := chargeReq("k-many")
	many.PaymentMethod = "pm_card_chargeDeclined"
	var paging []parityStep
	for i := range 105 {
		req := many
		req.ProviderKey = fmt.Sprintf("pdk_many_%d", i)
		paging = append(paging, chargeStep("many "+strconv.Itoa(i), req, none))
	}
	paging = append(paging, parityStep{name: "paged search", advance: time.Minute,
		lookup: &provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-many"}})
	run(paging)

	if a, b := httpPath.sim.Ledger(), direct.sim.Ledger(); !reflect.DeepEqual(a, b) {
		t.Fatalf("ledgers differ:\nhttp   %+v\ndirect %+v", a, b)
	}
	if len(httpPath.sim.Charges()) == 0 {
		t.Fatal("nothing was charged")
	}
}

func ptr[T any](v T) *T { return &v }

// parityResult is what one call returned.
type parityResult struct {
	out *provider.Outcome
	res provider.LookupResult
	err error
}

func (st parityStep) runOn(t *testing.T, path parityPath) parityResult {
	t.Helper()
	if err := path.sim.SetFaults(st.faults); err != nil {
		t.Fatal(err)
	}
	path.clk.Advance(st.advance)
	ctx := context.Background()
	if st.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, st.timeout)
		defer cancel()
	}
	var r parityResult
	if st.charge != nil {
		r.out, r.err = path.p.Charge(ctx, *st.charge)
	} else {
		r.res, r.err = path.p.Lookup(ctx, *st.lookup)
	}
	return r
}

// compare fails unless b is what a is. Errors that came with no answer
// (transport errors) differ in their text (an URL, or not), so they are
// compared by class and by the context error they carry.
func (a parityResult) compare(t *testing.T, step string, b parityResult) {
	t.Helper()
	if !reflect.DeepEqual(a.out, b.out) || !reflect.DeepEqual(a.res, b.res) {
		t.Fatalf("%s: outcomes differ:\nhttp   %s %s\ndirect %s %s", step, fmtOutcome(a.out), fmtOutcome(a.res.Outcome),
			fmtOutcome(b.out), fmtOutcome(b.res.Outcome))
	}
	if (a.err == nil) != (b.err == nil) {
		t.Fatalf("%s: errors differ: http %v, direct %v", step, a.err, b.err)
	}
	if a.err == nil {
		return
	}
	var pa, pb *provider.Error
	if !errors.As(a.err, &pa) || !errors.As(b.err, &pb) {
		t.Fatalf("%s: not *provider.Error: http %v, direct %v", step, a.err, b.err)
	}
	if pa.Class != pb.Class || pa.HTTPStatus != pb.HTTPStatus || pa.Type != pb.Type || pa.Code != pb.Code ||
		pa.Message != pb.Message || pa.RetryAfter != pb.RetryAfter || (pa.Err == nil) != (pb.Err == nil) ||
		errors.Is(a.err, context.DeadlineExceeded) != errors.Is(b.err, context.DeadlineExceeded) {
		t.Fatalf("%s: errors differ:\nhttp   %+v (%v)\ndirect %+v (%v)", step, pa, a.err, pb, b.err)
	}
	if pa.Err == nil && a.err.Error() != b.err.Error() {
		t.Fatalf("%s: errors differ:\nhttp   %v\ndirect %v", step, a.err, b.err)
	}
}

func fmtOutcome(o *provider.Outcome) string {
	if o == nil {
		return "<nil>"
	}
	r := *o
	r.Response = nil
	return fmt.Sprintf("%+v %s", r, o.Response)
}

// TestSimClientCrossPathReplay uses one simulator through both paths with
// the same API key: a key first used by one replays to the other.
func TestSimClientCrossPathReplay(t *testing.T) {
	t.Parallel()
	sim, srv := simServer(t, stripesim.Config{})
	adapter := newStripe(t, stripe.Config{SecretKey: "sk_test_cross", APIBase: srv.URL})
	client := sim.Client("sk_test_cross")

	tricky := chargeReq("k-cross-tricky")
	tricky.Metadata = map[string]string{"a": "1", "a1": "2", "a b": "3", "x]y": "[]", "é": "\xff", "+&=": "%"}
	declined := chargeReq("k-cross-decline")
	declined.PaymentMethod = "pm_card_chargeDeclined"
	for _, req := range []provider.ChargeRequest{chargeReq("k-cross"), tricky, declined} {
		for _, order := range []struct {
			name          string
			first, second provider.Provider
		}{{"adapter then client", adapter, client}, {"client then adapter", client, adapter}} {
			req := req
			req.ProviderKey += "-" + strings.ReplaceAll(order.name, " ", "-")
			first := mustCharge(t, order.first, req)
			second := mustCharge(t, order.second, req)
			if first.Replayed || !second.Replayed {
				t.Fatalf("%s %s: replayed first %v, second %v", order.name, req.IdempotencyKey, first.Replayed, second.Replayed)
			}
			second.Replayed = false
			if !reflect.DeepEqual(first, second) {
				t.Fatalf("%s %s: replay differs:\nfirst  %+v\nsecond %+v", order.name, req.IdempotencyKey, first, second)
			}
			other := req
			other.Amount++
			_, err := order.second.Charge(context.Background(), other)
			wantClass(t, err, provider.ClassMismatch)
		}
	}
	wantCharges(t, sim, "k-cross", 2)
	wantCharges(t, sim, "k-cross-tricky", 2)

	// What one path charged, the other looks up, in the same account only.
	res, err := client.Lookup(context.Background(), provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-cross-decline"})
	if err != nil || !res.Found || !res.Outcome.Declined {
		t.Fatalf("lookup = %+v, %v", res, err)
	}
	res, err = sim.Client("sk_test_other").Lookup(context.Background(), provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-cross-decline"})
	if err != nil || res.Found {
		t.Fatalf("other account's lookup = %+v, %v", res, err)
	}
}

// TestSimClientKeyInFlightAcrossPaths holds an HTTP charge in OnCharge: the
// client meets its key in flight.
func TestSimClientKeyInFlightAcrossPaths(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{})
	release := make(chan struct{})
	sim, srv := simServer(t, stripesim.Config{OnCharge: func(stripesim.Charge) {
		close(entered)
		<-release
	}})
	adapter := newStripe(t, stripe.Config{SecretKey: "sk_test_cross", APIBase: srv.URL})
	req := chargeReq("k-held")
	done := make(chan *provider.Outcome, 1)
	go func() {
		out, err := adapter.Charge(context.Background(), req)
		if err != nil {
			t.Error(err)
		}
		done <- out
	}()
	<-entered
	_, err := sim.Client("sk_test_cross").Charge(context.Background(), req)
	if pe := wantClass(t, err, provider.ClassUnknown); pe.HTTPStatus != http.StatusConflict || pe.Code != "idempotency_key_in_use" {
		t.Fatalf("error = %+v", pe)
	}
	close(release)
	first := <-done
	again := mustCharge(t, sim.Client("sk_test_cross"), req)
	if first == nil || !again.Replayed || again.ChargeID != first.ChargeID {
		t.Fatalf("first %+v, again %+v", first, again)
	}
}

// inProcess is an http.RoundTripper that serves requests with the
// simulator's handler directly, as `paydedup bench` did before Client.
type inProcess struct{ h http.Handler }

func (t inProcess) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r)
	resp := rec.Result()
	resp.Request = r
	return resp, nil
}

// BenchmarkSimClientCharge charges through Client: what a charge costs the
// simulator itself.
func BenchmarkSimClientCharge(b *testing.B) {
	sim := stripesim.New(stripesim.Config{Seed: 1})
	benchmarkCharges(b, sim, sim.Client("sk_test_bench"))
}

// BenchmarkStripeAdapterInProcess charges through the Stripe adapter over an
// in-memory RoundTripper: stripe-go, form encoding, the HTTP handler and JSON
// decoding, without a network.
func BenchmarkStripeAdapterInProcess(b *testing.B) {
	sim := stripesim.New(stripesim.Config{Seed: 1})
	s, err := stripe.New(stripe.Config{SecretKey: "sk_test_bench", APIBase: "http://sim.invalid",
		HTTPClient: &http.Client{Transport: inProcess{sim}}})
	if err != nil {
		b.Fatal(err)
	}
	benchmarkCharges(b, sim, s)
}

// benchmarkCharges makes b.N charges of distinct keys, like a worker's, and
// reports the heap the simulator keeps per charge (every intent and key).
func benchmarkCharges(b *testing.B, sim *stripesim.Simulator, p provider.Provider) {
	keys := make([]string, b.N)
	for i := range keys {
		keys[i] = "0190f5a2-7c1e-7d3b-9a4e-" + fmt.Sprintf("%012d", i)
	}
	req := provider.ChargeRequest{
		MerchantID: "m_bench", Amount: 1999, Currency: "usd", PaymentMethod: "pm_card_visa",
		Description: "order 42", Metadata: map[string]string{"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"},
	}
	ctx := context.Background()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		req.IdempotencyKey = keys[i]
		req.ProviderKey = keys[i]
		if _, err := p.Charge(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(b.N), "retained-B/charge")
	if n := len(sim.Charges()); n != b.N {
		b.Fatalf("%d charges, want %d", n, b.N)
	}
}
