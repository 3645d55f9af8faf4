package dedup_test

import (
	"strings"
	"testing"
	"time"
)

// TestBoundaries: the edge values of the store's input checks. A zero lease
// would claim a key already expired (any racer could take it over at once);
// a label of exactly the limit is accepted and one byte more is not.
func TestBoundaries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, d := range []time.Duration{0, -time.Second} {
		if _, err := b.store.Claim(b.ctx, "a", d, req("m_1", "zero-lease", 1000)); err == nil || !strings.Contains(err.Error(), "lease must be positive") {
			t.Errorf("claim with lease %v: %v, want refused", d, err)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM idempotency_keys`); n != 0 {
		t.Errorf("%d rows after refused claims", n)
	}
	if _, _, err := b.store.CreateAPIKey(b.ctx, "m_1", strings.Repeat("l", 200)); err != nil {
		t.Errorf("label of 200 bytes: %v", err)
	}
	if _, _, err := b.store.CreateAPIKey(b.ctx, "m_1", strings.Repeat("l", 201)); err == nil {
		t.Error("label of 201 bytes accepted")
	}
}
