package reconciler_test

import (
	"context"
	"testing"
	"time"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/reconciler"
)

// TestSkewedReconcilerLeavesLiveCall: a reconciler whose host clock runs two
// minutes ahead, against a worker's live 30 s lease, with a lag of 60 s:
// by its own clock the lease expired 90 s ago. Lease times come from the
// database's clock, so it does not take the row, and never declares the
// call in progress not charged.
func TestSkewedReconcilerLeavesLiveCall(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testenv.Pool(t)
	worker, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ahead := clock.System{Offset: 2 * time.Minute}
	skewed, err := dedup.New(pool, dedup.Config{Clock: ahead})
	if err != nil {
		t.Fatal(err)
	}
	res, err := worker.Claim(ctx, "worker", workerLease, ledger.NewClaimRequest(command("live-call")))
	if err != nil || res.Outcome != ledger.Claimed {
		t.Fatalf("claim: %v %v", res.Outcome, err)
	}
	nothing := lookerFunc(func(context.Context, provider.LookupRequest) (provider.LookupResult, error) {
		return provider.LookupResult{}, nil // the charge is still in flight
	})
	r, err := reconciler.New(skewed, nothing, reconciler.Config{Grace: 30 * time.Second, SearchLag: time.Minute, Clock: ahead})
	if err != nil {
		t.Fatal(err)
	}
	run, err := r.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if run.Examined != 0 || run.Failed != 0 {
		t.Errorf("a reconciler 2 min ahead: %+v, want the live row untouched", run)
	}
	rec, err := worker.Get(ctx, merchant, "live-call")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != ledger.StatusPending || rec.LockedBy != "worker" {
		t.Errorf("row %s held by %q, want pending under the worker", rec.Status, rec.LockedBy)
	}
	if err := worker.Complete(ctx, *res.Lease, ledger.Completion{ChargeID: "pi_live", ResponseStatus: 200, Response: []byte(`{}`)}); err != nil {
		t.Errorf("the worker lost its lease: %v", err)
	}
}
