package dedup_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/ledger"
)

// TestBoundaries: the edge values of the store's input checks. A zero lease
// would claim a key already expired (any racer could take it over at once).
func TestBoundaries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, d := range []time.Duration{0, -time.Second} {
		if _, err := b.store.Claim(b.ctx, "a", d, req("m_1", "zero-lease", 1000)); err == nil || !strings.Contains(err.Error(), "lease must be positive") {
			t.Errorf("claim with lease %v: %v, want refused", d, err)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'zero-lease'`); n != 0 {
		t.Errorf("%d rows after refused claims", n)
	}
	// A stored response status is an HTTP status: 100..599.
	for status, ok := range map[int]bool{99: false, 100: true, 599: true, 600: false} {
		l := b.claim(t, "a", req("m_1", "status-"+strconv.Itoa(status), 1000)).Lease
		c := charged("pi_status_" + strconv.Itoa(status))
		c.ResponseStatus = status
		err := b.store.Complete(b.ctx, *l, c)
		if ok != (err == nil) {
			t.Errorf("complete with response status %d: %v", status, err)
		}
		l2 := b.claim(t, "a", req("m_1", "batch-status-"+strconv.Itoa(status), 1000)).Lease
		c.ChargeID = "pi_batch_status_" + strconv.Itoa(status)
		_, err = b.store.CompleteBatch(b.ctx, []ledger.CompleteItem{{Lease: *l2, Completion: c}})
		if ok != (err == nil) {
			t.Errorf("batch complete with response status %d: %v", status, err)
		}
	}
	// The reconciler's acquire needs a positive lease and limit; a zero
	// grace is valid.
	for _, c := range []struct {
		grace, lease time.Duration
		limit        int
		ok           bool
	}{{0, lease, 1, true}, {-time.Second, lease, 1, false}, {0, 0, 1, false}, {0, lease, 0, false}} {
		if _, err := b.store.AcquireStuck(b.ctx, "rec", c.grace, c.lease, c.limit); c.ok != (err == nil) {
			t.Errorf("acquire stuck with grace %v, lease %v, limit %d: %v", c.grace, c.lease, c.limit, err)
		}
	}
	if _, err := b.store.Purge(b.ctx, 0); err == nil {
		t.Error("purge with limit 0 accepted")
	}
}

// TestHeartbeatReturnsItsLease: a heartbeat returns the lease extended to
// now+d, and a heartbeat the database did not answer is an error, never a
// lease the caller believes extended.
func TestHeartbeatReturnsItsLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := *b.claim(t, "a", req("m_1", "beat", 1000)).Lease
	b.clock.Advance(10 * time.Second)
	got, err := b.store.Heartbeat(b.ctx, l, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if want := b.clock.Now().Add(time.Minute); !got.Until.Equal(want) {
		t.Errorf("heartbeat returned until %v, want %v", got.Until, want)
	}

	down := unreachableStore(t)
	if _, err := down.Heartbeat(context.Background(), l, time.Minute); !errors.Is(err, ledger.ErrUnavailable) {
		t.Errorf("heartbeat with the database down: %v, want ErrUnavailable", err)
	}
}

// unreachableStore is a store on a port where nothing listens: any SQL
// fails with ErrUnavailable.
func unreachableStore(t *testing.T) *dedup.Store {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
