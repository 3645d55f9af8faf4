package stripe_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
)

// stepClock is a simulator clock that moves one second per reading.
type stepClock struct {
	base time.Time
	n    atomic.Int64
}

func (c *stepClock) now() time.Time { return c.base.Add(time.Duration(c.n.Add(1)) * time.Second) }

// TestStripeListIntentsPagesThroughTheSimulator: the adapter's list, over
// HTTP against the simulator, follows Stripe's pagination across pages
// (has_more, starting_after) and its created window, and reads every field
// the audit needs; the simulator's in-process client lists the same.
func TestStripeListIntentsPagesThroughTheSimulator(t *testing.T) {
	t.Parallel()
	clk := &stepClock{base: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
	sim := stripesim.New(stripesim.Config{Now: clk.now})
	var mu sync.Mutex
	var listQueries []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/v1/payment_intents" {
			mu.Lock()
			listQueries = append(listQueries, r.URL.RawQuery)
			mu.Unlock()
		}
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s := newStripe(t, stripe.Config{APIBase: srv.URL})

	own := sim.Client("sk_test_paydedup")
	other := sim.Client("sk_test_someone_else")
	ctx := context.Background()
	const n = 250
	want := map[string]provider.Intent{}
	for i := range n {
		req := chargeReq(fmt.Sprintf("k-list-%03d", i))
		req.Amount = int64(100 + i)
		if i%7 == 0 {
			req.PaymentMethod = "pm_card_chargeDeclined"
		}
		out, err := own.Charge(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		want[out.ChargeID] = provider.Intent{ID: out.ChargeID, Status: out.Status, Amount: req.Amount, Currency: "usd",
			MerchantID: req.MerchantID, IdempotencyKey: req.IdempotencyKey}
		if _, err := other.Charge(ctx, chargeReq(fmt.Sprintf("k-other-%03d", i))); err != nil {
			t.Fatal(err)
		}
	}
	// Own intent i was created at base + (2i+1) s, the other account's at
	// base + (2i+2) s. A window from own intent 10 to before own intent 240:
	from := clk.base.Add(21 * time.Second)
	to := clk.base.Add(481*time.Second + 500*time.Millisecond) // rounded up to 482: includes intent 240
	var got []provider.Intent
	for in, err := range s.ListIntents(ctx, provider.ListRequest{From: from, To: to}) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, in)
	}
	if len(got) != 231 {
		t.Fatalf("listed %d intents, want 231 (intents 10..240)", len(got))
	}
	for i, in := range got {
		w, ok := want[in.ID]
		if !ok {
			t.Fatalf("listed %s, not one of this account's intents", in.ID)
		}
		w.Created = in.Created
		if in != w {
			t.Errorf("intent %d = %+v, want %+v", i, in, w)
		}
		if i > 0 && !in.Created.Before(got[i-1].Created) {
			t.Errorf("intent %d created %v, not before %v: the list is newest first", i, in.Created, got[i-1].Created)
		}
		if in.Created.Before(from) || !in.Created.Before(to.Add(time.Second)) {
			t.Errorf("intent %s created %v, outside [%v, %v]", in.ID, in.Created, from, to)
		}
	}
	if got[0].IdempotencyKey != "k-list-240" || got[len(got)-1].IdempotencyKey != "k-list-010" {
		t.Errorf("list runs from %s to %s, want k-list-240 to k-list-010", got[0].IdempotencyKey, got[len(got)-1].IdempotencyKey)
	}
	mu.Lock()
	if len(listQueries) != 3 {
		t.Errorf("list requests = %d (%q), want 3 pages of 100", len(listQueries), listQueries)
	}
	mu.Unlock()

	// The in-process client lists exactly the same.
	var direct []provider.Intent
	for in, err := range own.ListIntents(ctx, provider.ListRequest{From: from, To: to}) {
		if err != nil {
			t.Fatal(err)
		}
		direct = append(direct, in)
	}
	if !slices.Equal(direct, got) {
		t.Errorf("in-process list differs from the HTTP list: %d vs %d intents", len(direct), len(got))
	}

	// Stopping early stops paging.
	count := 0
	for range s.ListIntents(ctx, provider.ListRequest{From: from, To: to}) {
		if count++; count == 5 {
			break
		}
	}

	// Retrieve by id, and an id Stripe does not know.
	in, err := s.GetIntent(ctx, got[3].ID)
	if err != nil || in != got[3] {
		t.Fatalf("GetIntent = %+v, %v; want %+v", in, err, got[3])
	}
	if _, err := s.GetIntent(ctx, "pi_nosuchintent"); !errors.Is(err, provider.ErrNoSuchIntent) {
		t.Fatalf("GetIntent of an unknown id: %v, want ErrNoSuchIntent", err)
	}
	if _, err := own.GetIntent(ctx, "pi_nosuchintent"); !errors.Is(err, provider.ErrNoSuchIntent) {
		t.Fatalf("in-process GetIntent of an unknown id: %v, want ErrNoSuchIntent", err)
	}
	// An empty window lists nothing and asks nothing.
	for range s.ListIntents(ctx, provider.ListRequest{From: to, To: from}) {
		t.Fatal("an empty window listed an intent")
	}
}

// TestStripeListIntentsFailedPage: a page the provider refuses ends the list
// with a classified error, not a short list taken for the whole.
func TestStripeListIntentsFailedPage(t *testing.T) {
	t.Parallel()
	sim, srv := simServer(t, stripesim.Config{})
	s := newStripe(t, stripe.Config{APIBase: srv.URL})
	ctx := context.Background()
	for i := range 3 {
		mustCharge(t, s, chargeReq(fmt.Sprintf("k-fail-%d", i)))
	}
	if err := sim.SetFaults(stripesim.Faults{Rate429: 1}); err != nil {
		t.Fatal(err)
	}
	var errs int
	for _, err := range s.ListIntents(ctx, provider.ListRequest{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour)}) {
		if err == nil {
			t.Fatal("listed an intent through a 429")
		}
		wantClass(t, err, provider.ClassRetryable)
		errs++
	}
	if errs != 1 {
		t.Fatalf("errors = %d, want 1", errs)
	}
}

// TestSimListRejectsUnknownParameters: as Stripe does, so that a typo in the
// adapter's list fails a test rather than listing everything.
func TestSimListRejectsUnknownParameters(t *testing.T) {
	t.Parallel()
	_, srv := simServer(t, stripesim.Config{})
	for _, q := range []string{"created[gte]=x", "limit=101", "created[after]=1", "ending_before=pi_1", "starting_after=pi_nosuch"} {
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/v1/payment_intents?"+q, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer sk_test_x")
		if r := do(t, srv, req); r.status != http.StatusBadRequest {
			t.Errorf("%s: status %d (%s), want 400", q, r.status, r.body)
		}
	}
}
