package stripe_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
)

// TestStripeResendAfterWriteIsUnknown drives net/http's own resend: stripe-go
// sets GetBody and an Idempotency-Key header, so when a reused keep-alive
// connection closes after the request was written and before any response
// byte, net/http sends the request again on a new connection by itself. A
// front proxy cuts the client side while the simulator holds the first copy
// in flight (it has charged; its key is still in use). Whatever the resend is
// answered — 409 idempotency_key_in_use, or a 429 that only proves the resend
// did not run — the call's outcome is unknown, never retryable, and the
// provider's ledger holds exactly one charge.
func TestStripeResendAfterWriteIsUnknown(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		resend     stripesim.Faults // the faults the resend meets
		wantStatus int
	}{
		{"resend meets the key in use", stripesim.Faults{}, http.StatusConflict},
		{"resend is rate limited", stripesim.Faults{Rate429: 1}, http.StatusTooManyRequests},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const key = "k-held"
			entered := make(chan struct{}, 1)
			release := make(chan struct{})
			var releaseOnce sync.Once
			unblock := func() { releaseOnce.Do(func() { close(release) }) }
			sim := stripesim.New(stripesim.Config{Seed: 7, OnCharge: func(c stripesim.Charge) {
				if c.IdempotencyKey == key {
					entered <- struct{}{}
					<-release
				}
			}})
			srv := httptest.NewServer(sim)
			t.Cleanup(srv.Close)
			t.Cleanup(unblock) // runs before srv.Close: no handler stays blocked
			proxy := testenv.NewFrontProxy(t, srv.Listener.Addr().String())
			s := newStripe(t, stripe.Config{APIBase: proxy.URL(), Timeout: 10 * time.Second})

			// A first call leaves one kept-alive connection for the next.
			mustCharge(t, s, chargeReq("k-warm"))
			if n := proxy.Accepted(); n != 1 {
				t.Fatalf("connections after the first call = %d, want 1", n)
			}

			errc := make(chan error, 1)
			go func() {
				_, err := s.Charge(context.Background(), chargeReq(key))
				errc <- err
			}()
			select {
			case <-entered:
			case <-time.After(10 * time.Second):
				t.Fatal("the charge never reached the simulator")
			}
			if err := sim.SetFaults(tc.resend); err != nil {
				t.Fatal(err)
			}
			if n := proxy.CutClients(); n != 1 {
				t.Fatalf("cut %d client connections, want 1", n)
			}
			var err error
			select {
			case err = <-errc:
			case <-time.After(10 * time.Second):
				t.Fatal("the charge did not return")
			}
			pe := wantClass(t, err, provider.ClassUnknown)
			// Only a resent copy can have been answered: the first copy's
			// connection was cut before any response byte.
			if pe.HTTPStatus != tc.wantStatus || proxy.Accepted() < 2 {
				t.Fatalf("error %+v after %d connections; want the resend's %d", pe, proxy.Accepted(), tc.wantStatus)
			}

			unblock()
			if err := sim.SetFaults(stripesim.Faults{}); err != nil {
				t.Fatal(err)
			}
			// The first copy's handler finishes after the release: until it
			// has stored its answer the key is still in use (409), as at
			// Stripe, and a client asks again.
			var again *provider.Outcome
			for deadline := time.Now().Add(10 * time.Second); ; {
				out, err := s.Charge(context.Background(), chargeReq(key))
				var inUse *provider.Error
				if errors.As(err, &inUse) && inUse.HTTPStatus == http.StatusConflict && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				if err != nil {
					t.Fatalf("the call after the first copy finished: %v", err)
				}
				again = out
				break
			}
			if !again.Replayed {
				t.Fatalf("the call after the first copy finished was not a replay: %+v", again)
			}
			if n := sim.ChargesByKey()["m_123:"+key]; n != 1 {
				t.Fatalf("charges under the key = %d, want 1", n)
			}
		})
	}
}
