package dedup_test

import (
	"testing"
	"time"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
)

// skewedStores returns a store on the database's clock (as production
// builds it) and one store per skew whose host clock is off by it, all on
// one schema.
func skewedStores(t *testing.T, skews ...time.Duration) (onTime *dedup.Store, skewed []*dedup.Store) {
	t.Helper()
	pool := testenv.Pool(t)
	onTime, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range skews {
		s, err := dedup.New(pool, dedup.Config{Clock: clock.System{Offset: d}})
		if err != nil {
			t.Fatal(err)
		}
		skewed = append(skewed, s)
	}
	return onTime, skewed
}

// TestSkewedClockCannotTakeLiveLease: a worker whose clock runs two minutes
// ahead meets a live 30 s lease held by another worker. Lease times come
// from the database's clock, so the lease is live for it too: the claim says
// in flight and AcquireStuck leaves the row alone; the holder keeps its
// lease and completes.
func TestSkewedClockCannotTakeLiveLease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	onTime, skewed := skewedStores(t, 2*time.Minute)
	ahead := skewed[0]
	r := req("m_1", "skew-ahead", 1000)
	held, err := onTime.Claim(ctx, "holder", lease, r)
	if err != nil || held.Outcome != ledger.Claimed {
		t.Fatalf("claim: %v %v", held.Outcome, err)
	}

	res, err := ahead.Claim(ctx, "ahead", lease, r)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != ledger.InFlight {
		t.Errorf("a worker 2 min ahead claiming a live lease: %v, want in flight", res.Outcome)
	}
	if res.Outcome == ledger.InFlight && (res.RetryIn <= 0 || res.RetryIn > lease) {
		t.Errorf("retry in %v, want the lease's remaining time (at most %v)", res.RetryIn, lease)
	}
	stuck, err := ahead.AcquireStuck(ctx, "reconciler-ahead", 30*time.Second, lease, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(stuck) != 0 {
		t.Errorf("a reconciler 2 min ahead acquired %d live rows, want none", len(stuck))
	}
	if err := onTime.Complete(ctx, *held.Lease, charged("pi_skew")); err != nil {
		t.Errorf("the holder lost its lease to a skewed clock: %v", err)
	}
}

// TestSkewedClockBehindWritesFullLease: a worker whose clock runs two
// minutes behind takes a 30 s lease. The lease it writes is 30 s of the
// database's clock, not already expired, so no other worker or reconciler
// takes the row from it.
func TestSkewedClockBehindWritesFullLease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	onTime, skewed := skewedStores(t, -2*time.Minute)
	behind := skewed[0]
	r := req("m_1", "skew-behind", 1000)
	held, err := behind.Claim(ctx, "behind", lease, r)
	if err != nil || held.Outcome != ledger.Claimed {
		t.Fatalf("claim: %v %v", held.Outcome, err)
	}
	res, err := onTime.Claim(ctx, "other", lease, r)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != ledger.InFlight {
		t.Errorf("claim of a lease written by a worker 2 min behind: %v, want in flight", res.Outcome)
	}
	stuck, err := onTime.AcquireStuck(ctx, "reconciler", 30*time.Second, lease, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(stuck) != 0 {
		t.Errorf("the reconciler acquired %d rows leased by a worker 2 min behind, want none", len(stuck))
	}
	if err := behind.Complete(ctx, *held.Lease, charged("pi_behind")); err != nil {
		t.Errorf("the holder lost its lease: %v", err)
	}
}
