package stripe_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
)

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

func TestNewStripeValidatesConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  stripe.Config
		want string
	}{
		{"no key", stripe.Config{}, "STRIPE_SECRET_KEY"},
		{"blank key", stripe.Config{SecretKey: "  "}, "STRIPE_SECRET_KEY"},
		{"bad scheme", stripe.Config{SecretKey: "sk_test", APIBase: "ftp://x"}, "STRIPE_API_BASE"},
		{"no host", stripe.Config{SecretKey: "sk_test", APIBase: "http://"}, "STRIPE_API_BASE"},
		{"unparsable", stripe.Config{SecretKey: "sk_test", APIBase: "http://[::1"}, "STRIPE_API_BASE"},
		{"relative", stripe.Config{SecretKey: "sk_test", APIBase: "localhost:12111"}, "STRIPE_API_BASE"},
		{"negative timeout", stripe.Config{SecretKey: "sk_test", Timeout: -time.Second}, "timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := stripe.New(tt.cfg)
			if !errors.Is(err, provider.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalidConfig naming %s", err, tt.want)
			}
		})
	}
	s, err := stripe.New(stripe.Config{SecretKey: "sk_test"})
	if err != nil || s == nil {
		t.Fatalf("default config: %v", err)
	}
}

func TestStripeTimeoutConfig(t *testing.T) {
	t.Parallel()
	sim := stripesim.New(stripesim.Config{Faults: stripesim.Faults{Latency: time.Minute}})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	s := newStripe(t, stripe.Config{APIBase: srv.URL, Timeout: 100 * time.Millisecond})
	_, err := s.Charge(context.Background(), chargeReq("k-cfg-timeout"))
	wantClass(t, err, provider.ClassUnknown)
}

func TestStripeRejectsBadProviderKey(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("unexpected request %s %s: a bad key must not be sent", r.Method, r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	s := newStripe(t, stripe.Config{APIBase: srv.URL})
	for _, key := range []string{"", " padded", strings.Repeat("k", provider.MaxProviderKeyLen+1)} {
		req := chargeReq("k")
		req.ProviderKey = key
		_, err := s.Charge(context.Background(), req)
		wantClass(t, err, provider.ClassMismatch)
		if !errors.Is(err, provider.ErrInvalidRequest) {
			t.Fatalf("err = %v, want ErrInvalidRequest", err)
		}
	}
	_, err := s.Lookup(context.Background(), provider.LookupRequest{MerchantID: "m_123"})
	if !errors.Is(err, provider.ErrInvalidRequest) {
		t.Fatalf("lookup without key: err = %v", err)
	}
}

func TestStripeUnauthorizedStopsTheWorker(t *testing.T) {
	t.Parallel()
	// A proxy that strips the key: the simulator answers 401.
	sim := stripesim.New(stripesim.Config{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Del("Authorization")
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s := newStripe(t, stripe.Config{APIBase: srv.URL})
	_, err := s.Charge(context.Background(), chargeReq("k-401"))
	pe := wantClass(t, err, provider.ClassUnauthorized)
	if pe.HTTPStatus != http.StatusUnauthorized {
		t.Fatalf("error = %+v", pe)
	}
}

func TestStripeLookupUnconfirmedIntentIsDeclined(t *testing.T) {
	t.Parallel()
	_, srv := simServer(t, stripesim.Config{})
	// An intent created elsewhere without confirm stops at
	// requires_confirmation: with no customer present it never charges.
	form := intentForm("100")
	form.Del("confirm")
	if r := post(t, srv, "/v1/payment_intents", "sk_test_paydedup", "unconfirmed", form); r.status != 200 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	s := newStripe(t, stripe.Config{APIBase: srv.URL})
	res, err := s.Lookup(context.Background(), provider.LookupRequest{MerchantID: "m_1", IdempotencyKey: "k1"})
	if err != nil || !res.Found || !res.Outcome.Declined || res.Outcome.DeclineCode != "requires_confirmation" ||
		res.Outcome.HTTPStatus != http.StatusPaymentRequired {
		t.Fatalf("lookup = %+v, %v", res, err)
	}
}
