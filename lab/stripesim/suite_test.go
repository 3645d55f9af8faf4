package stripesim_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/providertest"
	"github.com/paydedup/paydedup/provider"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider/stripe"
)

// newProviderFunc builds the Provider under test for a scenario's simulator
// sim, which is also served over HTTP at baseURL: an HTTP implementation uses
// baseURL, Client uses sim. The suite below runs against any
// implementation through it (watermill's TestPubSub style); the simulator is
// the provider on the other end, and its ledger is the ground truth. sim is
// nil when baseURL serves nothing (see suiteCaps.transport).
type newProviderFunc func(t *testing.T, sim *stripesim.Simulator, baseURL string) provider.Provider

func newStripe(t *testing.T, cfg stripe.Config) *stripe.Client {
	t.Helper()
	if cfg.SecretKey == "" {
		cfg.SecretKey = "sk_test_paydedup"
	}
	s, err := stripe.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Registered after the server's Close, so it runs first: no client
	// connection goroutine outlives the test (goleak).
	t.Cleanup(s.CloseIdleConnections)
	return s
}

// TestStripeAgainstSimulator runs the behavioural suite through the Stripe
// adapter (stripe-go, real HTTP) against the in-process simulator.
func TestStripeAgainstSimulator(t *testing.T) {
	t.Parallel()
	runProviderSuite(t, func(t *testing.T, _ *stripesim.Simulator, baseURL string) provider.Provider {
		return newStripe(t, stripe.Config{APIBase: baseURL})
	}, suiteCaps{transport: true})
}

// suiteCaps says which scenarios of the suite apply to an implementation.
type suiteCaps struct {
	// transport is set for an implementation that reaches the provider over
	// a network, so that it must classify the network's own failures (a
	// refused connection). Client has no connection to refuse; it stands
	// in for the network failures a simulator injects, which the other
	// scenarios cover.
	transport bool
}

// suiteEnv is one scenario's simulator, server and provider.
type suiteEnv struct {
	sim *stripesim.Simulator
	url string
	p   provider.Provider
}

func setupSuite(t *testing.T, newProvider newProviderFunc, cfg stripesim.Config) *suiteEnv {
	t.Helper()
	if cfg.Seed == 0 {
		cfg.Seed = 42
	}
	sim := stripesim.New(cfg)
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	return &suiteEnv{sim: sim, url: srv.URL, p: newProvider(t, sim, srv.URL)}
}

func (e *suiteEnv) setFaults(t *testing.T, f stripesim.Faults) {
	t.Helper()
	if err := e.sim.SetFaults(f); err != nil {
		t.Fatal(err)
	}
}

func wantCharges(t *testing.T, sim *stripesim.Simulator, key string, n int) {
	t.Helper()
	if got := sim.ChargesByKey()["m_123:"+key]; got != n {
		t.Fatalf("ledger charges for %s = %d, want %d (ledger: %+v)", key, got, n, sim.Ledger())
	}
}

// runProviderSuite is the behavioural suite every Provider must pass, each
// scenario that caps says applies to it.
func runProviderSuite(t *testing.T, newProvider newProviderFunc, caps suiteCaps) {
	type scenario struct {
		name string
		fn   func(t *testing.T, newProvider newProviderFunc)
	}
	tests := []scenario{
		{"Success", testSuccess},
		{"ReplaySameKey", testReplaySameKey},
		{"Mismatch", testMismatch},
		{"DeclineSavedAndReplayed", testDecline},
		{"InvalidRequestNotSaved", testInvalidRequestNotSaved},
		{"ConcurrentSameKey", testConcurrentSameKey},
		{"DropAfterChargeThenRetry", testDropAfterCharge},
		{"FailBeforeCharge", testFailBeforeCharge},
		{"ServerError", testServerError},
		{"RateLimited", testRateLimited},
		{"ClientTimeout", testClientTimeout},
		{"LookupCharge", testLookupCharge},
		{"LookupDecline", testLookupDecline},
		{"LookupUnknownKey", testLookupUnknownKey},
		{"LookupStaleChargeID", testLookupStaleChargeID},
		{"LookupFaults", testLookupFaults},
		{"LookupMultipleCharges", testLookupMultipleCharges},
		{"LookupQuotedKey", testLookupQuotedKey},
		{"LookupSearchLag", testLookupSearchLag},
		{"OffSessionAuthenticationRequired", testOffSessionAuthenticationRequired},
		{"OnSessionRequiresActionIsCanceled", testOnSessionRequiresActionIsCanceled},
		{"ProcessingThenSettles", testProcessingThenSettles},
		{"DeclineKeepsStripeCodes", testDeclineKeepsStripeCodes},
		{"LookupForeignIntent", testLookupForeignIntent},
		{"AuthorizeIsNotACharge", testAuthorizeIsNotACharge},
	}
	if caps.transport {
		tests = append(tests, scenario{"ConnectionRefused", testConnectionRefused})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, newProvider)
		})
	}
}

func testSuccess(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{})
	req := chargeReq("k-success")
	req.Metadata["merchant_id"] = "m_evil" // ours must win
	out := mustCharge(t, env.p, req)

	if !strings.HasPrefix(out.ChargeID, "pi_") || out.Status != "succeeded" || out.Declined ||
		out.HTTPStatus != 200 || out.Replayed {
		t.Fatalf("outcome = %+v", out)
	}
	var body struct {
		ID       string            `json:"id"`
		Amount   int64             `json:"amount"`
		Metadata map[string]string `json:"metadata"`
	}
	if err := json.Unmarshal(out.Response, &body); err != nil {
		t.Fatalf("response is not JSON: %v", err)
	}
	if body.ID != out.ChargeID || body.Amount != 1999 {
		t.Fatalf("response = %s", out.Response)
	}
	want := map[string]string{"order_id": "42", "merchant_id": "m_123", "idempotency_key": "k-success"}
	for k, v := range want {
		if body.Metadata[k] != v {
			t.Fatalf("metadata[%s] = %q, want %q (all: %v)", k, body.Metadata[k], v, body.Metadata)
		}
	}
	charges := env.sim.Charges()
	if len(charges) != 1 || charges[0].ID != out.ChargeID || charges[0].ProviderKey != req.ProviderKey ||
		charges[0].Amount != 1999 || charges[0].Currency != "usd" {
		t.Fatalf("ledger = %+v", charges)
	}
}

func testReplaySameKey(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{})
	req := chargeReq("k-replay")
	first := mustCharge(t, env.p, req)
	second := mustCharge(t, env.p, req)
	if !second.Replayed || first.Replayed {
		t.Fatalf("replayed: first %v, second %v", first.Replayed, second.Replayed)
	}
	if second.ChargeID != first.ChargeID || string(second.Response) != string(first.Response) {
		t.Fatalf("replay differs: %s vs %s", first.Response, second.Response)
	}
	wantCharges(t, env.sim, "k-replay", 1)
}

func testMismatch(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{})
	req := chargeReq("k-mismatch")
	mustCharge(t, env.p, req)
	req.Amount = 2999
	_, err := env.p.Charge(context.Background(), req)
	pe := wantClass(t, err, provider.ClassMismatch)
	if pe.HTTPStatus != 400 || pe.Type != "idempotency_error" {
		t.Fatalf("error = %+v", pe)
	}
	wantCharges(t, env.sim, "k-mismatch", 1)
}

func testDecline(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{})
	req := chargeReq("k-decline")
	req.PaymentMethod = "pm_card_chargeDeclined"
	first := mustCharge(t, env.p, req)
	if !first.Declined || first.DeclineCode != "generic_decline" || first.HTTPStatus != 402 ||
		!strings.HasPrefix(first.ChargeID, "pi_") || first.Status != "requires_payment_method" || first.Replayed {
		t.Fatalf("outcome = %+v", first)
	}
	var body struct {
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal(first.Response, &body); err != nil || body.Error.Type != "card_error" {
		t.Fatalf("response = %s (%v)", first.Response, err)
	}
	second := mustCharge(t, env.p, req)
	if !second.Declined || !second.Replayed || second.ChargeID != first.ChargeID ||
		string(second.Response) != string(first.Response) {
		t.Fatalf("replayed decline = %+v", second)
	}
	if env.sim.Declines() != 1 || len(env.sim.Charges()) != 0 {
		t.Fatalf("ledger = %+v", env.sim.Ledger())
	}
}

func testInvalidRequestNotSaved(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{})
	req := chargeReq("k-invalid")
	req.Amount = 0
	// A rejection, not a decline: our request is wrong, not the card.
	_, err := env.p.Charge(context.Background(), req)
	pe := wantClass(t, err, provider.ClassRejected)
	if pe.HTTPStatus != 400 || pe.Code != "parameter_invalid_integer" {
		t.Fatalf("error = %+v", pe)
	}
	// Nothing was saved under the key, so a corrected request is not a
	// mismatch: it charges.
	req.Amount = 1999
	fixed := mustCharge(t, env.p, req)
	if fixed.Declined || fixed.Replayed {
		t.Fatalf("outcome = %+v", fixed)
	}
	wantCharges(t, env.sim, "k-invalid", 1)
}

func testConcurrentSameKey(t *testing.T, newProvider newProviderFunc) {
	const n = 50
	release := make(chan struct{})
	var charged atomic.Int32
	env := setupSuite(t, newProvider, stripesim.Config{
		// Hold the first charge in flight until every other call has
		// returned, so they all meet the key in flight (409).
		OnCharge: func(stripesim.Charge) {
			charged.Add(1)
			<-release
		},
	})
	req := chargeReq("k-concurrent")
	type result struct {
		out *provider.Outcome
		err error
	}
	results := make(chan result, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := env.p.Charge(context.Background(), req)
			results <- result{out, err}
		}()
	}
	var ids = map[string]bool{}
	var inUse int
	for i := range n {
		if i == n-1 {
			close(release) // only the charging call is still out
		}
		r := <-results
		switch {
		case r.err != nil:
			pe := wantClass(t, r.err, provider.ClassUnknown)
			if pe.HTTPStatus != 409 || pe.Code != "idempotency_key_in_use" {
				t.Fatalf("error = %+v", pe)
			}
			inUse++
		case r.out.Declined:
			t.Fatalf("outcome = %+v", r.out)
		default:
			ids[r.out.ChargeID] = true
		}
	}
	wg.Wait()
	if len(ids) != 1 || inUse != n-1 || charged.Load() != 1 {
		t.Fatalf("ids %v, in use %d, charged %d", ids, inUse, charged.Load())
	}
	// The callers that met 409 retry and get the same intent, replayed.
	again := mustCharge(t, env.p, req)
	if !again.Replayed || !ids[again.ChargeID] {
		t.Fatalf("retry = %+v, want replay of %v", again, ids)
	}
	wantCharges(t, env.sim, "k-concurrent", 1)
}

func testDropAfterCharge(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{Faults: stripesim.Faults{RateDropAfterCharge: 1}})
	req := chargeReq("k-drop")
	_, err := env.p.Charge(context.Background(), req)
	wantClass(t, err, provider.ClassUnknown)
	charges := env.sim.Charges()
	if len(charges) != 1 {
		t.Fatalf("ledger = %+v, want the dropped charge", charges)
	}

	env.setFaults(t, stripesim.Faults{})
	out := mustCharge(t, env.p, req)
	if out.ChargeID != charges[0].ID || !out.Replayed {
		t.Fatalf("retry = %+v, want replay of %s", out, charges[0].ID)
	}
	wantCharges(t, env.sim, "k-drop", 1)
}

func testFailBeforeCharge(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{Faults: stripesim.Faults{RateFailBeforeCharge: 1}})
	req := chargeReq("k-failbefore")
	_, err := env.p.Charge(context.Background(), req)
	// The client cannot tell this from a drop after charging.
	wantClass(t, err, provider.ClassUnknown)
	wantCharges(t, env.sim, "k-failbefore", 0)

	env.setFaults(t, stripesim.Faults{})
	out := mustCharge(t, env.p, req)
	if out.Replayed {
		t.Fatalf("outcome = %+v, want a first charge", out)
	}
	wantCharges(t, env.sim, "k-failbefore", 1)
}

func testServerError(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{Faults: stripesim.Faults{Rate5xx: 1}})
	_, err := env.p.Charge(context.Background(), chargeReq("k-5xx"))
	pe := wantClass(t, err, provider.ClassUnknown)
	if pe.HTTPStatus != 500 || pe.Type != "api_error" {
		t.Fatalf("error = %+v", pe)
	}
	wantCharges(t, env.sim, "k-5xx", 0)
}

func testRateLimited(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{Faults: stripesim.Faults{Rate429: 1}})
	_, err := env.p.Charge(context.Background(), chargeReq("k-429"))
	pe := wantClass(t, err, provider.ClassRetryable)
	if pe.HTTPStatus != 429 || pe.RetryAfter != time.Second {
		t.Fatalf("error = %+v", pe)
	}
	wantCharges(t, env.sim, "k-429", 0)
}

func testConnectionRefused(t *testing.T, newProvider newProviderFunc) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, nil, "http://"+addr)
	_, err = p.Charge(context.Background(), chargeReq("k-refused"))
	pe := wantClass(t, err, provider.ClassRetryable)
	if pe.HTTPStatus != 0 || pe.Err == nil {
		t.Fatalf("error = %+v", pe)
	}
	_, err = p.Lookup(context.Background(), provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-refused"})
	wantClass(t, err, provider.ClassRetryable)
}

func testClientTimeout(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{Faults: stripesim.Faults{Latency: time.Minute}})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := env.p.Charge(ctx, chargeReq("k-timeout"))
	wantClass(t, err, provider.ClassUnknown)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want it to wrap context.DeadlineExceeded", err)
	}
}

func testLookupCharge(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{})
	req := chargeReq("k-lookup")
	charged := mustCharge(t, env.p, req)
	mustCharge(t, env.p, chargeReq("k-lookup-other"))

	bySearch, err := env.p.Lookup(context.Background(), provider.LookupRequest{
		ProviderKey: req.ProviderKey, MerchantID: "m_123", IdempotencyKey: "k-lookup"})
	if err != nil {
		t.Fatal(err)
	}
	byID, err := env.p.Lookup(context.Background(), provider.LookupRequest{
		ProviderKey: req.ProviderKey, MerchantID: "m_123", IdempotencyKey: "k-lookup", ChargeID: charged.ChargeID})
	if err != nil {
		t.Fatal(err)
	}
	for name, res := range map[string]provider.LookupResult{"search": bySearch, "id": byID} {
		if !res.Found || res.Outcome == nil || res.Outcome.ChargeID != charged.ChargeID ||
			res.Outcome.Declined || res.Outcome.Status != "succeeded" || res.Outcome.HTTPStatus != 200 {
			t.Fatalf("lookup by %s = %+v (%+v)", name, res, res.Outcome)
		}
	}

	// A charge id that belongs to another key is never taken for this one.
	_, err = env.p.Lookup(context.Background(), provider.LookupRequest{
		MerchantID: "m_123", IdempotencyKey: "k-lookup-other", ChargeID: charged.ChargeID})
	wantClass(t, err, provider.ClassUnknown)
}

func testLookupDecline(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{})
	req := chargeReq("k-lookup-decline")
	req.PaymentMethod = "pm_card_chargeDeclined"
	declined := mustCharge(t, env.p, req)

	res, err := env.p.Lookup(context.Background(), provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-lookup-decline"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Found || !res.Outcome.Declined || res.Outcome.ChargeID != declined.ChargeID ||
		res.Outcome.DeclineCode != "generic_decline" || res.Outcome.HTTPStatus != 402 {
		t.Fatalf("lookup = %+v (%+v)", res, res.Outcome)
	}
	// The stored response has the shape of the 402 error the charge got.
	var body struct {
		Error struct {
			Type          string `json:"type"`
			DeclineCode   string `json:"decline_code"`
			PaymentIntent struct {
				ID string `json:"id"`
			} `json:"payment_intent"`
		} `json:"error"`
	}
	if err := json.Unmarshal(res.Outcome.Response, &body); err != nil ||
		body.Error.Type != "card_error" || body.Error.DeclineCode != "generic_decline" ||
		body.Error.PaymentIntent.ID != declined.ChargeID {
		t.Fatalf("response = %s (%v)", res.Outcome.Response, err)
	}
}

func testLookupUnknownKey(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{})
	mustCharge(t, env.p, chargeReq("k-known"))
	res, err := env.p.Lookup(context.Background(), provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-never"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Found || res.Outcome != nil {
		t.Fatalf("lookup = %+v", res)
	}
	// Same key, other merchant: keys are scoped by merchant.
	res, err = env.p.Lookup(context.Background(), provider.LookupRequest{MerchantID: "m_other", IdempotencyKey: "k-known"})
	if err != nil || res.Found {
		t.Fatalf("lookup = %+v, %v", res, err)
	}
}

func testLookupStaleChargeID(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{})
	charged := mustCharge(t, env.p, chargeReq("k-stale-id"))
	// An id the provider does not know falls back to the search by key.
	res, err := env.p.Lookup(context.Background(), provider.LookupRequest{
		MerchantID: "m_123", IdempotencyKey: "k-stale-id", ChargeID: "pi_unknown"})
	if err != nil || !res.Found || res.Outcome.ChargeID != charged.ChargeID {
		t.Fatalf("lookup = %+v, %v", res, err)
	}
}

func testLookupFaults(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{})
	charged := mustCharge(t, env.p, chargeReq("k-lookup-faults"))
	for _, tt := range []struct {
		faults stripesim.Faults
		want   provider.Class
	}{
		{stripesim.Faults{Rate5xx: 1}, provider.ClassUnknown},
		{stripesim.Faults{Rate429: 1}, provider.ClassRetryable},
		{stripesim.Faults{RateFailBeforeCharge: 1}, provider.ClassUnknown},
	} {
		env.setFaults(t, tt.faults)
		for _, id := range []string{"", charged.ChargeID} {
			_, err := env.p.Lookup(context.Background(), provider.LookupRequest{
				MerchantID: "m_123", IdempotencyKey: "k-lookup-faults", ChargeID: id})
			wantClass(t, err, tt.want)
		}
	}
}

func testLookupMultipleCharges(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{})
	// Two provider keys for one key: what a blind retry after the provider's
	// key window does. Lookup must surface it.
	first := chargeReq("k-double")
	second := first
	second.ProviderKey += "-again"
	mustCharge(t, env.p, first)
	mustCharge(t, env.p, second)
	_, err := env.p.Lookup(context.Background(), provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-double"})
	pe := wantClass(t, err, provider.ClassUnknown)
	if !strings.Contains(pe.Error(), "multiple charges") {
		t.Fatalf("err = %v, want it to say multiple charges", err)
	}
}

func testLookupQuotedKey(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{})
	tricky := `o'brien\' AND metadata['merchant_id']:'x`
	req := chargeReq(tricky)
	req.ProviderKey = "pdk_tricky"
	charged := mustCharge(t, env.p, req)
	mustCharge(t, env.p, chargeReq("o"))

	res, err := env.p.Lookup(context.Background(), provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: tricky})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Found || res.Outcome.ChargeID != charged.ChargeID {
		t.Fatalf("lookup = %+v", res)
	}
	res, err = env.p.Lookup(context.Background(), provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: `o'brien`})
	if err != nil || res.Found {
		t.Fatalf("prefix lookup = %+v, %v", res, err)
	}
}

func testLookupSearchLag(t *testing.T, newProvider newProviderFunc) {
	clk := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	env := setupSuite(t, newProvider, stripesim.Config{SearchLag: time.Minute, Now: clk.Now})
	charged := mustCharge(t, env.p, chargeReq("k-lag"))
	lookup := provider.LookupRequest{MerchantID: "m_123", IdempotencyKey: "k-lag"}

	res, err := env.p.Lookup(context.Background(), lookup)
	if err != nil || res.Found {
		t.Fatalf("lookup inside the search lag = %+v, %v; want not found yet", res, err)
	}
	lookup.ChargeID = charged.ChargeID
	if res, err = env.p.Lookup(context.Background(), lookup); err != nil || !res.Found {
		t.Fatalf("lookup by id = %+v, %v; retrieval is never lagged", res, err)
	}
	lookup.ChargeID = ""
	clk.Advance(time.Minute)
	if res, err = env.p.Lookup(context.Background(), lookup); err != nil || !res.Found ||
		res.Outcome.ChargeID != charged.ChargeID {
		t.Fatalf("lookup after the lag = %+v, %v", res, err)
	}
}

// The provider tests' shared helpers (lab/providertest).
var (
	chargeReq  = providertest.ChargeReq
	mustCharge = providertest.MustCharge
	wantClass  = providertest.WantClass
)
