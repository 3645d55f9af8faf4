package dedup_test

import (
	"fmt"
	"testing"

	"github.com/paydedup/paydedup/dedup"
)

// BenchmarkClaimComplete is the seeds' design: one claim and one complete
// per payment, each its own round trip and transaction.
func BenchmarkClaimComplete(b *testing.B) {
	bb := setup(b)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r := req("m_1", fmt.Sprintf("b-%d", i), 1000)
		res, err := bb.store.Claim(bb.ctx, "bench", lease, r)
		if err != nil || res.Outcome != dedup.Claimed {
			b.Fatalf("claim: %v %v", res.Outcome, err)
		}
		if err := bb.store.Complete(bb.ctx, *res.Lease, charged(fmt.Sprintf("pi_%d", i))); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "payments/s")
}

// BenchmarkClaimCompleteBatch100 claims 100 payments in one statement and
// completes them in one group commit.
func BenchmarkClaimCompleteBatch100(b *testing.B) {
	bb := setup(b)
	b.ReportAllocs()
	const size = 100
	n := 0
	for b.Loop() {
		reqs := make([]dedup.ClaimRequest, size)
		for j := range reqs {
			reqs[j] = req("m_1", fmt.Sprintf("b-%d", n+j), 1000)
		}
		res, err := bb.store.ClaimBatch(bb.ctx, "bench", lease, reqs)
		if err != nil {
			b.Fatal(err)
		}
		items := make([]dedup.CompleteItem, size)
		for j, r := range res {
			if r.Outcome != dedup.Claimed {
				b.Fatalf("outcome %v", r.Outcome)
			}
			items[j] = dedup.CompleteItem{Lease: *r.Lease, Completion: charged(fmt.Sprintf("pi_%d", n+j))}
		}
		errs, err := bb.store.CompleteBatch(bb.ctx, items)
		if err != nil {
			b.Fatal(err)
		}
		for _, e := range errs {
			if e != nil {
				b.Fatal(e)
			}
		}
		n += size
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "payments/s")
}

// BenchmarkProviderKey derives one provider key, as the claim does for
// every payment of a batch.
func BenchmarkProviderKey(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = dedup.ProviderKey("m_1", "550e8400-e29b-41d4-a716-446655440000")
	}
}
