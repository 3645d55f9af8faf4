package dedup_test

import "testing"

// TestSchemaRejectsFailedMaybeCharged: `failed` means provably not charged,
// so the schema refuses a failed row that may have charged.
func TestSchemaRejectsFailedMaybeCharged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := b.claim(t, "a", req("m_1", "k", 1000)).Lease
	if _, err := b.store.Fail(b.ctx, *l, "429"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE idempotency_keys SET maybe_charged = true`); err == nil {
		t.Fatal("the schema accepted a failed row marked maybe_charged")
	}
}
