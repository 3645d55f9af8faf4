package consumer_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
)

// slowCharger is an in-process provider that answers each charge after a
// latency (latency()), and counts the calls in flight and the calls per
// provider key.
type slowCharger struct {
	latency func() time.Duration

	inflight, peak atomic.Int64
	mu             sync.Mutex
	calls          map[string]int
}

func newSlowCharger(latency func() time.Duration) *slowCharger {
	return &slowCharger{latency: latency, calls: map[string]int{}}
}

func (c *slowCharger) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	n := c.inflight.Add(1)
	defer c.inflight.Add(-1)
	for p := c.peak.Load(); n > p && !c.peak.CompareAndSwap(p, n); p = c.peak.Load() {
	}
	t := time.NewTimer(c.latency())
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return nil, &provider.Error{Class: provider.ClassUnknown, Err: ctx.Err()}
	}
	c.mu.Lock()
	c.calls[req.ProviderKey]++
	c.mu.Unlock()
	return &provider.Outcome{ChargeID: "ch_" + req.ProviderKey, Status: "succeeded", HTTPStatus: 200, Response: instantResponse}, nil
}

// logNormal300 is the provider: median 300 ms, p99 about 900 ms.
func logNormal300() time.Duration {
	return time.Duration(float64(300*time.Millisecond) * math.Exp(math.Log(3)/2.326*rand.NormFloat64()))
}

// defaults gives the worker every default setting (but the test's own
// streams).
func (e *env) defaults() {
	s := e.cfg.Stream
	s.AckWait, s.MaxDeliver = 0, 0
	e.cfg = consumer.Config{Stream: s}
}

// publishBacklog publishes n payments of one merchant before any worker
// runs.
func (e *env) publishBacklog(prefix string, n int) {
	e.t.Helper()
	e.waitStreamsCreate()
	for i := range n {
		m := nats.NewMsg(e.cfg.Stream.SubjectPrefix + ".m_1")
		m.Data = body("m_1", fmt.Sprintf("%s-%d", prefix, i), 100)
		if _, err := e.js.PublishMsgAsync(m); err != nil {
			e.t.Fatal(err)
		}
	}
	select {
	case <-e.js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		e.t.Fatal("publishing did not complete")
	}
}

// TestDefaultWorkerFollowsSlowProvider: with its defaults, one worker
// against a provider answering in 300 ms grows its calls in flight far
// past the old fixed 64 (which capped it near 200 payments/s), and
// charges every payment once.
func TestDefaultWorkerFollowsSlowProvider(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.defaults()
	const n = 4000
	e.publishBacklog("slow", n)
	c := newSlowCharger(func() time.Duration { return 300 * time.Millisecond })
	start := time.Now()
	e.startWorker("slow", c)
	e.eventually("all completed", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == n
	})
	rate := n / time.Since(start).Seconds()
	e.quiescent()
	t.Logf("peak %d calls in flight, %.0f payments/s", c.peak.Load(), rate)
	if p := c.peak.Load(); p <= 300 {
		t.Errorf("at most %d calls in flight, want more than 300", p)
	}
	// The old fixed 64 calls in flight capped it at 64 / 0.3 s = 213/s.
	if rate < 250 {
		t.Errorf("%.0f payments/s, want more than 250", rate)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.calls) != n {
		t.Errorf("%d provider keys charged, want %d", len(c.calls), n)
	}
	for k, calls := range c.calls {
		if calls != 1 {
			t.Errorf("provider key %s charged %d times", k, calls)
		}
	}
}

// BenchmarkWorkerSlowProvider runs one worker with its defaults against an
// in-process provider answering with a median of 300 ms and a p99 of about
// 900 ms (log-normal), on b.N payments published first, and reports
// payments/s, the peak of calls in flight, the process's peak RSS over the
// drain and its growth per call in flight. Run it with a fixed count, e.g.
// -bench WorkerSlowProvider -benchtime 20000x.
func BenchmarkWorkerSlowProvider(b *testing.B) {
	e := setup(b)
	e.defaults()
	e.publishBacklog("bench", b.N)
	c := newSlowCharger(logNormal300)
	// The peak RSS from here on (clear_refs 5 resets VmHWM).
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	baseRSS := procStatusKB(b, "VmRSS")
	b.ResetTimer()
	start := time.Now()
	stop := e.startWorker("bench", c)
	e.eventually("all completed", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == b.N
	})
	e.quiescent()
	b.StopTimer()
	peakRSS := procStatusKB(b, "VmHWM")
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "payments/s")
	b.ReportMetric(float64(c.peak.Load()), "peak-in-flight")
	b.ReportMetric(float64(peakRSS)/1024, "peak-rss-MB")
	b.ReportMetric(float64(peakRSS-baseRSS)/float64(max(c.peak.Load(), 1)), "rss-KB/call")
	stop()
}

// BenchmarkWorkerSlowProviderHTTP is BenchmarkWorkerSlowProvider through
// the Stripe adapter, over TLS and HTTP/1.1 (a connection per call in
// flight), to the simulator answering in 250–350 ms in the same process:
// its RSS per call in flight counts the client's connection and TLS state
// and the server's too, an upper bound of the worker's own.
func BenchmarkWorkerSlowProviderHTTP(b *testing.B) {
	e := setup(b)
	e.defaults()
	sim := stripesim.New(stripesim.Config{Seed: 7, Faults: stripesim.Faults{Latency: 250 * time.Millisecond, Jitter: 100 * time.Millisecond}})
	b.Cleanup(sim.Close)
	srv := httptest.NewTLSServer(sim)
	b.Cleanup(srv.Close)
	tr := stripe.NewTransport()
	tr.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig
	adapter, err := stripe.New(stripe.Config{SecretKey: "sk_test_paydedup", APIBase: srv.URL, HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(adapter.CloseIdleConnections)
	e.publishBacklog("bench", b.N)
	var peak atomic.Int64
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	baseRSS := procStatusKB(b, "VmRSS")
	b.ResetTimer()
	start := time.Now()
	proc := consumer.NewProcessor(e.store, adapter, e.cfg, nil)
	e.cfg.Holder = "bench"
	w, err := consumer.NewWorker(e.nc, proc, e.cfg, nil, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	e.eventually("all completed", func() bool {
		peak.Store(max(peak.Load(), int64(proc.CallLimit().Peak)))
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == b.N
	})
	e.quiescent()
	b.StopTimer()
	peakRSS := procStatusKB(b, "VmHWM")
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "payments/s")
	b.ReportMetric(float64(peak.Load()), "peak-in-flight")
	b.ReportMetric(float64(peakRSS)/1024, "peak-rss-MB")
	b.ReportMetric(float64(peakRSS-baseRSS)/float64(max(peak.Load(), 1)), "rss-KB/call")
	cancel()
	if err := <-done; err != nil {
		b.Error(err)
	}
}

// BenchmarkWorkerSlowProviderPaced publishes to one worker with its
// defaults at a steady 1,000 payments/s against the in-process provider
// of BenchmarkWorkerSlowProvider (log-normal, median 300 ms, p99 ~900 ms):
// 10,000 payments to warm it up (its limit grows, and the backlog of its
// first seconds drains), then b.N measured. It reports publish →
// charged (the row's completed_at) p50 and p99 of the measured ones, the
// provider's own p99 over them, and the overhead of the one over the
// other. Run it with a fixed count, e.g. -benchtime 10000x.
func BenchmarkWorkerSlowProviderPaced(b *testing.B) {
	e := setup(b)
	e.defaults()
	var mu sync.Mutex
	var own []time.Duration
	c := newSlowCharger(func() time.Duration {
		d := logNormal300()
		mu.Lock()
		own = append(own, d)
		mu.Unlock()
		return d
	})
	e.waitStreamsCreate()
	proc := consumer.NewProcessor(e.store, c, e.cfg, nil)
	cfg := e.cfg
	cfg.Holder = "bench"
	w, err := consumer.NewWorker(e.nc, proc, cfg, nil, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if os.Getenv("PAYDEDUP_TRACE_LIMIT") != "" {
		go func() {
			for ctx.Err() == nil {
				time.Sleep(250 * time.Millisecond)
				fmt.Fprintf(os.Stderr, "%+v\n", proc.CallLimit())
			}
		}()
	}
	const warm, rate = 10000, 1000
	published := make(map[string]time.Time, b.N)
	publish := func(prefix string, n int, record bool) {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; i < n; {
			<-tick.C
			for j := 0; j < rate/100 && i < n; i, j = i+1, j+1 {
				key := fmt.Sprintf("%s-%d", prefix, i)
				m := nats.NewMsg(e.cfg.Stream.SubjectPrefix + ".m_1")
				m.Data = body("m_1", key, 100)
				if record {
					published[key] = time.Now()
				}
				if _, err := e.js.PublishMsgAsync(m); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	publish("warm", warm, false)
	mu.Lock()
	own = own[:0]
	mu.Unlock()
	b.ResetTimer()
	publish("paced", b.N, true)
	e.eventually("all completed", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == warm+b.N
	})
	b.StopTimer()
	rows, err := e.pool.Query(e.ctx, `SELECT idempotency_key, completed_at FROM idempotency_keys WHERE idempotency_key LIKE 'paced-%'`)
	if err != nil {
		b.Fatal(err)
	}
	var lat []time.Duration
	for rows.Next() {
		var key string
		var at time.Time
		if err := rows.Scan(&key, &at); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, at.Sub(published[key]))
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	slices.Sort(lat)
	mu.Lock()
	slices.Sort(own)
	ownP99 := own[len(own)*99/100]
	mu.Unlock()
	p99 := lat[len(lat)*99/100]
	b.ReportMetric(lat[len(lat)/2].Seconds()*1000, "p50-ms")
	b.ReportMetric(p99.Seconds()*1000, "p99-ms")
	b.ReportMetric(ownP99.Seconds()*1000, "provider-p99-ms")
	b.ReportMetric((p99-ownP99).Seconds()*1000, "overhead-p99-ms")
	b.ReportMetric(float64(c.peak.Load()), "peak-in-flight")
}

// procStatusKB reads a kB figure of /proc/self/status.
func procStatusKB(b *testing.B, field string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatalf("no %s in /proc/self/status", field)
	return 0
}
