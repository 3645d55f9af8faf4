package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/audit"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
)

// TestAuditCommand runs `paydedup audit` on Postgres and the simulator
// (over HTTP, through STRIPE_API_BASE): a clean ledger exits 0 and says so;
// a double charge planted straight at the simulator exits non-zero with the
// drift named, in text and in JSON.
func TestAuditCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testenv.PostgresURL(t)
	pool, err := pg.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sim := stripesim.New(stripesim.Config{Seed: 3})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	const key = "sk_test_audit_cmd"
	st, err := stripe.New(stripe.Config{SecretKey: key, APIBase: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.CloseIdleConnections)

	cmds := make([]*payment.Command, 5)
	for i := range cmds {
		cmds[i] = &payment.Command{MerchantID: "m_cli", IdempotencyKey: fmt.Sprintf("cli-%d", i), Amount: 500, Currency: "usd", PaymentMethod: "pm_card_visa"}
		res, err := store.Claim(ctx, "w", time.Minute, ledger.NewClaimRequest(cmds[i]))
		if err != nil || res.Lease == nil {
			t.Fatalf("claim: %+v %v", res, err)
		}
		out, err := st.Charge(ctx, provider.ChargeRequest{ProviderKey: res.Lease.ProviderKey, MerchantID: "m_cli",
			IdempotencyKey: cmds[i].IdempotencyKey, Amount: 500, Currency: "usd", PaymentMethod: "pm_card_visa"})
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Complete(ctx, *res.Lease, ledger.Completion{ChargeID: out.ChargeID, ResponseStatus: out.HTTPStatus, Response: out.Response}); err != nil {
			t.Fatal(err)
		}
	}
	env := map[string]string{"DATABASE_URL": dbURL, "PAYDEDUP_PROVIDER": "stripe", "STRIPE_SECRET_KEY": key,
		"STRIPE_API_BASE": srv.URL, "PAYDEDUP_LOG_LEVEL": "warn"}

	out, _, err := runCLI(ctx, env, "audit", "--since", "1h", "--until", "0")
	if err != nil {
		t.Fatalf("clean audit: %v\n%s", err, out)
	}
	if !strings.Contains(out, "5 intents of ours") || !strings.Contains(out, "audit: no drift") {
		t.Fatalf("clean audit printed:\n%s", out)
	}

	// A second intent for cli-2, straight at the simulator under another
	// provider key, with our metadata.
	if _, err := sim.Client(key).Charge(ctx, provider.ChargeRequest{ProviderKey: "planted", MerchantID: "m_cli",
		IdempotencyKey: "cli-2", Amount: 500, Currency: "usd", PaymentMethod: "pm_card_visa"}); err != nil {
		t.Fatal(err)
	}
	out, _, err = runCLI(ctx, env, "audit", "--since", "1h", "--until", "0")
	if !errors.Is(err, audit.ErrDrift) || !strings.Contains(err.Error(), "DRIFT") || !strings.Contains(err.Error(), "1 double_charge") {
		t.Fatalf("audit of a double charge: err %v", err)
	}
	if !strings.Contains(out, "double_charge  critical  m_cli     cli-2") {
		t.Errorf("the table does not name the double charge:\n%s", out)
	}
	out, _, err = runCLI(ctx, env, "audit", "--since", "1h", "--until", "0", "--json")
	if !errors.Is(err, audit.ErrDrift) {
		t.Fatalf("--json: %v", err)
	}
	var rep audit.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json printed %q: %v", out, err)
	}
	if len(rep.Findings) != 1 || rep.Findings[0].Kind != audit.DoubleCharge || rep.Findings[0].Severity != audit.Critical ||
		len(rep.Findings[0].IntentIDs) != 2 {
		t.Errorf("--json findings %+v", rep.Findings)
	}
	// Another merchant's audit is clean.
	if out, _, err := runCLI(ctx, env, "audit", "--since", "1h", "--until", "0", "--merchant", "m_else"); err != nil {
		t.Errorf("--merchant m_else: %v\n%s", err, out)
	}
}

// TestAuditCommandRefusesBadFlags: each bad window names what to fix.
func TestAuditCommandRefusesBadFlags(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/db", "PAYDEDUP_PROVIDER": "stripe",
		"STRIPE_SECRET_KEY": "sk_test_x", "PAYDEDUP_LOG_LEVEL": "error"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--since", "yesterday"}, "--since"},
		{[]string{"--until", "-5m"}, "--until"},
		{[]string{"--since", "1h", "--until", "2h"}, "window is empty"},
		{[]string{"--margin", "0"}, "--margin"},
		{[]string{"--every", "-1h"}, "--every"},
	} {
		_, _, err := runCLI(context.Background(), env, append([]string{"audit"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("audit %v: %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
}

// Without STRIPE_SECRET_KEY, audit and reconcile name the key (and
// STRIPE_API_BASE for a stand-in) and never suggest the simulator: it
// starts empty, so audit would report every ledger row missing_intent. The
// worker may still suggest it, for a demo.
func TestLedgerReadersNameTheStripeKey(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/db", "PAYDEDUP_LOG_LEVEL": "error"}
	for _, cmd := range []string{"audit", "reconcile"} {
		_, _, err := runCLI(context.Background(), env, cmd)
		if err == nil || !strings.Contains(err.Error(), "STRIPE_SECRET_KEY") || !strings.Contains(err.Error(), "STRIPE_API_BASE") ||
			strings.Contains(err.Error(), "PAYDEDUP_PROVIDER=sim") {
			t.Errorf("%s without STRIPE_SECRET_KEY: %v, want STRIPE_SECRET_KEY and STRIPE_API_BASE named, the simulator not suggested", cmd, err)
		}
	}
	_, _, err := runCLI(context.Background(), env, "worker")
	if err == nil || !strings.Contains(err.Error(), "STRIPE_SECRET_KEY") || !strings.Contains(err.Error(), "STRIPE_API_BASE") {
		t.Errorf("worker without STRIPE_SECRET_KEY: %v", err)
	}
}
