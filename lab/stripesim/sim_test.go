package stripesim_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/providertest"
	"github.com/paydedup/paydedup/provider"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider/stripe"
)

// rawResp is a response read whole.
type rawResp struct {
	status int
	header http.Header
	body   []byte
}

// post sends a form-encoded POST the way stripe-go does.
func post(t *testing.T, srv *httptest.Server, path, auth, key string, form url.Values) rawResp {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if auth != "" {
		req.Header.Set("Authorization", "Bearer "+auth)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return do(t, srv, req)
}

func get(t *testing.T, srv *httptest.Server, path, auth string) rawResp {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", "Bearer "+auth)
	}
	return do(t, srv, req)
}

func do(t *testing.T, srv *httptest.Server, req *http.Request) rawResp {
	t.Helper()
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return rawResp{resp.StatusCode, resp.Header, body}
}

func intentForm(amount string) url.Values {
	return url.Values{
		"amount":                    {amount},
		"currency":                  {"usd"},
		"payment_method":            {"pm_card_visa"},
		"confirm":                   {"true"},
		"payment_method_types[0]":   {"card"},
		"metadata[merchant_id]":     {"m_1"},
		"metadata[idempotency_key]": {"k1"},
	}
}

type errBody struct {
	Error struct {
		Type  string `json:"type"`
		Code  string `json:"code"`
		Param string `json:"param"`
	} `json:"error"`
}

func decodeErr(t *testing.T, r rawResp) errBody {
	t.Helper()
	var e errBody
	if err := json.Unmarshal(r.body, &e); err != nil {
		t.Fatalf("error body %q: %v", r.body, err)
	}
	return e
}

func TestSimKeyExpiresAfterTTL(t *testing.T) {
	t.Parallel()
	// Stripe forgets an idempotency key after its window (24 h); the same key
	// then charges again. paydedup must never re-call blind past the window.
	clk := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	sim, srv := simServer(t, stripesim.Config{Now: clk.Now})
	s := newStripe(t, stripe.Config{APIBase: srv.URL})
	req := chargeReq("k-ttl")

	first := mustCharge(t, s, req)
	clk.Advance(stripesim.DefaultKeyTTL - time.Second)
	if again := mustCharge(t, s, req); !again.Replayed || again.ChargeID != first.ChargeID {
		t.Fatalf("inside the window: %+v, want replay of %s", again, first.ChargeID)
	}
	clk.Advance(time.Second)
	after := mustCharge(t, s, req)
	if after.Replayed || after.ChargeID == first.ChargeID {
		t.Fatalf("after the window: %+v, want a new charge", after)
	}
	wantCharges(t, sim, "k-ttl", 2)
}

func TestSimConfigurableKeyTTL(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	sim, srv := simServer(t, stripesim.Config{Now: clk.Now, KeyTTL: time.Hour})
	s := newStripe(t, stripe.Config{APIBase: srv.URL})
	mustCharge(t, s, chargeReq("k-ttl-1h"))
	clk.Advance(time.Hour)
	mustCharge(t, s, chargeReq("k-ttl-1h"))
	wantCharges(t, sim, "k-ttl-1h", 2)
}

func TestSimInvalidRequestNotSaved(t *testing.T) {
	t.Parallel()
	sim, srv := simServer(t, stripesim.Config{})
	for _, tt := range []struct {
		field, value, param string
	}{
		{"amount", "abc", "amount"},
		{"amount", "0", "amount"},
		{"amount", "-5", "amount"},
		{"amount", "12.5", "amount"},
		{"currency", "USD", "currency"},
		{"currency", "us", "currency"},
		{"payment_method", "card_123", "payment_method"},
		{"capture_method", "later", "capture_method"},
	} {
		form := intentForm("100")
		form.Set(tt.field, tt.value)
		r := post(t, srv, "/v1/payment_intents", "sk_test", "key-invalid", form)
		if e := decodeErr(t, r); r.status != 400 || e.Error.Type != "invalid_request_error" || e.Error.Param != tt.param {
			t.Fatalf("%s=%s: status %d, body %s", tt.field, tt.value, r.status, r.body)
		}
	}
	// Nothing was saved under the key: a valid request with it charges,
	// rather than replaying an error or failing as a mismatch.
	r := post(t, srv, "/v1/payment_intents", "sk_test", "key-invalid", intentForm("100"))
	if r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("valid request: status %d, body %s", r.status, r.body)
	}
	if len(sim.Charges()) != 1 {
		t.Fatalf("ledger = %+v", sim.Ledger())
	}
}

func TestSimRequiresAuth(t *testing.T) {
	t.Parallel()
	sim, srv := simServer(t, stripesim.Config{})
	for _, r := range []rawResp{
		post(t, srv, "/v1/payment_intents", "", "k", intentForm("100")),
		get(t, srv, "/v1/payment_intents/pi_x", ""),
		get(t, srv, "/v1/payment_intents/search?query="+url.QueryEscape("metadata['a']:'b'"), ""),
	} {
		if e := decodeErr(t, r); r.status != 401 || e.Error.Type != "authentication_error" {
			t.Fatalf("status %d, body %s", r.status, r.body)
		}
	}
	if len(sim.Charges()) != 0 {
		t.Fatal("charged without auth")
	}
}

func TestSimScopesKeysByAccount(t *testing.T) {
	t.Parallel()
	sim, srv := simServer(t, stripesim.Config{})
	a := post(t, srv, "/v1/payment_intents", "sk_test_a", "same", intentForm("100"))
	b := post(t, srv, "/v1/payment_intents", "sk_test_b", "same", intentForm("100"))
	if a.status != 200 || b.status != 200 || b.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("a %d, b %d %v", a.status, b.status, b.header)
	}
	var pi struct{ ID string }
	if err := json.Unmarshal(a.body, &pi); err != nil {
		t.Fatal(err)
	}
	if r := get(t, srv, "/v1/payment_intents/"+pi.ID, "sk_test_b"); r.status != 404 {
		t.Fatalf("other account retrieved %s: %d", pi.ID, r.status)
	}
	if len(sim.Charges()) != 2 {
		t.Fatalf("ledger = %+v", sim.Ledger())
	}
}

func TestSimKeyInFlight(t *testing.T) {
	t.Parallel()
	entered := make(chan stripesim.Charge, 1)
	release := make(chan struct{})
	_, srv := simServer(t, stripesim.Config{OnCharge: func(c stripesim.Charge) {
		entered <- c
		<-release
	}})
	done := make(chan rawResp, 1)
	go func() { done <- post(t, srv, "/v1/payment_intents", "sk_test", "held", intentForm("100")) }()
	c := <-entered
	if c.ProviderKey != "held" || c.MerchantID != "m_1" || c.IdempotencyKey != "k1" {
		t.Fatalf("hook saw %+v", c)
	}

	r := post(t, srv, "/v1/payment_intents", "sk_test", "held", intentForm("100"))
	if e := decodeErr(t, r); r.status != 409 || e.Error.Code != "idempotency_key_in_use" {
		t.Fatalf("in flight: %d %s", r.status, r.body)
	}
	close(release)
	first := <-done
	replay := post(t, srv, "/v1/payment_intents", "sk_test", "held", intentForm("100"))
	if first.status != 200 || replay.status != 200 || string(replay.body) != string(first.body) ||
		replay.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first %d %s, replay %d %s", first.status, first.body, replay.status, replay.body)
	}
	mismatch := post(t, srv, "/v1/payment_intents", "sk_test", "held", intentForm("101"))
	if e := decodeErr(t, mismatch); mismatch.status != 400 || e.Error.Type != "idempotency_error" {
		t.Fatalf("mismatch: %d %s", mismatch.status, mismatch.body)
	}
}

func TestSimWithoutKeyIsNotSaved(t *testing.T) {
	t.Parallel()
	sim, srv := simServer(t, stripesim.Config{})
	a := post(t, srv, "/v1/payment_intents", "sk_test", "", intentForm("100"))
	b := post(t, srv, "/v1/payment_intents", "sk_test", "", intentForm("100"))
	if a.status != 200 || b.status != 200 || string(a.body) == string(b.body) {
		t.Fatalf("a %d %s / b %d %s", a.status, a.body, b.status, b.body)
	}
	if got := sim.ChargesByKey()["m_1:k1"]; got != 2 {
		t.Fatalf("charges = %d, want 2 (no key, no protection)", got)
	}
}

func TestParseSearchQuery(t *testing.T) {
	t.Parallel()
	tests := []struct {
		q    string
		want []stripesim.SearchClause
	}{
		{`metadata['a']:'b'`, []stripesim.SearchClause{{"a", "b"}}},
		{`metadata["a"]:"b"`, []stripesim.SearchClause{{"a", "b"}}},
		{`  metadata['a']:'b'  AND  metadata['c']:'d'  `, []stripesim.SearchClause{{"a", "b"}, {"c", "d"}}},
		{`metadata['k']:'o\'brien'`, []stripesim.SearchClause{{"k", "o'brien"}}},
		{`metadata['k']:'back\\slash'`, []stripesim.SearchClause{{"k", `back\slash`}}},
		{`metadata['k']:"it's"`, []stripesim.SearchClause{{"k", "it's"}}},
		{`metadata['k']:'a AND metadata[\'x\']:\'y'`, []stripesim.SearchClause{{"k", `a AND metadata['x']:'y`}}},
		{`metadata['k']:''`, []stripesim.SearchClause{{"k", ""}}},
	}
	for _, tt := range tests {
		got, err := stripesim.ParseSearchQuery(tt.q)
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseSearchQuery(%q) = %v, %v; want %v", tt.q, got, err, tt.want)
		}
	}
	for _, bad := range []string{
		``,
		`status:'succeeded'`,
		`metadata['a']:'b' OR metadata['c']:'d'`,
		`metadata['a']:'b' AND`,
		`metadata['a']:'b`,
		`metadata['a':'b'`,
		`metadata[a]:'b'`,
		`metadata['a']:b`,
		`metadata['a']:'b\`,
		`metadata['a']:'b'metadata['c']:'d'`,
	} {
		if got, err := stripesim.ParseSearchQuery(bad); err == nil {
			t.Errorf("ParseSearchQuery(%q) = %v, want an error", bad, got)
		}
	}
}

func TestSearchQueryRoundTrip(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"plain", `o'brien`, `back\slash`, `'`, `\`, `\'`, `x' OR status:'succeeded`, `"double"`} {
		got, err := stripesim.ParseSearchQuery(stripe.SearchQuery("m_1", key))
		want := []stripesim.SearchClause{{"idempotency_key", key}, {"merchant_id", "m_1"}}
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("round trip of %q: %v, %v", key, got, err)
		}
	}
}

func TestSimSearchPagesAndRejectsBadQuery(t *testing.T) {
	t.Parallel()
	_, srv := simServer(t, stripesim.Config{})
	for i := range 3 {
		if r := post(t, srv, "/v1/payment_intents", "sk_test", "page-"+string(rune('a'+i)), intentForm("100")); r.status != 200 {
			t.Fatalf("charge: %d %s", r.status, r.body)
		}
	}
	q := url.QueryEscape(`metadata['idempotency_key']:'k1'`)
	var page struct {
		Object   string            `json:"object"`
		Data     []json.RawMessage `json:"data"`
		HasMore  bool              `json:"has_more"`
		NextPage *string           `json:"next_page"`
	}
	r := get(t, srv, "/v1/payment_intents/search?limit=2&query="+q, "sk_test")
	if err := json.Unmarshal(r.body, &page); err != nil || page.Object != "search_result" || len(page.Data) != 2 || !page.HasMore || page.NextPage == nil {
		t.Fatalf("page 1: %d %s", r.status, r.body)
	}
	r = get(t, srv, "/v1/payment_intents/search?limit=2&page="+url.QueryEscape(*page.NextPage)+"&query="+q, "sk_test")
	page.NextPage = nil
	if err := json.Unmarshal(r.body, &page); err != nil || len(page.Data) != 1 || page.HasMore || page.NextPage != nil {
		t.Fatalf("page 2: %d %s", r.status, r.body)
	}
	r = get(t, srv, "/v1/payment_intents/search?query="+url.QueryEscape("status:'succeeded'"), "sk_test")
	if e := decodeErr(t, r); r.status != 400 || e.Error.Param != "query" {
		t.Fatalf("bad query: %d %s", r.status, r.body)
	}
}

func TestSimRetrieveAndLedgerEndpoint(t *testing.T) {
	t.Parallel()
	_, srv := simServer(t, stripesim.Config{})
	created := post(t, srv, "/v1/payment_intents", "sk_test", "ledger-1", intentForm("250"))
	declineForm := intentForm("100")
	declineForm.Set("payment_method", "pm_card_chargeDeclined")
	if r := post(t, srv, "/v1/payment_intents", "sk_test", "ledger-2", declineForm); r.status != 402 {
		t.Fatalf("decline: %d %s", r.status, r.body)
	}
	var pi struct{ ID string }
	if err := json.Unmarshal(created.body, &pi); err != nil {
		t.Fatal(err)
	}
	if r := get(t, srv, "/v1/payment_intents/"+pi.ID, "sk_test"); r.status != 200 || !strings.Contains(string(r.body), pi.ID) {
		t.Fatalf("retrieve: %d %s", r.status, r.body)
	}
	if r := get(t, srv, "/v1/payment_intents/pi_missing", "sk_test"); r.status != 404 || decodeErr(t, r).Error.Code != "resource_missing" {
		t.Fatalf("missing: %d %s", r.status, r.body)
	}
	if r := get(t, srv, "/v1/nowhere", "sk_test"); r.status != 404 {
		t.Fatalf("unknown route: %d", r.status)
	}

	r := get(t, srv, "/_sim/ledger", "")
	var ledger stripesim.Ledger
	if err := json.Unmarshal(r.body, &ledger); err != nil {
		t.Fatalf("ledger %s: %v", r.body, err)
	}
	if len(ledger.Charges) != 1 || ledger.Charges[0].ID != pi.ID || ledger.Charges[0].Amount != 250 ||
		ledger.ChargesByKey["m_1:k1"] != 1 || ledger.Declines != 1 {
		t.Fatalf("ledger = %s", r.body)
	}
}

func TestSimSeedIsDeterministic(t *testing.T) {
	t.Parallel()
	first := func() string {
		_, srv := simServer(t, stripesim.Config{Seed: 99})
		var pi struct{ ID string }
		r := post(t, srv, "/v1/payment_intents", "sk_test", "seeded", intentForm("100"))
		if err := json.Unmarshal(r.body, &pi); err != nil {
			t.Fatal(err)
		}
		return pi.ID
	}
	if a, b := first(), first(); a != b {
		t.Fatalf("same seed, different ids: %s, %s", a, b)
	}
}

func TestSimConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cfg  stripesim.Config
		want string
	}{
		{stripesim.Config{Faults: stripesim.Faults{Rate5xx: 1.5}}, "Rate5xx"},
		{stripesim.Config{Faults: stripesim.Faults{Rate429: -0.1}}, "Rate429"},
		{stripesim.Config{Faults: stripesim.Faults{RateDropAfterCharge: 2}}, "RateDropAfterCharge"},
		{stripesim.Config{Faults: stripesim.Faults{RateFailBeforeCharge: -1}}, "RateFailBeforeCharge"},
		{stripesim.Config{Faults: stripesim.Faults{Latency: -time.Second}}, "Latency"},
		{stripesim.Config{Faults: stripesim.Faults{Jitter: -time.Second}}, "Jitter"},
		{stripesim.Config{KeyTTL: -time.Hour}, "KeyTTL"},
		{stripesim.Config{SearchLag: -time.Second}, "SearchLag"},
		{stripesim.Config{Faults: stripesim.Faults{RateRefundFail: 1.1}}, "RateRefundFail"},
		{stripesim.Config{CaptureWindow: -time.Hour}, "CaptureWindow"},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		if !errors.Is(err, provider.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Validate(%+v) = %v, want an error naming %s", tt.cfg, err, tt.want)
		}
	}
	ok := stripesim.Config{Faults: stripesim.Faults{Rate5xx: 1, Rate429: 0, Latency: time.Second}, KeyTTL: time.Hour}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	sim := stripesim.New(stripesim.Config{})
	if err := sim.SetFaults(stripesim.Faults{Rate5xx: 3}); err == nil {
		t.Fatal("SetFaults accepted a rate of 3")
	}
	if err := sim.SetFaults(stripesim.Faults{Rate429: 0.5}); err != nil || sim.Faults().Rate429 != 0.5 {
		t.Fatalf("SetFaults: %v, faults %+v", err, sim.Faults())
	}
}

func TestSimServe(t *testing.T) {
	t.Parallel()
	sim := stripesim.New(stripesim.Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sim.ServeListener(ctx, ln) }()

	s := newStripe(t, stripe.Config{APIBase: "http://" + ln.Addr().String()})
	mustCharge(t, s, chargeReq("k-serve"))
	s.CloseIdleConnections()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("ServeListener: %v", err)
	}
	if err := sim.Serve(context.Background(), "not an address"); err == nil {
		t.Fatal("Serve on a bad address succeeded")
	}
}

// The provider tests' shared helpers (lab/providertest).
var (
	simServer = providertest.SimServer
)

// TestSimLifecycleInvalidRequestNotSaved: a capture or a refund that fails
// validation saves nothing under its key, and the refunds' list refuses
// what it does not know, as Stripe does.
func TestSimLifecycleInvalidRequestNotSaved(t *testing.T) {
	t.Parallel()
	_, srv := simServer(t, stripesim.Config{})
	form := intentForm("100")
	form.Set("capture_method", "manual")
	r := post(t, srv, "/v1/payment_intents", "sk_test", "key-auth", form)
	var pi struct {
		ID               string `json:"id"`
		Status           string `json:"status"`
		AmountCapturable int64  `json:"amount_capturable"`
		CaptureMethod    string `json:"capture_method"`
	}
	if err := json.Unmarshal(r.body, &pi); err != nil || r.status != 200 || pi.Status != "requires_capture" || pi.AmountCapturable != 100 || pi.CaptureMethod != "manual" {
		t.Fatalf("authorize: %d %s", r.status, r.body)
	}
	for _, tt := range []struct {
		path  string
		form  url.Values
		param string
	}{
		{"/v1/payment_intents/" + pi.ID + "/capture", url.Values{"amount_to_capture": {"0"}}, "amount_to_capture"},
		{"/v1/payment_intents/" + pi.ID + "/capture", url.Values{"amount": {"10"}}, "amount"},
		{"/v1/refunds", url.Values{"amount": {"10"}}, "payment_intent"},
		{"/v1/refunds", url.Values{"payment_intent": {pi.ID}, "amount": {"x"}}, "amount"},
		{"/v1/refunds", url.Values{"payment_intent": {pi.ID}, "reason": {"bored"}}, "reason"},
		{"/v1/refunds", url.Values{"charge": {"ch_1"}}, "charge"},
	} {
		r := post(t, srv, tt.path, "sk_test", "key-op", tt.form)
		if e := decodeErr(t, r); r.status != 400 || e.Error.Param != tt.param {
			t.Fatalf("%s %v: status %d, body %s", tt.path, tt.form, r.status, r.body)
		}
	}
	r = post(t, srv, "/v1/payment_intents/"+pi.ID+"/capture", "sk_test", "key-op", url.Values{"amount_to_capture": {"60"}})
	if r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("valid capture: status %d, body %s", r.status, r.body)
	}
	if r := get(t, srv, "/v1/refunds?payment_intent="+pi.ID+"&expand[]=data", "sk_test"); r.status != 400 {
		t.Fatalf("list with an unknown parameter: %d %s", r.status, r.body)
	}
	if r := get(t, srv, "/v1/refunds?payment_intent="+pi.ID, "sk_test"); r.status != 200 || !strings.Contains(string(r.body), `"data":[]`) {
		t.Fatalf("empty list: %d %s", r.status, r.body)
	}
}

// TestSimLedgerListsCapturesAndCancels: the ledger's report lists each
// capture and each cancel the simulator executed, once: a replay under
// the same key is not another, a refused one is none.
func TestSimLedgerListsCapturesAndCancels(t *testing.T) {
	t.Parallel()
	sim, srv := simServer(t, stripesim.Config{})
	authorize := func(key, payKey string) string {
		form := intentForm("100")
		form.Set("capture_method", "manual")
		form.Set("metadata[idempotency_key]", payKey)
		r := post(t, srv, "/v1/payment_intents", "sk_test", key, form)
		var pi struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(r.body, &pi); err != nil || r.status != 200 {
			t.Fatalf("authorize: %d %s", r.status, r.body)
		}
		return pi.ID
	}
	a, b := authorize("key-a", "pay-a"), authorize("key-b", "pay-b")
	for range 2 { // the second is the first's replay
		if r := post(t, srv, "/v1/payment_intents/"+a+"/capture", "sk_test", "cap-a", url.Values{"amount_to_capture": {"60"}}); r.status != 200 {
			t.Fatalf("capture: %d %s", r.status, r.body)
		}
		if r := post(t, srv, "/v1/payment_intents/"+b+"/cancel", "sk_test", "can-b", nil); r.status != 200 {
			t.Fatalf("cancel: %d %s", r.status, r.body)
		}
	}
	if r := post(t, srv, "/v1/payment_intents/"+a+"/capture", "sk_test", "cap-a2", nil); r.status != 400 {
		t.Fatalf("a second capture: %d %s", r.status, r.body)
	}
	l := sim.Ledger()
	if len(l.Captures) != 1 || len(l.Cancels) != 1 {
		t.Fatalf("captures %+v, cancels %+v: want one each", l.Captures, l.Cancels)
	}
	c, x := l.Captures[0], l.Cancels[0]
	if c.PaymentIntent != a || c.ProviderKey != "cap-a" || c.Amount != 60 || c.MerchantID != "m_1" || c.IdempotencyKey != "pay-a" {
		t.Errorf("capture %+v", c)
	}
	if x.PaymentIntent != b || x.ProviderKey != "can-b" || x.Amount != 100 || x.IdempotencyKey != "pay-b" {
		t.Errorf("cancel %+v", x)
	}
}
