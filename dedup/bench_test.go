package dedup_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
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
		if err != nil || res.Outcome != ledger.Claimed {
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
		reqs := make([]ledger.ClaimRequest, size)
		for j := range reqs {
			reqs[j] = req("m_1", fmt.Sprintf("b-%d", n+j), 1000)
		}
		res, err := bb.store.ClaimBatch(bb.ctx, "bench", lease, reqs)
		if err != nil {
			b.Fatal(err)
		}
		items := make([]ledger.CompleteItem, size)
		for j, r := range res {
			if r.Outcome != ledger.Claimed {
				b.Fatalf("outcome %v", r.Outcome)
			}
			items[j] = ledger.CompleteItem{Lease: *r.Lease, Completion: charged(fmt.Sprintf("pi_%d", n+j))}
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
		_ = ledger.ProviderKey("m_1", "550e8400-e29b-41d4-a716-446655440000")
	}
}

// BenchmarkBackendCPU measures what the hot statements cost PostgreSQL:
// the CPU time of the one backend serving the store (from
// /proc/<pid>/schedstat, in nanoseconds, so a batch is resolved), per key,
// for a batch claim of new keys and its group commit, at the worker's
// batch sizes (in `paydedup bench` claims average about 60-80 keys and
// group commits about 110-155, `claim_batch_mean` and
// `commit_batch_mean`). Only on a server on this machine: it is skipped
// when the backend's /proc entry cannot be read.
func BenchmarkBackendCPU(b *testing.B) {
	for _, size := range []int{60, 200} {
		b.Run(fmt.Sprintf("batch%d", size), func(b *testing.B) {
			bb := setup(b)
			pool, pid := testenv.OneConn(b, bb.pool)
			cpu := func() time.Duration {
				raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
				if err != nil {
					b.Skipf("the server's backend is not readable here: %v", err)
				}
				ns, err := strconv.ParseInt(strings.Fields(string(raw))[0], 10, 64)
				if err != nil {
					b.Fatal(err)
				}
				return time.Duration(ns)
			}
			store, err := dedup.New(pool, dedup.Config{}) // the database's clock, as in production
			if err != nil {
				b.Fatal(err)
			}
			var claimCPU, completeCPU time.Duration
			n := 0
			for b.Loop() {
				reqs := make([]ledger.ClaimRequest, size)
				for j := range reqs {
					reqs[j] = req("m_1", fmt.Sprintf("550e8400-e29b-41d4-a716-%012d", n+j), 1999)
				}
				c0 := cpu()
				res, err := store.ClaimBatch(bb.ctx, "bench", lease, reqs)
				if err != nil {
					b.Fatal(err)
				}
				c1 := cpu()
				items := make([]ledger.CompleteItem, size)
				for j, r := range res {
					if r.Outcome != ledger.Claimed {
						b.Fatalf("outcome %v", r.Outcome)
					}
					id := fmt.Sprintf("pi_%024d", n+j)
					items[j] = ledger.CompleteItem{Lease: *r.Lease, Completion: ledger.Completion{ChargeID: id, ResponseStatus: 200, Response: intentResponse(id)}}
				}
				c2 := cpu()
				errs, err := store.CompleteBatch(bb.ctx, items)
				if err != nil {
					b.Fatal(err)
				}
				c3 := cpu()
				for _, e := range errs {
					if e != nil {
						b.Fatal(e)
					}
				}
				claimCPU += c1 - c0
				completeCPU += c3 - c2
				n += size
			}
			us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(n) }
			b.ReportMetric(us(claimCPU), "pg-claim-µs/key")
			b.ReportMetric(us(completeCPU), "pg-complete-µs/key")
			b.ReportMetric(us(claimCPU+completeCPU), "pg-µs/payment")
		})
	}
}

// BenchmarkRefundClaimComplete is the refund path's store cost: one
// claim (a transaction of four statements under the payment's lock) and
// one completion per refund, each its own round trip, on 2,000 charged
// payments refunded a cent at a time in turn. Compare with
// BenchmarkClaimComplete, a charge's claim and completion one by one.
func BenchmarkRefundClaimComplete(b *testing.B) {
	bb := setup(b)
	const payments = 2000
	reqs := make([]ledger.ClaimRequest, payments)
	for j := range reqs {
		reqs[j] = req("m_1", fmt.Sprintf("pay-%d", j), 1_000_000)
	}
	res, err := bb.store.ClaimBatch(bb.ctx, "bench", lease, reqs)
	if err != nil {
		b.Fatal(err)
	}
	items := make([]ledger.CompleteItem, payments)
	for j, r := range res {
		items[j] = ledger.CompleteItem{Lease: *r.Lease, Completion: charged(fmt.Sprintf("pi_%d", j))}
	}
	if _, err := bb.store.CompleteBatch(bb.ctx, items); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r := refundReq("m_1", fmt.Sprintf("r-%d", i), fmt.Sprintf("pay-%d", i%payments), 1)
		c, err := bb.store.ClaimRefund(bb.ctx, "bench", lease, r)
		if err != nil || c.Outcome != ledger.Claimed {
			b.Fatalf("claim refund: %+v %v", c, err)
		}
		if err := bb.store.CompleteRefund(bb.ctx, *c.Lease, refunded(fmt.Sprintf("re_%d", i))); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "refunds/s")
}

// BenchmarkCaptureClaimComplete is the capture path's store cost: one
// claim under the payment's lock and one completion (which moves the
// payment's ledger row and writes its event) per capture, each its own
// round trip. A capture happens once per authorization, so each 1,000
// iterations authorize 1,000 payments first, batched and off the clock.
func BenchmarkCaptureClaimComplete(b *testing.B) {
	bb := setup(b)
	const chunk = 1000
	authorize := func(from int) {
		reqs := make([]ledger.ClaimRequest, chunk)
		for j := range reqs {
			reqs[j] = authorizeReq("m_1", fmt.Sprintf("auth-%d", from+j), 1000)
		}
		res, err := bb.store.ClaimBatch(bb.ctx, "bench", lease, reqs)
		if err != nil {
			b.Fatal(err)
		}
		items := make([]ledger.CompleteItem, chunk)
		for j, r := range res {
			items[j] = ledger.CompleteItem{Lease: *r.Lease, Completion: authorized(fmt.Sprintf("pi_auth-%d", from+j), 1000)}
		}
		if _, err := bb.store.CompleteBatch(bb.ctx, items); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i%chunk == 0 {
			b.StopTimer()
			authorize(i)
			b.StartTimer()
		}
		c, err := bb.store.ClaimPaymentOp(bb.ctx, "bench", lease, opReq(payment.KindCapture, "m_1", fmt.Sprintf("cap-%d", i), fmt.Sprintf("auth-%d", i), 0))
		if err != nil || c.Outcome != ledger.Claimed {
			b.Fatalf("claim capture: %+v %v", c, err)
		}
		if err := bb.store.CompletePaymentOp(bb.ctx, *c.Lease, captured(1000)); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "captures/s")
}
