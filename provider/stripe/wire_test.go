package stripe_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider/stripe"
)

// TestRequestsCarryTheirLength checks what the adapter puts on the wire:
// every POST (the charge, and the cancel of an intent left requiring
// action) says its Content-Length and is not chunked. stripe-go hands
// net/http its form as a reader net/http cannot size, which made each POST
// chunked, its headers flushed in a write of their own, after a goroutine
// and a timer probed the body. It holds with the adapter's own client and
// with one a caller gives it (the worker's traced client), and over TLS,
// where the adapter's transport speaks HTTP/2 as it does to api.stripe.com.
func TestRequestsCarryTheirLength(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		client *http.Client
		tls    bool
	}{
		{"own client", nil, false},
		{"caller's client", &http.Client{Transport: stripe.NewTransport()}, false},
		{"TLS and HTTP/2", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sim := stripesim.New(stripesim.Config{Seed: 7})
			var (
				mu   sync.Mutex
				seen []string
			)
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodPost {
					mu.Lock()
					switch {
					case tc.tls && r.ProtoMajor != 2:
						seen = append(seen, r.URL.Path+": "+r.Proto+" over TLS, want HTTP/2")
					case len(r.TransferEncoding) > 0:
						seen = append(seen, r.URL.Path+": Transfer-Encoding "+r.TransferEncoding[0])
					case r.ContentLength <= 0:
						seen = append(seen, r.URL.Path+": no Content-Length")
					}
					mu.Unlock()
				}
				sim.ServeHTTP(w, r)
			}))
			if tc.tls {
				srv.EnableHTTP2 = true
				srv.StartTLS()
				tr := stripe.NewTransport()
				tr.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone() // trusts srv's certificate
				tc.client = &http.Client{Transport: tr}
			} else {
				srv.Start()
			}
			t.Cleanup(srv.Close)
			if tc.client != nil {
				t.Cleanup(tc.client.CloseIdleConnections)
			}
			s := newStripe(t, stripe.Config{APIBase: srv.URL, HTTPClient: tc.client, Timeout: 10 * time.Second})

			mustCharge(t, s, chargeReq("k-length"))
			req := chargeReq("k-length-3ds")
			req.PaymentMethod, req.OnSession = "pm_card_authenticationRequired", true // requires_action: the adapter cancels the intent, a second POST
			mustCharge(t, s, req)

			mu.Lock()
			defer mu.Unlock()
			for _, s := range seen {
				t.Error(s)
			}
		})
	}
}
