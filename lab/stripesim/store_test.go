package stripesim_test

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/store_transcript.txt from this simulator")

// TestSimStoreTranscript replays one fixed script of requests (a seeded
// simulator on a fake clock, one request at a time) and compares every
// answer, byte for byte, with the transcript the simulator made before it
// stored its intents and keys compactly: replays of each kind of intent,
// conflicts (same key, other parameters; a create key reused for a
// cancel), keys of other accounts, key expiry, intents that settle or are
// canceled after their key answered, retrieve, search, list and the
// ledger, over HTTP and through the Client.
func TestSimStoreTranscript(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	sim := stripesim.New(stripesim.Config{Seed: 7, Now: clk.Now, KeyTTL: time.Hour, ProcessingDelay: time.Minute})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	var out strings.Builder
	ids := map[string]string{} // label → intent id, from the answers
	note := func(label string, r rawResp) {
		fmt.Fprintf(&out, "== %s\n%d replayed=%q request=%q\n%s\n", label, r.status,
			r.header.Get("Idempotent-Replayed"), r.header.Get("Request-Id"), r.body)
		if i := strings.Index(string(r.body), `"id":"pi_`); i >= 0 {
			ids[label] = string(r.body[i+6 : i+6+27])
		}
	}
	form := func(amount, pm string, extra ...string) url.Values {
		v := intentForm(amount)
		v.Set("payment_method", pm)
		for i := 0; i+1 < len(extra); i += 2 {
			v.Set(extra[i], extra[i+1])
		}
		return v
	}
	const acct, other = "sk_test_a", "sk_test_b"
	steps := []struct {
		label string
		run   func() rawResp
	}{
		{"charge", func() rawResp { return post(t, srv, "/v1/payment_intents", acct, "k1", form("100", "pm_card_visa")) }},
		{"charge replay", func() rawResp { return post(t, srv, "/v1/payment_intents", acct, "k1", form("100", "pm_card_visa")) }},
		{"charge conflict", func() rawResp { return post(t, srv, "/v1/payment_intents", acct, "k1", form("101", "pm_card_visa")) }},
		{"charge other account", func() rawResp {
			return post(t, srv, "/v1/payment_intents", other, "k1", form("100", "pm_card_visa"))
		}},
		{"decline", func() rawResp {
			return post(t, srv, "/v1/payment_intents", acct, "k2", form("200", "pm_card_chargeDeclinedInsufficientFunds"))
		}},
		{"decline replay", func() rawResp {
			return post(t, srv, "/v1/payment_intents", acct, "k2", form("200", "pm_card_chargeDeclinedInsufficientFunds"))
		}},
		{"bank", func() rawResp {
			return post(t, srv, "/v1/payment_intents", acct, "k3", form("300", "pm_usBankAccount_success", "payment_method_types[0]", "us_bank_account"))
		}},
		{"bank closed", func() rawResp {
			return post(t, srv, "/v1/payment_intents", acct, "k4", form("400", "pm_usBankAccount_accountClosed",
				"payment_method_types[0]", "us_bank_account", "description", "rent <&> \u2028 é"))
		}},
		{"unconfirmed", func() rawResp {
			return post(t, srv, "/v1/payment_intents", acct, "k5", form("500", "pm_card_visa", "confirm", "false",
				"payment_method_types[1]", "link", "metadata[zz]", "last", "metadata[a1]", "first"))
		}},
		{"auth required on session", func() rawResp {
			return post(t, srv, "/v1/payment_intents", acct, "k6", form("600", "pm_card_authenticationRequired"))
		}},
		{"no key", func() rawResp { return post(t, srv, "/v1/payment_intents", acct, "", form("700", "pm_card_visa")) }},
		{"later", func() rawResp { clk.Advance(2 * time.Minute); return rawResp{status: 0, header: http.Header{}} }},
		{"bank retrieve settled", func() rawResp { return get(t, srv, "/v1/payment_intents/"+ids["bank"], acct) }},
		{"bank replay as created", func() rawResp {
			return post(t, srv, "/v1/payment_intents", acct, "k3", form("300", "pm_usBankAccount_success", "payment_method_types[0]", "us_bank_account"))
		}},
		{"bank closed replay as created", func() rawResp {
			return post(t, srv, "/v1/payment_intents", acct, "k4", form("400", "pm_usBankAccount_accountClosed",
				"payment_method_types[0]", "us_bank_account", "description", "rent <&> \u2028 é"))
		}},
		{"bank closed retrieve failed", func() rawResp { return get(t, srv, "/v1/payment_intents/"+ids["bank closed"], acct) }},
		{"retrieve other account", func() rawResp { return get(t, srv, "/v1/payment_intents/"+ids["charge"], other) }},
		{"cancel", func() rawResp {
			return post(t, srv, "/v1/payment_intents/"+ids["unconfirmed"]+"/cancel", acct, "c5", url.Values{"cancellation_reason": {"abandoned"}})
		}},
		{"cancel replay", func() rawResp {
			return post(t, srv, "/v1/payment_intents/"+ids["unconfirmed"]+"/cancel", acct, "c5", url.Values{"cancellation_reason": {"abandoned"}})
		}},
		{"cancel conflict", func() rawResp {
			return post(t, srv, "/v1/payment_intents/"+ids["unconfirmed"]+"/cancel", acct, "c5", url.Values{"cancellation_reason": {"duplicate"}})
		}},
		{"cancel under a create key", func() rawResp {
			return post(t, srv, "/v1/payment_intents/"+ids["auth required on session"]+"/cancel", acct, "k6", url.Values{})
		}},
		{"cancel auth", func() rawResp {
			return post(t, srv, "/v1/payment_intents/"+ids["auth required on session"]+"/cancel", acct, "c7", url.Values{})
		}},
		{"auth replay as created", func() rawResp {
			return post(t, srv, "/v1/payment_intents", acct, "k6", form("600", "pm_card_authenticationRequired"))
		}},
		{"cancel again", func() rawResp {
			return post(t, srv, "/v1/payment_intents/"+ids["unconfirmed"]+"/cancel", acct, "c6", url.Values{})
		}},
		{"unconfirmed replay as created", func() rawResp {
			return post(t, srv, "/v1/payment_intents", acct, "k5", form("500", "pm_card_visa", "confirm", "false",
				"payment_method_types[1]", "link", "metadata[zz]", "last", "metadata[a1]", "first"))
		}},
		{"unconfirmed retrieve canceled", func() rawResp { return get(t, srv, "/v1/payment_intents/"+ids["unconfirmed"], acct) }},
		{"search", func() rawResp {
			return get(t, srv, "/v1/payment_intents/search?limit=2&query="+url.QueryEscape("metadata['merchant_id']:'m_1'"), acct)
		}},
		{"search page 2", func() rawResp {
			return get(t, srv, "/v1/payment_intents/search?limit=2&page=simpage_2&query="+url.QueryEscape("metadata['merchant_id']:'m_1' AND metadata['zz']:'last'"), acct)
		}},
		{"list", func() rawResp { return get(t, srv, "/v1/payment_intents?limit=3", acct) }},
		{"list after", func() rawResp { return get(t, srv, "/v1/payment_intents?limit=3&starting_after="+ids["bank"], acct) }},
		{"ledger", func() rawResp { return get(t, srv, "/_sim/ledger", "") }},
		{"expired", func() rawResp { clk.Advance(time.Hour); return rawResp{status: 0, header: http.Header{}} }},
		{"charge after expiry", func() rawResp { return post(t, srv, "/v1/payment_intents", acct, "k1", form("101", "pm_card_visa")) }},
	}
	for _, s := range steps {
		note(s.label, s.run())
	}

	ctx := context.Background()
	c := sim.Client(acct)
	outcome := func(label string, o *provider.Outcome, err error) {
		if o != nil {
			fmt.Fprintf(&out, "== client %s\n%s %s declined=%v code=%q processing=%v replayed=%v http=%d\n%s\n", label, o.ChargeID, o.Status,
				o.Declined, o.DeclineCode, o.Processing, o.Replayed, o.HTTPStatus, o.Response)
		} else {
			fmt.Fprintf(&out, "== client %s\nerror %v\n", label, err)
		}
	}
	req := provider.ChargeRequest{MerchantID: "m_2", IdempotencyKey: "ck", ProviderKey: "pk-1", Amount: 900, Currency: "eur",
		PaymentMethod: "pm_card_visa", Description: "client", Metadata: map[string]string{"order": "o-1"}}
	o, err := c.Charge(ctx, req)
	outcome("charge", o, err)
	first := ""
	if o != nil {
		first = o.ChargeID
	}
	o, err = c.Charge(ctx, req)
	outcome("charge replay", o, err)
	bad := req
	bad.Amount = 901
	o, err = c.Charge(ctx, bad)
	outcome("charge conflict", o, err)
	auth := req
	auth.ProviderKey, auth.IdempotencyKey, auth.PaymentMethod, auth.OnSession = "pk-2", "ck2", "pm_card_authenticationRequired", true
	o, err = c.Charge(ctx, auth)
	outcome("auth canceled", o, err)
	o, err = c.Charge(ctx, auth)
	outcome("auth canceled replay", o, err)
	o, err = c.Charge(ctx, provider.ChargeRequest{MerchantID: "m_1", IdempotencyKey: "k1", ProviderKey: "k1", Amount: 101, Currency: "usd",
		PaymentMethod: "pm_card_visa", Metadata: map[string]string{}})
	outcome("http key through the client", o, err)
	for _, lr := range []provider.LookupRequest{
		{MerchantID: "m_2", IdempotencyKey: "ck", ProviderKey: "pk-1", Amount: 900, Currency: "eur"},
		{MerchantID: "m_2", IdempotencyKey: "ck2", ProviderKey: "pk-2", Amount: 900, Currency: "eur"},
		{MerchantID: "m_2", IdempotencyKey: "ck", ProviderKey: "pk-1", Amount: 900, Currency: "eur", ChargeID: first},
		{MerchantID: "m_1", IdempotencyKey: "k1", ProviderKey: "k1", Amount: 100, Currency: "usd"},
		{MerchantID: "m_9", IdempotencyKey: "none", ProviderKey: "pk-9", Amount: 1, Currency: "usd"},
	} {
		res, err := c.Lookup(ctx, lr)
		if res.Outcome != nil {
			outcome(fmt.Sprintf("lookup %s found=%v", lr.IdempotencyKey, res.Found), res.Outcome, err)
		} else {
			fmt.Fprintf(&out, "== client lookup %s\nfound=%v error %v\n", lr.IdempotencyKey, res.Found, err)
		}
	}
	for in, err := range c.ListIntents(ctx, provider.ListRequest{From: time.Unix(0, 0), To: clk.Now().Add(time.Hour)}) {
		fmt.Fprintf(&out, "== client list\n%+v %v\n", in, err)
	}
	got, err := c.GetIntent(ctx, ids["bank closed"])
	fmt.Fprintf(&out, "== client get\n%+v %v\n", got, err)
	fmt.Fprintf(&out, "== charges\n%+v\n%v declines=%d\n", sim.Charges(), sim.ChargesByKey(), sim.Declines())

	const golden = "testdata/store_transcript.txt"
	if *updateGolden {
		if err := os.WriteFile(golden, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != string(want) {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("transcript differs at line %d:\n got %s\nwant %s", i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("transcript has %d lines, want %d", len(gl), len(wl))
	}
}

// BenchmarkSimRetainedPerPayment charges b.N payments as the bench does
// (distinct keys of one merchant, 68-character provider keys, a card that
// charges) through the Client and reports the heap the simulator keeps per
// payment once they are done: its intents, keys and indexes.
func BenchmarkSimRetainedPerPayment(b *testing.B) {
	sim := stripesim.New(stripesim.Config{Seed: 1})
	c := sim.Client("sk_test_bench")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	ctx := context.Background()
	for i := range b.N {
		key := fmt.Sprintf("p-%d", i)
		_, err := c.Charge(ctx, provider.ChargeRequest{MerchantID: "m_bench", IdempotencyKey: key,
			ProviderKey: fmt.Sprintf("pdk_%064x", i), Amount: int64(100 + i%1000), Currency: "usd",
			PaymentMethod: "pm_card_visa", Description: "bench"})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(b.N), "retained-B/payment")
	runtime.KeepAlive(sim)
}
