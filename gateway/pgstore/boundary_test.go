package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/ledger"
)

// TestAPIKeyLabelBoundary: a label of exactly the limit is accepted and one
// byte more is not.
func TestAPIKeyLabelBoundary(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, _, err := b.store.CreateAPIKey(b.ctx, "m_1", strings.Repeat("l", 200)); err != nil {
		t.Errorf("label of 200 bytes: %v", err)
	}
	if _, _, err := b.store.CreateAPIKey(b.ctx, "m_1", strings.Repeat("l", 201)); err == nil {
		t.Error("label of 201 bytes accepted")
	}
}

// TestIntakeBoundaries: the gateway's intake refuses a zero lease, a
// retention no longer than the lease, and a zero purge limit, before any SQL.
func TestIntakeBoundaries(t *testing.T) {
	t.Parallel()
	s := unreachableStore(t)
	ctx := context.Background()
	r := req("m_1", "intake", 1000)
	for _, c := range []struct{ lease, retention time.Duration }{{0, time.Hour}, {time.Minute, time.Minute}} {
		if _, err := acquireOne(ctx, s, r, c.lease, c.retention); err == nil || errors.Is(err, ledger.ErrUnavailable) {
			t.Errorf("intake with lease %v, retention %v: %v, want refused before SQL", c.lease, c.retention, err)
		}
	}
	if _, err := s.PurgeIntakes(ctx, 0); err == nil || errors.Is(err, ledger.ErrUnavailable) {
		t.Errorf("purge intakes with limit 0: %v, want refused before SQL", err)
	}
	if _, err := acquireOne(ctx, s, r, time.Minute, time.Hour); !errors.Is(err, ledger.ErrUnavailable) {
		t.Errorf("a valid intake reached no database: %v, want ErrUnavailable", err)
	}
}

// unreachableStore is a store on a port where nothing listens: any SQL
// fails with ErrUnavailable.
func unreachableStore(t *testing.T) *pgstore.Store {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
