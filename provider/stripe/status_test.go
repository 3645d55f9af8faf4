package stripe_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
)

// TestStripeRequiresActionCancelFails: an intent left requires_action whose
// cancel fails is an unknown outcome, never a decline: left open, it could
// still move money.
func TestStripeRequiresActionCancelFails(t *testing.T) {
	t.Parallel()
	sim := stripesim.New(stripesim.Config{})
	var cancels atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/cancel") {
			if cancels.Add(1) == 1 {
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = w.Write([]byte(`{"error":{"type":"api_error","message":"boom"}}`))
				return
			}
			if r.Header.Get("Idempotency-Key") == "" {
				t.Errorf("cancel sent without an idempotency key")
			}
		}
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s := newStripe(t, stripe.Config{APIBase: srv.URL})
	req := chargeReq("k-cancel-fails")
	req.PaymentMethod = "pm_card_authenticationRequired"
	req.OnSession = true
	_, err := s.Charge(context.Background(), req)
	pe := wantClass(t, err, provider.ClassUnknown)
	if !strings.Contains(pe.Message, "requires_action") {
		t.Fatalf("error = %v, want it to name requires_action", err)
	}
	// The retry replays the create and cancels under the same key.
	out := mustCharge(t, s, req)
	if !out.Declined || out.DeclineCode != provider.DeclineAuthenticationRequired || out.Status != "canceled" {
		t.Fatalf("retry = %+v", out)
	}
}

// TestStripeLookupBelievesRetrieveNotSearch: a search hit's status may be
// stale (Stripe's search index lags); only the intent retrieved by id says
// how it stands.
func TestStripeLookupBelievesRetrieveNotSearch(t *testing.T) {
	t.Parallel()
	// A stale index: it says succeeded while the intent is processing.
	srv := searchRewrite(t, `"status":"processing"`, `"status":"succeeded"`)
	s := newStripe(t, stripe.Config{APIBase: srv.URL})
	req := chargeReq("k-stale-search")
	req.PaymentMethod = "pm_usBankAccount_success"
	out := mustCharge(t, s, req)
	res, err := s.Lookup(context.Background(), provider.LookupRequest{ProviderKey: req.ProviderKey, MerchantID: "m_123",
		IdempotencyKey: "k-stale-search", Amount: req.Amount, Currency: req.Currency})
	if err != nil || !res.Found || !res.Outcome.Processing || res.Outcome.ChargeID != out.ChargeID {
		t.Fatalf("lookup = %+v, %v; want the retrieved intent's processing", res, err)
	}
}

// TestSimulatorRejectsUnknownParameters: Stripe refuses a parameter it does
// not know, so an adapter typo fails a test instead of being ignored.
func TestSimulatorRejectsUnknownParameters(t *testing.T) {
	t.Parallel()
	_, srv := simServer(t, stripesim.Config{})
	form := intentForm("100")
	form.Set("amuont", "100")
	r := post(t, srv, "/v1/payment_intents", "sk_test_paydedup", "typo", form)
	if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), `"message":"Received unknown parameter: amuont"`) ||
		!strings.Contains(string(r.body), `"param":"amuont"`) {
		t.Fatalf("create with a typo: %d %s", r.status, r.body)
	}
	r = post(t, srv, "/v1/payment_intents/pi_x/cancel", "sk_test_paydedup", "", url.Values{"reason": {"abandoned"}})
	if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "Received unknown parameter: reason") {
		t.Fatalf("cancel with a typo: %d %s", r.status, r.body)
	}
}

// TestStripeSendsOffSession: the adapter charges off-session by default and
// on-session when asked, always confirming.
func TestStripeSendsOffSession(t *testing.T) {
	t.Parallel()
	sim := stripesim.New(stripesim.Config{})
	var (
		mu    sync.Mutex
		forms []url.Values
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		mu.Lock()
		forms = append(forms, r.PostForm)
		mu.Unlock()
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s := newStripe(t, stripe.Config{APIBase: srv.URL})
	mustCharge(t, s, chargeReq("k-off"))
	on := chargeReq("k-on")
	on.OnSession = true
	mustCharge(t, s, on)
	mu.Lock()
	defer mu.Unlock()
	if len(forms) != 2 || forms[0].Get("off_session") != "true" || forms[0].Get("confirm") != "true" ||
		forms[1].Get("off_session") != "false" {
		t.Fatalf("forms = %v", forms)
	}
}

// TestStripeSearchHitOfAnotherMerchantIsNotUsed: a search hit whose
// metadata names another merchant (a search index that matched loosely) is
// someone else's intent: the lookup reports it and completes nothing.
func TestStripeSearchHitOfAnotherMerchantIsNotUsed(t *testing.T) {
	t.Parallel()
	srv := searchRewrite(t, `"merchant_id":"m_123"`, `"merchant_id":"m_other"`)
	s := newStripe(t, stripe.Config{APIBase: srv.URL})
	req := chargeReq("k-other-merchant")
	mustCharge(t, s, req)
	_, err := s.Lookup(context.Background(), provider.LookupRequest{ProviderKey: req.ProviderKey, MerchantID: "m_123",
		IdempotencyKey: req.IdempotencyKey, Amount: req.Amount, Currency: req.Currency})
	wantClass(t, err, provider.ClassUnknown)
	if !errors.Is(err, provider.ErrForeignIntent) || !strings.Contains(err.Error(), `metadata merchant_id "m_other"`) {
		t.Fatalf("err = %v, want ErrForeignIntent naming the merchant", err)
	}
}

// searchRewrite serves a simulator whose search answers have old replaced
// by new: a search index that disagrees with the intents themselves.
func searchRewrite(t *testing.T, old, new string) *httptest.Server {
	t.Helper()
	sim := stripesim.New(stripesim.Config{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/payment_intents/search" {
			sim.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		sim.ServeHTTP(rec, r)
		w.WriteHeader(rec.Code)
		_, _ = w.Write(bytes.ReplaceAll(rec.Body.Bytes(), []byte(old), []byte(new)))
	}))
	t.Cleanup(srv.Close)
	return srv
}
