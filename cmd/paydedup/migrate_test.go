package main

import (
	"context"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/internal/pg"

	"github.com/paydedup/paydedup/lab/testenv"
)

// migrateVersion is the highest applied migration, from "migrate status".
func migrateVersion(t *testing.T, env map[string]string) string {
	t.Helper()
	out, _, err := runCLI(context.Background(), env, "migrate", "status")
	if err != nil {
		t.Fatal(err)
	}
	v := "none"
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[1] == "applied" {
			v = f[0]
		}
	}
	return v
}

// TestMigrateDownRefusesToDestroyRows: with a ledger row and an API key,
// "migrate down" goes down until a step would drop them, then refuses,
// naming the flag, and changes nothing; --allow-data-loss goes all the way;
// an empty schema goes all the way without it.
func TestMigrateDownRefusesToDestroyRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "PAYDEDUP_LOG_LEVEL": "warn"}
	if _, _, err := runCLI(ctx, env, "apikey", "create", "--merchant", "m_1"); err != nil {
		t.Fatal(err)
	}
	pool, err := pg.Connect(ctx, env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `INSERT INTO payments (merchant_id, idempotency_key, provider_key, charge_id, status, amount, currency, created_at)
		VALUES ('m_1', 'k', 'pk_k', 'ch_1', 'succeeded', 100, 'usd', now())`); err != nil {
		t.Fatal(err)
	}
	rows := func() (ledger, keys int) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM payments), (SELECT count(*) FROM api_keys)`).Scan(&ledger, &keys); err != nil {
			t.Fatalf("the tables are gone: %v", err)
		}
		return ledger, keys
	}

	var refusal error
	for range 100 {
		before := migrateVersion(t, env)
		if before == "none" {
			t.Fatal("migrate down dropped the ledger and the API keys without --allow-data-loss")
		}
		if _, _, err := runCLI(ctx, env, "migrate", "down"); err != nil {
			if after := migrateVersion(t, env); after != before {
				t.Fatalf("a refused down moved the version from %s to %s", before, after)
			}
			refusal = err
			break
		}
	}
	if refusal == nil || !strings.Contains(refusal.Error(), "refusing") || !strings.Contains(refusal.Error(), "--allow-data-loss") {
		t.Fatalf("migrate down: %v; want a refusal naming --allow-data-loss", refusal)
	}
	if ledger, keys := rows(); ledger != 1 || keys != 1 {
		t.Fatalf("after the refusal: %d ledger rows, %d API keys; want 1 and 1", ledger, keys)
	}

	if _, _, err := runCLI(ctx, env, "migrate", "up", "--allow-data-loss"); err == nil || !strings.Contains(err.Error(), "only to migrate down") {
		t.Fatalf("migrate up --allow-data-loss: %v", err)
	}
	for range 100 {
		if migrateVersion(t, env) == "none" {
			break
		}
		if _, _, err := runCLI(ctx, env, "migrate", "down", "--allow-data-loss"); err != nil {
			t.Fatalf("migrate down --allow-data-loss: %v", err)
		}
	}
	if v := migrateVersion(t, env); v != "none" {
		t.Fatalf("still at %s after down --allow-data-loss", v)
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('payments') IS NOT NULL`).Scan(&exists); err != nil || exists {
		t.Fatalf("payments still exists (%v)", err)
	}

	empty := map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "PAYDEDUP_LOG_LEVEL": "warn"}
	for range 100 {
		if migrateVersion(t, empty) == "none" {
			break
		}
		if _, _, err := runCLI(ctx, empty, "migrate", "down"); err != nil {
			t.Fatalf("migrate down on empty tables: %v", err)
		}
	}
}
