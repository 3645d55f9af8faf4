package dedup_test

import (
	"context"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/migrations/migrate"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/lab/testenv"
)

// migrator connects to the schema of url as its owner and opens a
// migrator on it, both closed when the test ends.
func migrator(t *testing.T, url string) (*pgxpool.Pool, *migrate.Migrator) {
	t.Helper()
	owner, err := pg.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(owner.Close)
	m, err := migrate.NewMigrator(context.Background(), owner, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return owner, m
}

// appliedVersion is the highest applied migration.
func appliedVersion(t *testing.T, m *migrate.Migrator) int64 {
	t.Helper()
	st, err := m.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var v int64
	for _, s := range st {
		if s.Applied {
			v = max(v, s.Version)
		}
	}
	return v
}

// count returns the rows of a query's first column (a count).
func count(t *testing.T, pool *pgxpool.Pool, sql string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// downTo rolls back, without --allow-data-loss, until version is the
// highest applied; it fails the test if a step refuses.
func downTo(t *testing.T, m *migrate.Migrator, version int64) {
	t.Helper()
	for appliedVersion(t, m) > version {
		if _, err := m.Down(context.Background()); err != nil {
			t.Fatalf("down on empty tables: %v", err)
		}
	}
}

// refuses asserts that one Down step fails naming every one of want and
// changes nothing: the version stays.
func refuses(t *testing.T, m *migrate.Migrator, want ...string) {
	t.Helper()
	before := appliedVersion(t, m)
	_, err := m.Down(context.Background())
	if err == nil {
		t.Fatalf("down of %05d destroyed rows without --allow-data-loss", before)
	}
	for _, w := range append(want, "--allow-data-loss") {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("down of %05d: %v; want it to say %q", before, err, w)
		}
	}
	if after := appliedVersion(t, m); after != before {
		t.Fatalf("a refused down moved the version from %05d to %05d", before, after)
	}
}

// TestDownRefusesToDestroyRows walks the migrations down with data in every
// table a Down would drop: each such step refuses, naming the table (or
// column), its row count and what would be lost, and leaves the schema and
// its rows as they were; once the rows are gone it proceeds, and
// --allow-data-loss proceeds over rows. The rows are written with the
// columns of migrations 00001-00004, at version 00005, so later migrations
// do not change what is tested here.
func TestDownRefusesToDestroyRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, m := migrator(t, testenv.PostgresURL(t))
	downTo(t, m, 5)
	exec := func(sql string) {
		t.Helper()
		if _, err := owner.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`INSERT INTO idempotency_keys (merchant_id, idempotency_key, request_hash, status, provider_key, amount, currency,
		response_status, response, key_window_start, created_at, updated_at, completed_at, expires_at, trace_id)
		VALUES ('m_1', 'k', sha256('k'), 'completed', 'pk_k', 100, 'usd', 200, '{}', now(), now(), now(), now(), now() + interval '1 day',
		        '0123456789abcdef0123456789abcdef'),
		       ('m_1', 'k2', sha256('k2'), 'failed', 'pk_k2', 100, 'usd', NULL, NULL, now(), now(), now(), NULL, now() + interval '1 day', NULL)`)
	exec(`INSERT INTO payments (merchant_id, idempotency_key, provider_key, charge_id, status, amount, currency, created_at)
		VALUES ('m_1', 'k', 'pk_k', 'ch_1', 'succeeded', 100, 'usd', now())`)
	exec(`INSERT INTO api_keys (id, merchant_id, key_hash, created_at) VALUES ('0123456789ab', 'm_1', sha256('secret'), now())`)
	exec(`INSERT INTO gateway_intake (merchant_id, idempotency_key, request_hash, amount, currency, locked_until, created_at, expires_at)
		VALUES ('m_1', 'k', sha256('k'), 100, 'usd', now(), now(), now() + interval '1 day')`)
	exec(`INSERT INTO http_idempotency (scope, idempotency_key, request_hash, status, created_at, updated_at, expires_at)
		VALUES ('acct_1 /orders', 'k', sha256('k'), 'failed', now(), now(), now() + interval '1 day')`)

	downTo(t, m, 4) // 00005 only swaps a trigger

	// 00004: a trace id is sent with every provider call under the key.
	refuses(t, m, "idempotency_keys.trace_id", "1 of its rows", "idempotency mismatch")
	if n := count(t, owner, `SELECT count(*) FROM idempotency_keys WHERE trace_id IS NOT NULL`); n != 1 {
		t.Fatalf("%d trace ids left, want 1", n)
	}
	exec(`UPDATE idempotency_keys SET trace_id = NULL`)
	downTo(t, m, 3)

	// 00003: API keys, the gateway's guard rows, stored responses.
	refuses(t, m, "api_keys", "gateway_intake", "http_idempotency", "re-keyed")
	for _, table := range []string{"api_keys", "gateway_intake", "http_idempotency"} {
		if n := count(t, owner, `SELECT count(*) FROM `+table); n != 1 {
			t.Fatalf("%s has %d rows after a refused down, want 1", table, n)
		}
	}
	exec(`DELETE FROM api_keys`)
	refuses(t, m, "gateway_intake", "http_idempotency")
	exec(`DELETE FROM gateway_intake`)
	exec(`DELETE FROM http_idempotency`)
	downTo(t, m, 1) // 00002 drops grants only

	// 00001: the ledger and the keys.
	refuses(t, m, "payments", "1 row", "idempotency_keys", "2 rows", "charge again")
	if n := count(t, owner, `SELECT count(*) FROM payments`); n != 1 {
		t.Fatalf("the ledger has %d rows after a refused down, want 1", n)
	}

	allow, err := migrate.NewMigratorWith(ctx, owner, migrate.MigratorConfig{AllowDataLoss: true})
	if err != nil {
		t.Fatal(err)
	}
	defer allow.Close()
	if v, err := allow.Down(ctx); err != nil || v != 1 {
		t.Fatalf("down --allow-data-loss: %d %v", v, err)
	}
	if n := count(t, owner, `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename IN ('payments', 'idempotency_keys')`); n != 0 {
		t.Fatalf("%d tables left after down --allow-data-loss", n)
	}
	// The setting stays on the migrator's own connections: the pool it
	// was built from never sees it.
	var setting string
	if err := owner.QueryRow(ctx, `SELECT coalesce(current_setting('paydedup.allow_data_loss', true), '')`).Scan(&setting); err != nil || setting == "on" {
		t.Fatalf("the pool's connections allow data loss: %q %v", setting, err)
	}
}

// TestDownOverDataWithAllowDataLoss: with --allow-data-loss every step
// proceeds over rows, down to nothing, and up rebuilds the schema.
func TestDownOverDataWithAllowDataLoss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, err := pg.Connect(ctx, testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	store, err := dedup.New(owner, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Exec(ctx, `INSERT INTO api_keys (id, merchant_id, key_hash, created_at) VALUES ('0123456789ab', 'm_1', sha256('k'), now())`); err != nil {
		t.Fatal(err)
	}
	r := req("m_1", "k", 100)
	r.TraceID = "0123456789abcdef0123456789abcdef"
	cl, err := store.Claim(ctx, "h", lease, r)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(ctx, *cl.Lease, charged("ch_1")); err != nil {
		t.Fatal(err)
	}
	m, err := migrate.NewMigratorWith(ctx, owner, migrate.MigratorConfig{AllowDataLoss: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for appliedVersion(t, m) > 0 {
		if _, err := m.Down(ctx); err != nil {
			t.Fatalf("down --allow-data-loss: %v", err)
		}
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, owner, `SELECT count(*) FROM payments`); n != 0 {
		t.Fatalf("%d ledger rows after down and up", n)
	}
}

// TestDownOnEmptyTablesNeedsNoFlag: a schema without rows goes all the way
// down without --allow-data-loss.
func TestDownOnEmptyTablesNeedsNoFlag(t *testing.T) {
	t.Parallel()
	_, m := migrator(t, testenv.PostgresURL(t))
	downTo(t, m, 0)
}
