package pgstore_test

import (
	"testing"
	"time"

	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
)

// skewedStores returns a store on the database's clock (as production
// builds it) and one store per skew whose host clock is off by it, all on
// one schema.
func skewedStores(t *testing.T, skews ...time.Duration) (onTime *pgstore.Store, skewed []*pgstore.Store) {
	t.Helper()
	pool := testenv.Pool(t)
	onTime, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range skews {
		s, err := pgstore.New(pool, pgstore.Config{Clock: clock.System{Offset: d}})
		if err != nil {
			t.Fatal(err)
		}
		skewed = append(skewed, s)
	}
	return onTime, skewed
}

// TestSkewedClockGatewayLeases: the gateway's publish guard is a lease
// too. A gateway whose clock runs two minutes ahead does not take over a
// live publish lock, and one two minutes behind writes leases others
// respect.
func TestSkewedClockGatewayLeases(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	onTime, skewed := skewedStores(t, 2*time.Minute, -2*time.Minute)
	ahead, behind := skewed[0], skewed[1]
	const publishLease, retention = 30 * time.Second, time.Hour

	for _, tc := range []struct {
		name          string
		holder, other *pgstore.Store
	}{{"ahead", onTime, ahead}, {"behind", behind, onTime}} {
		r := req("m_1", "gw-"+tc.name, 100)
		if res, err := acquireOne(ctx, tc.holder, r, publishLease, retention); err != nil || res.Outcome != ledger.IntakeAcquired {
			t.Fatalf("%s: acquire intake: %v %v", tc.name, res.Outcome, err)
		}
		if res, err := acquireOne(ctx, tc.other, r, publishLease, retention); err != nil || res.Outcome != ledger.IntakeHeld {
			t.Errorf("%s: a second publisher on a live publish lock: %v %v, want held", tc.name, res.Outcome, err)
		}
	}
}
