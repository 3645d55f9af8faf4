package stripe_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
)

// TestStripeListRefundsSincePages: the account's refunds since a time are
// read a page of 100 at a time (created[gte] in whole seconds, rounded
// down; limit=100; starting_after), newest first, each with its intent and
// metadata, and a list resumes after a given refund.
func TestStripeListRefundsSincePages(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := clock.NewFake(t0)
	sim := stripesim.New(stripesim.Config{Now: clk.Now})
	var mu sync.Mutex
	var queries []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/v1/refunds" {
			mu.Lock()
			queries = append(queries, r.URL.RawQuery)
			mu.Unlock()
		}
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s := newStripe(t, stripe.Config{APIBase: srv.URL})
	ctx := context.Background()
	req := chargeReq("k-refunded")
	req.Amount = 10000
	out, err := s.Charge(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	// Refund i is created at t0 + (i+1) s.
	for i := range 150 {
		clk.Advance(time.Second)
		key := fmt.Sprintf("r-%03d", i)
		if _, err := s.Refund(ctx, provider.RefundRequest{ProviderKey: "pdr_" + key, ChargeID: out.ChargeID, Amount: 10,
			MerchantID: req.MerchantID, IdempotencyKey: key}); err != nil {
			t.Fatal(err)
		}
	}
	// From t0 + 30.5 s, rounded down to 30: refunds 29..149.
	from := t0.Add(30*time.Second + 500*time.Millisecond)
	list := func(after string) []*provider.RefundOutcome {
		t.Helper()
		var got []*provider.RefundOutcome
		for re, err := range s.ListRefundsSince(ctx, from, after) {
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, re)
		}
		return got
	}
	got := list("")
	if len(got) != 121 {
		t.Fatalf("listed %d refunds, want 121 (refunds 29..149)", len(got))
	}
	for i, re := range got {
		want := fmt.Sprintf("r-%03d", 149-i)
		if re.IdempotencyKey != want || re.MerchantID != req.MerchantID || re.ChargeID != out.ChargeID || re.Amount != 10 ||
			re.Status != provider.RefundSucceeded {
			t.Fatalf("refund %d = %+v, want %s of %s (newest first)", i, re, want, out.ChargeID)
		}
	}
	mu.Lock()
	if len(queries) != 2 || !strings.Contains(queries[0], fmt.Sprintf("created[gte]=%d", t0.Unix()+30)) ||
		!strings.Contains(queries[0], "limit=100") || !strings.Contains(queries[1], "starting_after="+got[99].RefundID) {
		t.Errorf("list requests %q, want 2 pages of 100 from created[gte]=%d", queries, t0.Unix()+30)
	}
	mu.Unlock()
	if rest := list(got[99].RefundID); len(rest) != 21 || rest[0].RefundID != got[100].RefundID {
		t.Errorf("resumed after refund 100: %d refunds, want the last 21", len(rest))
	}
}
