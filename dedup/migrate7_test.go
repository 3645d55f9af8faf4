package dedup_test

import (
	"strings"
	"testing"

	"github.com/paydedup/paydedup/migrations"
)

// TestMigration7DownRefusesToLosePendingSince: rolling 00007 back would
// drop when pending rows became pending; its Down section refuses, naming
// what it would lose, unless paydedup.allow_data_loss is on. (The guard is
// run directly, so that later migrations do not change what is rolled back.)
func TestMigration7DownRefusesToLosePendingSince(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.claim(t, "w", req("m_1", "pending", 100))
	raw, err := migrations.FS.ReadFile("00007_pending_since.sql")
	if err != nil {
		t.Fatal(err)
	}
	_, down, ok := strings.Cut(string(raw), "-- +goose Down")
	_, guard, ok2 := strings.Cut(down, "-- +goose StatementBegin")
	guard, _, ok3 := strings.Cut(guard, "-- +goose StatementEnd")
	if !ok || !ok2 || !ok3 {
		t.Fatal("00007 has no guarded Down section")
	}
	for _, allow := range []bool{false, true} {
		tx, err := b.pool.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if allow {
			if _, err := tx.Exec(b.ctx, `SELECT set_config('paydedup.allow_data_loss', 'on', true)`); err != nil {
				t.Fatal(err)
			}
		}
		_, err = tx.Exec(b.ctx, guard)
		_ = tx.Rollback(b.ctx)
		switch {
		case !allow && (err == nil || !strings.Contains(err.Error(), "pending_since of 1 pending row")):
			t.Errorf("down with a pending row: %v, want a refusal naming pending_since", err)
		case allow && err != nil:
			t.Errorf("down with data loss allowed: %v", err)
		}
	}
}
