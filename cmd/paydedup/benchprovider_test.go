//go:build !nolab

package main

import (
	"context"
	"encoding/json"
	"math"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/lab/shipbench"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/testenv"
)

// runBenchProvider runs bench provider with args and returns its JSON
// report.
func runBenchProvider(t *testing.T, env map[string]string, args ...string) shipbench.ProviderResult {
	t.Helper()
	out, errOut, err := runCLI(context.Background(), env, append([]string{"bench", "provider", "--json"}, args...)...)
	if err != nil {
		t.Fatalf("bench provider: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	var r shipbench.ProviderResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatalf("last line is not the JSON report: %v\n%s", err, out)
	}
	return r
}

func sum(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// checkProviderReport checks that a report's figures agree with each
// other and with what the run did: every payment charged once, the
// simulator's counts adding up, the 429 share being its counters', the
// latencies ordered, the provider's latency the model's.
func checkProviderReport(t *testing.T, r shipbench.ProviderResult, payments, workers int, m stripesim.Model) {
	t.Helper()
	if r.Mode != "provider" || r.Payments != payments || r.Workers != workers || r.Model != m {
		t.Errorf("report %+v, want %d payments, %d workers, model %+v", r, payments, workers, m)
	}
	if r.ChargedOnce != payments || r.DoubleCharges != 0 || r.Lost != 0 || r.Unexpected != 0 || r.DeadLetters != 0 {
		t.Errorf("ledger: %d charged once, %d double, %d lost, %d unexpected, %d dead letters; want all %d once",
			r.ChargedOnce, r.DoubleCharges, r.Lost, r.Unexpected, r.DeadLetters, payments)
	}
	if sum(r.RequestsByKind) != r.Requests || sum(r.RateLimited) != r.Answered429 {
		t.Errorf("requests %d vs by kind %v; 429s %d vs by reason %v: the sums differ", r.Requests, r.RequestsByKind, r.Answered429, r.RateLimited)
	}
	if r.Requests-r.Answered429 < int64(payments) || r.RequestsByKind[stripesim.KindCreate] < int64(payments) {
		t.Errorf("%d requests let through (%v), fewer than the %d payments charged", r.Requests-r.Answered429, r.RequestsByKind, payments)
	}
	if r.Requests == 0 || math.Abs(r.Share429-float64(r.Answered429)/float64(r.Requests)) > 1e-9 {
		t.Errorf("429 share %v, want %d/%d", r.Share429, r.Answered429, r.Requests)
	}
	if math.Abs(r.PaymentsPerSec*r.Seconds-float64(payments)) > 0.01 || r.Seconds <= 0 {
		t.Errorf("%v payments/s over %v s, want %d payments", r.PaymentsPerSec, r.Seconds, payments)
	}
	if !(0 < r.PublishToChargedP50MS && r.PublishToChargedP50MS <= r.PublishToChargedP99MS && r.PublishToChargedP99MS <= r.PublishToChargedMaxMS &&
		r.PublishToChargedMaxMS <= r.Seconds*1000+1) {
		t.Errorf("publish→charged p50 %v p99 %v max %v ms over a %v s run: out of order", r.PublishToChargedP50MS, r.PublishToChargedP99MS, r.PublishToChargedMaxMS, r.Seconds)
	}
	if math.Abs(r.OverheadP99MS-(r.PublishToChargedP99MS-r.ProviderP99MS)) > 1e-6 {
		t.Errorf("overhead %v, want p99 %v less the provider's %v", r.OverheadP99MS, r.PublishToChargedP99MS, r.ProviderP99MS)
	}
	median, p99 := float64(m.LatencyMedian.Milliseconds()), float64(m.LatencyP99.Milliseconds())
	if math.Abs(r.ProviderP50MS-median) > 0.3*median || r.ProviderP99MS < r.ProviderP50MS || r.ProviderP99MS > 1.5*p99 {
		t.Errorf("the provider's latency p50 %v p99 %v ms, want about the model's %v and %v", r.ProviderP50MS, r.ProviderP99MS, median, p99)
	}
	if r.InFlightPeak < 1 || int64(r.InFlightPeak) > r.Requests || r.InFlightMean <= 0 || r.InFlightMean > float64(r.InFlightPeak) {
		t.Errorf("in flight: mean %v, peak %d of %d requests", r.InFlightMean, r.InFlightPeak, r.Requests)
	}
	if len(r.WorkerRSSMB) != workers || len(r.PausesPerWorker) != workers {
		t.Fatalf("RSS %v, pauses %v: want one per worker", r.WorkerRSSMB, r.PausesPerWorker)
	}
	pauses := 0
	for i := range workers {
		if r.WorkerRSSMB[i] <= 0 {
			t.Errorf("worker %d's peak RSS %v", i, r.WorkerRSSMB[i])
		}
		pauses += r.PausesPerWorker[i]
	}
	if pauses != r.Pauses {
		t.Errorf("pauses %d, per worker %v", r.Pauses, r.PausesPerWorker)
	}
}

// TestBenchProviderMeasuresTheShippedWorker runs bench provider small
// against the real services: two workers under a rate limit (429s
// counted, no more let through than the bucket allows), and the fairness
// scenario; each report's figures agree with what happened.
func TestBenchProviderMeasuresTheShippedWorker(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "paydedup")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	env := map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "NATS_URL": testenv.NATSURL(t)}
	m := stripesim.Model{LatencyMedian: 20e6, LatencyP99: 60e6, RateLimit: 100}

	r := runBenchProvider(t, env, "--binary", bin, "--payments", "300", "--workers", "2",
		"--latency-median", "20ms", "--latency-p99", "60ms", "--rate-limit", "100")
	checkProviderReport(t, r, 300, 2, m)
	if r.Answered429 == 0 || r.RateLimited[stripesim.ReasonGlobalRate] != r.Answered429 {
		t.Errorf("429s %d by reason %v: two workers at their defaults against 100/s must meet global-rate, and only it", r.Answered429, r.RateLimited)
	}
	// The bucket holds one second; the run's requests let through are
	// within it and the limit over the run (and the poll after it).
	if through := float64(r.Requests - r.Answered429); through > m.RateLimit*(r.Seconds+1)+m.RateLimit {
		t.Errorf("%v requests let through in %v s under %v/s", through, r.Seconds, m.RateLimit)
	}

	m = stripesim.Model{LatencyMedian: 20e6, LatencyP99: 60e6}
	f := runBenchProvider(t, env, "--binary", bin, "--latency-median", "20ms", "--latency-p99", "60ms",
		"--merchant-a-backlog", "300", "--merchant-b-payments", "20", "--merchant-b-after", "200ms", "--warmup", "150ms")
	checkProviderReport(t, f, 320, 1, m)
	if b := f.B; b == nil || b.BacklogA != 300 || b.Payments != 20 || b.AfterMS < 200 || f.Merchants != 2 ||
		b.PublishToChargedP99MS > b.PublishToChargedMaxMS || b.PublishToChargedMaxMS > f.PublishToChargedMaxMS || b.ADrainedMS > f.Seconds*1000+1 {
		t.Errorf("merchant B: %+v (run %+v)", b, f)
	}
	// Published 200 ms after A's, B's payments are the only ones after a
	// 150 ms warm-up: the steady figures are theirs.
	if st := f.Steady; st == nil || st.WarmupMS != 150 || st.Payments != 20 || f.B == nil || st.PublishToChargedP99MS != f.B.PublishToChargedP99MS ||
		st.PublishToChargedP50MS > st.PublishToChargedP99MS || math.Abs(st.OverheadP99MS-(st.PublishToChargedP99MS-f.ProviderP99MS)) > 1e-6 {
		t.Errorf("after the warm-up: %+v (merchant B %+v)", st, f.B)
	}
	if r.Steady != nil {
		t.Errorf("a run without --warmup reports steady figures %+v", r.Steady)
	}
}

func TestBenchProviderRejectsBadSettings(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--payments", "0"}, "--payments"},
		{[]string{"--workers", "0"}, "--workers"},
		{[]string{"--merchants", "0"}, "--merchants"},
		{[]string{"--publish-rate", "-1"}, "--publish-rate"},
		{[]string{"--provider", "sim"}, "--provider"},
		{[]string{"--worker-env", "NOEQUALS"}, "--worker-env"},
		{[]string{"--latency-p99", "1ms"}, "--latency-p99"},
		{[]string{"--rate-limit", "-5"}, "--rate-limit"},
		{[]string{"--concurrency-limit", "-5"}, "--concurrency-limit"},
		{[]string{"--merchant-a-backlog", "10", "--merchant-b-payments", "0"}, "--merchant-b-payments"},
		{[]string{"--merchant-a-backlog", "10", "--payments", "5"}, "--payments and --merchant-a-backlog"},
		{[]string{"--merchant-a-backlog", "-1"}, "--merchant-a-backlog"},
		{[]string{"--warmup", "-1s"}, "--warmup"},
	} {
		_, _, err := runCLI(context.Background(), nil, append([]string{"bench", "provider"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err %v, want one naming %s", c.args, err, c.want)
		}
	}
}
