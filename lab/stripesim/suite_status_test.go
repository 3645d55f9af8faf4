package stripesim_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider"
)

// The suite's scenarios for each PaymentIntent status Stripe can answer,
// run against every implementation (runProviderSuite).

func testOffSessionAuthenticationRequired(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{})
	req := chargeReq("k-3ds-off")
	req.PaymentMethod = "pm_card_authenticationRequired"
	out := mustCharge(t, env.p, req)
	if !out.Declined || out.DeclineCode != provider.DeclineAuthenticationRequired || out.HTTPStatus != http.StatusPaymentRequired ||
		out.ChargeID == "" || out.Status != "requires_payment_method" {
		t.Fatalf("off-session 3-D Secure charge = %+v", out)
	}
	wantCharges(t, env.sim, "k-3ds-off", 0)
}

func testOnSessionRequiresActionIsCanceled(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{})
	req := chargeReq("k-3ds-on")
	req.PaymentMethod = "pm_card_authenticationRequired"
	req.OnSession = true
	out := mustCharge(t, env.p, req)
	if !out.Declined || out.DeclineCode != provider.DeclineAuthenticationRequired || out.Status != "canceled" ||
		out.HTTPStatus != http.StatusPaymentRequired {
		t.Fatalf("on-session 3-D Secure charge = %+v", out)
	}
	// The intent itself is canceled at the provider: no one can complete
	// it later.
	res, err := env.p.Lookup(context.Background(), provider.LookupRequest{ChargeID: out.ChargeID, MerchantID: "m_123", IdempotencyKey: "k-3ds-on"})
	if err != nil || !res.Found || !res.Outcome.Declined || res.Outcome.Status != "canceled" {
		t.Fatalf("lookup after the cancel = %+v, %v", res, err)
	}
	// A retry replays the requires_action answer and the cancel replays
	// under its own key: the same decline.
	again := mustCharge(t, env.p, req)
	if !again.Replayed || !again.Declined || again.ChargeID != out.ChargeID || string(again.Response) != string(out.Response) {
		t.Fatalf("retry = %+v, want the first decline replayed", again)
	}
	wantCharges(t, env.sim, "k-3ds-on", 0)
}

func testProcessingThenSettles(t *testing.T, newProvider newProviderFunc) {
	clk := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	env := setupSuite(t, newProvider, stripesim.Config{Now: clk.Now, ProcessingDelay: time.Hour})
	for _, tt := range []struct {
		pm, key    string
		declined   bool
		code       string
		wantCharge int
	}{
		{"pm_usBankAccount_success", "k-ach-ok", false, "", 1},
		{"pm_usBankAccount_accountClosed", "k-ach-closed", true, "account_closed", 0},
	} {
		req := chargeReq(tt.key)
		req.PaymentMethod = tt.pm
		out := mustCharge(t, env.p, req)
		if !out.Processing || out.Declined || out.Status != "processing" || out.ChargeID == "" || out.HTTPStatus != http.StatusAccepted {
			t.Fatalf("%s: charge = %+v, want processing", tt.pm, out)
		}
		wantCharges(t, env.sim, tt.key, 0)
		lookup := provider.LookupRequest{ProviderKey: req.ProviderKey, ChargeID: out.ChargeID, MerchantID: "m_123",
			IdempotencyKey: tt.key, Amount: req.Amount, Currency: req.Currency}
		if res, err := env.p.Lookup(context.Background(), lookup); err != nil || !res.Outcome.Processing {
			t.Fatalf("%s: lookup while processing = %+v, %v", tt.pm, res, err)
		}
		// A retry under the key is answered processing again, never a
		// second debit.
		if again := mustCharge(t, env.p, req); !again.Replayed || !again.Processing || again.ChargeID != out.ChargeID {
			t.Fatalf("%s: retry = %+v", tt.pm, again)
		}
		clk.Advance(time.Hour)
		res, err := env.p.Lookup(context.Background(), lookup)
		if err != nil || !res.Found || res.Outcome.Processing || res.Outcome.Declined != tt.declined ||
			res.Outcome.ChargeID != out.ChargeID || res.Outcome.DeclineCode != tt.code {
			t.Fatalf("%s: lookup after the delay = %+v (%+v), %v", tt.pm, res, res.Outcome, err)
		}
		// Search finds the settled intent too.
		lookup.ChargeID = ""
		if res, err := env.p.Lookup(context.Background(), lookup); err != nil || !res.Found || res.Outcome.Processing ||
			res.Outcome.Declined != tt.declined {
			t.Fatalf("%s: search after the delay = %+v, %v", tt.pm, res, err)
		}
		wantCharges(t, env.sim, tt.key, tt.wantCharge)
	}
}

func testDeclineKeepsStripeCodes(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{})
	for pm, code := range map[string]string{
		"pm_card_chargeDeclined":                  "generic_decline",
		"pm_card_chargeDeclinedInsufficientFunds": "insufficient_funds",
		"pm_card_chargeDeclinedExpiredCard":       "expired_card",
	} {
		req := chargeReq("k-code-" + code)
		req.PaymentMethod = pm
		out := mustCharge(t, env.p, req)
		res, err := env.p.Lookup(context.Background(), provider.LookupRequest{ProviderKey: req.ProviderKey, MerchantID: "m_123", IdempotencyKey: req.IdempotencyKey})
		if err != nil || !res.Found {
			t.Fatalf("%s: lookup = %+v, %v", pm, res, err)
		}
		for name, o := range map[string]*provider.Outcome{"charge": out, "lookup": res.Outcome} {
			var body struct {
				Error struct{ Type, Code, DeclineCode string } `json:"error"`
			}
			_ = json.Unmarshal(o.Response, &body)
			if !o.Declined || o.DeclineCode != code || body.Error.Type != "card_error" {
				t.Fatalf("%s %s: outcome = %+v, body %s", pm, name, o, o.Response)
			}
		}
	}
}

// createDirect creates an intent at the simulator over HTTP, not through
// the provider under test: someone else's intent (another system, a person
// in the dashboard) that carries our metadata.
func createDirect(t *testing.T, env *suiteEnv, key string, form url.Values) {
	t.Helper()
	r, err := http.NewRequest(http.MethodPost, env.url+"/v1/payment_intents", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Authorization", "Bearer sk_test_paydedup")
	r.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("direct create: %d", resp.StatusCode)
	}
}

func testLookupForeignIntent(t *testing.T, newProvider newProviderFunc) {
	env := setupSuite(t, newProvider, stripesim.Config{})
	// Our metadata, another amount: not this row's payment, whoever made it.
	createDirect(t, env, "someone-else", url.Values{
		"amount": {"500"}, "currency": {"usd"}, "payment_method": {"pm_card_visa"}, "confirm": {"true"},
		"metadata[merchant_id]": {"m_123"}, "metadata[idempotency_key]": {"k-foreign"},
	})
	_, err := env.p.Lookup(context.Background(), provider.LookupRequest{ProviderKey: "pdk_k-foreign",
		MerchantID: "m_123", IdempotencyKey: "k-foreign", Amount: 1999, Currency: "usd"})
	wantClass(t, err, provider.ClassUnknown)
	if !errors.Is(err, provider.ErrForeignIntent) || !strings.Contains(err.Error(), "amount 500, not 1999") {
		t.Fatalf("err = %v, want ErrForeignIntent naming the amount", err)
	}
}
