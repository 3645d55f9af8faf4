package stripe_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/paydedup/paydedup/lab/providertest"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
)

// exchange is one request the adapter sent and what stripe-mock answered.
type exchange struct {
	method, path, idempotencyKey string
	status                       int
	body                         string
}

// mockProxy stands between the adapter and stripe-mock. It forwards every
// request unchanged (stripe-mock validates it against Stripe's OpenAPI
// spec), records the answer, and then, because stripe-mock answers with
// fixtures that know nothing of the request, makes every payment intent in
// a 200 answer look like the one the scenario needs (its metadata, amount,
// currency and status) before the adapter decodes it.
type mockProxy struct {
	t    *testing.T
	base string

	mu        sync.Mutex
	exchanges []exchange
	patch     func(path string, intent map[string]any)
}

func (p *mockProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	req, err := http.NewRequestWithContext(r.Context(), r.Method, p.base+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		p.t.Errorf("proxy: %v", err)
		return
	}
	req.Header = r.Header.Clone()
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		p.t.Errorf("proxy: %v", err)
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	p.mu.Lock()
	p.exchanges = append(p.exchanges, exchange{r.Method, r.URL.Path, r.Header.Get("Idempotency-Key"), resp.StatusCode, string(answer)})
	patch := p.patch
	p.mu.Unlock()
	if resp.StatusCode == http.StatusOK && patch != nil {
		var obj map[string]any
		if err := json.Unmarshal(answer, &obj); err != nil {
			p.t.Errorf("stripe-mock answered %s %s with no JSON object: %v", r.Method, r.URL.Path, err)
		}
		if data, ok := obj["data"].([]any); ok {
			for _, d := range data {
				if in, ok := d.(map[string]any); ok {
					patch(r.URL.Path, in)
				}
			}
		} else if obj["object"] == "payment_intent" || obj["object"] == "refund" {
			patch(r.URL.Path, obj)
		}
		answer, _ = json.Marshal(obj)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(answer)
}

func (p *mockProxy) take() []exchange {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.exchanges
	p.exchanges = nil
	return out
}

func (p *mockProxy) setPatch(f func(path string, intent map[string]any)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.patch = f
}

// ours makes a fixture intent the one req created, with status (its
// cancel answering canceled).
func ours(req provider.ChargeRequest, status string) func(string, map[string]any) {
	return func(path string, in map[string]any) {
		in["metadata"] = map[string]any{provider.MetadataMerchantID: req.MerchantID, provider.MetadataIdempotencyKey: req.IdempotencyKey}
		in["amount"], in["currency"], in["status"], in["last_payment_error"] = req.Amount, req.Currency, status, nil
		if strings.HasSuffix(path, "/cancel") {
			in["status"] = "canceled"
		}
	}
}

// TestStripeConformsToStripeAPI drives every request the adapter builds
// (create, retrieve, search, cancel) against stripe-mock: each must be
// accepted by Stripe's published OpenAPI spec (stripe-mock answers 400 to
// a request that breaks it), and each answer must decode into an outcome.
// stripe-mock is stateless, so idempotency is the simulator's to test.
func TestStripeConformsToStripeAPI(t *testing.T) {
	t.Parallel()
	proxy := &mockProxy{t: t, base: stripeMockURL(t)}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	s := newStripe(t, stripe.Config{APIBase: srv.URL, SecretKey: "sk_test_123"})
	ctx := context.Background()

	wantSent := func(t *testing.T, want ...string) []exchange {
		t.Helper()
		got := proxy.take()
		var sent []string
		for _, x := range got {
			sent = append(sent, x.method+" "+x.path)
			if x.status != http.StatusOK {
				t.Errorf("stripe-mock refused %s %s: %d %s", x.method, x.path, x.status, x.body)
			}
		}
		if strings.Join(sent, "; ") != strings.Join(want, "; ") {
			t.Fatalf("requests sent: %q, want %q", sent, want)
		}
		return got
	}

	// Create, off-session (the default) and on-session, with and without
	// a description: succeeded and processing answers.
	for _, tt := range []struct {
		name, status string
		onSession    bool
		description  string
	}{
		{"off-session", "succeeded", false, "order 42"},
		{"on-session", "succeeded", true, ""},
		{"processing", "processing", false, "order 43"},
	} {
		req := chargeReq("k-conform-" + tt.name)
		req.OnSession, req.Description = tt.onSession, tt.description
		proxy.setPatch(ours(req, tt.status))
		out, err := s.Charge(ctx, req)
		if err != nil || out.ChargeID == "" || out.Declined || out.Processing != (tt.status == "processing") {
			t.Fatalf("%s: charge = %+v, %v", tt.name, out, err)
		}
		x := wantSent(t, "POST /v1/payment_intents")
		if x[0].idempotencyKey != req.ProviderKey {
			t.Fatalf("%s: create sent under key %q", tt.name, x[0].idempotencyKey)
		}
	}

	// requires_action: the create, then the cancel under its own key.
	req := chargeReq("k-conform-3ds")
	req.OnSession = true
	proxy.setPatch(ours(req, "requires_action"))
	out, err := s.Charge(ctx, req)
	if err != nil || !out.Declined || out.DeclineCode != provider.DeclineAuthenticationRequired {
		t.Fatalf("requires_action: charge = %+v, %v", out, err)
	}
	x := wantSent(t, "POST /v1/payment_intents", "POST /v1/payment_intents/"+out.ChargeID+"/cancel")
	if x[1].idempotencyKey != provider.CancelKey(req.ProviderKey, out.ChargeID) {
		t.Fatalf("cancel sent under key %q", x[1].idempotencyKey)
	}

	// Retrieve by id, and search then retrieve each hit.
	req = chargeReq("k-conform-lookup")
	proxy.setPatch(ours(req, "succeeded"))
	lookup := provider.LookupRequest{ProviderKey: req.ProviderKey, MerchantID: req.MerchantID, IdempotencyKey: req.IdempotencyKey,
		ChargeID: "pi_conform", Amount: req.Amount, Currency: req.Currency}
	res, err := s.Lookup(ctx, lookup)
	if err != nil || !res.Found || res.Outcome.Declined {
		t.Fatalf("lookup by id = %+v, %v", res, err)
	}
	wantSent(t, "GET /v1/payment_intents/pi_conform")
	lookup.ChargeID = ""
	res, err = s.Lookup(ctx, lookup)
	if err != nil || !res.Found {
		t.Fatalf("lookup by search = %+v, %v", res, err)
	}
	wantSent(t, "GET /v1/payment_intents/search", "GET /v1/payment_intents/"+res.Outcome.ChargeID)

	// Unpatched, the fixtures are someone else's intents: the lookup says
	// so rather than use them.
	proxy.setPatch(nil)
	_, err = s.Lookup(ctx, lookup)
	if !errors.Is(err, provider.ErrForeignIntent) {
		t.Fatalf("lookup over fixtures: %v, want ErrForeignIntent", err)
	}
	wantSent(t, "GET /v1/payment_intents/search")
}

// TestStripeLifecycleConformsToStripeAPI runs the lifecycle suite
// (lab/providertest) through the adapter against stripe-mock: every
// request of the operations after a charge (authorize, capture, cancel,
// retrieve, refund, the refunds' list) must be accepted by Stripe's
// OpenAPI spec, each POST must carry its own idempotency key, and each
// answer must decode into an outcome. stripe-mock answers fixtures, so
// the suite's stateful scenarios (refusals, replays, expiry, the lookups
// after a lost answer) run against the simulator only
// (lab/stripesim's TestLifecycleAgainstSimulator).
func TestStripeLifecycleConformsToStripeAPI(t *testing.T) {
	t.Parallel()
	base := stripeMockURL(t)
	providertest.RunLifecycleSuite(t, func(t *testing.T, _ stripesim.Config) *providertest.LifecycleTarget {
		proxy := &mockProxy{t: t, base: base}
		srv := httptest.NewServer(proxy)
		t.Cleanup(srv.Close)
		return &providertest.LifecycleTarget{
			P:     newStripe(t, stripe.Config{APIBase: srv.URL, SecretKey: "sk_test_123"}),
			Shape: func(f func(map[string]any)) { proxy.setPatch(func(_ string, obj map[string]any) { f(obj) }) },
			Sent: func() []providertest.Sent {
				var sent []providertest.Sent
				for _, x := range proxy.take() {
					if x.status != http.StatusOK {
						t.Errorf("stripe-mock refused %s %s: %d %s", x.method, x.path, x.status, x.body)
					}
					sent = append(sent, providertest.Sent{Method: x.method, Path: x.path, IdempotencyKey: x.idempotencyKey})
				}
				return sent
			},
		}
	}, providertest.LifecycleCaps{})
}
