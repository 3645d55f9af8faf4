package pgstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/migrations/migrate"
)

// TestOperationIntakesDownRefuses: migration 00030's down would delete
// the door's guard rows of refunds of the rest (amount 0): a retry of one
// would then be published again. It refuses while one lives, naming the
// table and --allow-data-loss, and changes nothing; once they are gone it
// proceeds.
func TestOperationIntakesDownRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	owner, err := pg.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(owner.Close)
	m, err := migrate.NewMigrator(ctx, owner, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	version := func() int64 {
		st, err := m.Status(ctx)
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
	for version() > 30 {
		if _, err := m.Down(ctx); err != nil {
			t.Fatalf("down to 00030: %v", err)
		}
	}
	s, err := pgstore.New(owner, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// A refund of the rest's guard row, as the door of 00030 writes it.
	if _, err := owner.Exec(ctx, `INSERT INTO gateway_intake (merchant_id, idempotency_key, request_hash, amount, currency, attempt,
			locked_until, created_at, expires_at)
		VALUES ('m_1', 'ref-rest', sha256('r'), 0, '', 1, now() + interval '1 minute', now(), now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	_, err = m.Down(ctx)
	if err == nil {
		t.Fatal("down of 00030 deleted a refund's guard row without --allow-data-loss")
	}
	for _, want := range []string{"gateway_intake", "1 row", "--allow-data-loss"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("down of 00030: %v; want it to say %q", err, want)
		}
	}
	if v := version(); v != 30 {
		t.Fatalf("a refused down moved the version to %05d", v)
	}
	if _, err := s.GetIntake(ctx, "m_1", "ref-rest"); err != nil {
		t.Fatalf("the guard row after a refused down: %v", err)
	}
	if _, err := owner.Exec(ctx, `DELETE FROM gateway_intake`); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Down(ctx); err != nil {
		t.Fatalf("down of 00030 with no operation's row: %v", err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
}
