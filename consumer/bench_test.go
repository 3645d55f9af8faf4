package consumer_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/provider"
)

// instantCharger charges at once, with a fixed answer: a benchmark's
// charger whose own cost is one string per payment, so the allocations
// counted are the worker's.
type instantCharger struct{}

var instantResponse = []byte(`{"id":"ch","status":"succeeded"}`)

func (instantCharger) Charge(_ context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	return &provider.Outcome{ChargeID: "ch_" + req.ProviderKey, Status: "succeeded", HTTPStatus: 200, Response: instantResponse}, nil
}

// BenchmarkWorkerPayment times the worker as shipped (batch fetch, one
// claim per batch, the call limit, group commits, DoubleAck) consuming b.N
// payments published first, on the shared NATS server and Postgres, with
// a charger that answers at once. NATS and Postgres run out of process, so
// allocs/op is the worker's own allocations per payment (plus the
// charger's one string and the wait's polling), and cpu-us/payment the
// process's CPU time (user and system) per payment; run it with a fixed
// count, e.g. -bench WorkerPayment -benchtime 20000x.
func BenchmarkWorkerPayment(b *testing.B) {
	e := setup(b)
	e.cfg.Concurrency, e.cfg.FetchBatch = 256, 200
	e.waitStreamsCreate()
	for i := range b.N {
		m := nats.NewMsg(e.cfg.Stream.SubjectPrefix + ".m_1")
		m.Data = body("m_1", fmt.Sprintf("bench-%d", i), 100)
		if _, err := e.js.PublishMsgAsync(m); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-e.js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("publishing did not complete")
	}
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), processCPU(b)
	stop := e.startWorker("bench", instantCharger{})
	e.eventually("all completed", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == b.N
	})
	e.quiescent()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "payments/s")
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-us/payment")
	stop()
}

// processCPU is the process's user and system CPU time so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
