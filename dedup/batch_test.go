package dedup_test

import (
	"context"
	"testing"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/migrations/migrate"

	"github.com/paydedup/paydedup/lab/testenv"
)

func TestMigrateUpTwiceAndDown(t *testing.T) {
	t.Parallel()
	u := testenv.PostgresEmptyURL(t)
	ctx := context.Background()
	pool, err := pg.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	m, err := migrate.NewMigrator(ctx, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	applied, err := m.Up(ctx)
	if err != nil || len(applied) == 0 {
		t.Fatalf("first up: %v %v", applied, err)
	}
	again, err := m.Up(ctx)
	if err != nil || len(again) != 0 {
		t.Fatalf("second up applied %v (%v), want nothing", again, err)
	}
	st, err := m.Status(ctx)
	if err != nil || len(st) == 0 || !st[0].Applied {
		t.Fatalf("status %+v %v", st, err)
	}
	for range st { // roll every migration back, newest first
		if _, err := m.Down(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('idempotency_keys') IS NOT NULL`).Scan(&exists); err != nil || exists {
		t.Fatalf("idempotency_keys still exists after down (%v)", err)
	}
}

func TestSchemaRejectsBrokenStates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := b.claim(t, "a", req("m_1", "k", 1000)).Lease
	_ = l
	bad := map[string]string{
		"completed without response": `UPDATE idempotency_keys SET status = 'completed', locked_until = NULL, completed_at = now()`,
		"pending without lease":      `UPDATE idempotency_keys SET locked_until = NULL`,
		"failed with lease":          `UPDATE idempotency_keys SET status = 'failed'`,
		"unknown status":             `UPDATE idempotency_keys SET status = 'done'`,
		"provider key equals ours":   `UPDATE idempotency_keys SET provider_key = idempotency_key`,
	}
	for name, sql := range bad {
		if _, err := b.pool.Exec(b.ctx, sql); err == nil {
			t.Errorf("%s: the schema accepted it", name)
		}
	}
}
