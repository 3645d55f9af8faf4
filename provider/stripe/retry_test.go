package stripe_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
)

// fast keeps retries quick.
var fast = provider.RetryPolicy{MaxTries: 3, AttemptTimeout: time.Second, InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond}

// TestChargeWithRetryDropAfterCharge retries through the Stripe adapter a
// charge whose response was lost: every attempt carries the same provider
// key, the provider charges once, and the retry gets the original intent.
func TestChargeWithRetryDropAfterCharge(t *testing.T) {
	t.Parallel()
	var sim *stripesim.Simulator
	sim = stripesim.New(stripesim.Config{
		Seed:   7,
		Faults: stripesim.Faults{RateDropAfterCharge: 1},
		// The provider "recovers" right after the first charge: the
		// response of that request is still dropped (its fate was rolled on
		// arrival), the retry's is not.
		OnCharge: func(stripesim.Charge) {
			if err := sim.SetFaults(stripesim.Faults{}); err != nil {
				t.Error(err)
			}
		},
	})
	var mu sync.Mutex
	var keys []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			mu.Lock()
			keys = append(keys, r.Header.Get("Idempotency-Key"))
			mu.Unlock()
		}
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s := newStripe(t, stripe.Config{APIBase: srv.URL})

	req := chargeReq("k-retry-drop")
	out, err := provider.ChargeWithRetry(context.Background(), s, req, fast)
	if err != nil {
		t.Fatal(err)
	}
	charges := sim.Charges()
	if len(charges) != 1 || out.ChargeID != charges[0].ID || !out.Replayed {
		t.Fatalf("outcome %+v, ledger %+v: want one charge, replayed to the retry", out, charges)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(keys) < 2 {
		t.Fatalf("provider saw %d requests, want the dropped one and a retry", len(keys))
	}
	for _, k := range keys {
		if k != req.ProviderKey {
			t.Fatalf("provider keys = %v, want all %s", keys, req.ProviderKey)
		}
	}
}
