package main

import (
	"context"
	"maps"
	"math"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/paydedup/paydedup/lab/stripesim"
)

func TestParseScale(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		bad  bool
	}{
		{in: "1,2,4,8", want: []int{1, 2, 4, 8}},
		{in: " 3 ", want: []int{3}},
		{in: "0", bad: true},
		{in: "1,,2", bad: true},
		{in: "65", bad: true},
		{in: "two", bad: true},
	} {
		got, err := parseScale(tc.in)
		if (err != nil) != tc.bad || (!tc.bad && !slices.Equal(got, tc.want)) {
			t.Errorf("parseScale(%q) = %v, %v", tc.in, got, err)
		}
	}
}

func TestSoakSummary(t *testing.T) {
	flat := []soakSample{}
	for i := range 9 {
		flat = append(flat, soakSample{rss: 40 << 20, goroutines: 25 + float64(i%2), fds: 15, pgConns: 6, pending: 3})
	}
	if line, ok := soakSummary(flat); !ok || !strings.Contains(line, "rss_mb=40->40") {
		t.Fatalf("flat samples: %s %v", line, ok)
	}
	// Goroutines that keep growing are a leak.
	leak := append([]soakSample(nil), flat...)
	for i := 6; i < 9; i++ {
		leak[i].goroutines = 500
	}
	if line, ok := soakSummary(leak); ok || !strings.Contains(line, "goroutines=25->500") {
		t.Fatalf("growing goroutines: %s %v", line, ok)
	}
	// An unreadable figure is left out; one never read is not flat.
	nan := append([]soakSample(nil), flat...)
	nan[8].rss = math.NaN()
	if _, ok := soakSummary(nan); !ok {
		t.Fatal("one NaN sample made the run not flat")
	}
	for i := range nan {
		nan[i].pending = math.NaN()
	}
	if _, ok := soakSummary(nan); ok {
		t.Fatal("a figure never read counted as flat")
	}
	if _, ok := soakSummary(flat[:2]); ok {
		t.Fatal("two samples counted as flat")
	}
}

// viaProxy rewrites only whole addresses: a port that is a prefix of
// another is left alone.
func TestViaProxy(t *testing.T) {
	h := &harness{net: &netFaults{links: []*netLink{
		{proxy: &toxiproxy.Proxy{Upstream: "127.0.0.1:4437"}, addr: "127.0.0.1:9001"},
		{proxy: &toxiproxy.Proxy{Upstream: "127.0.0.1:5432"}, addr: "127.0.0.1:9002"},
	}}}
	for in, want := range map[string]string{
		"nats://127.0.0.1:4437,nats://127.0.0.1:44379":         "nats://127.0.0.1:9001,nats://127.0.0.1:44379",
		"nats://127.0.0.1:44379,nats://127.0.0.1:4437":         "nats://127.0.0.1:44379,nats://127.0.0.1:9001",
		"postgres://u@127.0.0.1:5432/paydedup?sslmode=disable": "postgres://u@127.0.0.1:9002/paydedup?sslmode=disable",
		"http://127.0.0.1:54321":                               "http://127.0.0.1:54321",
	} {
		if got := h.viaProxy(in); got != want {
			t.Errorf("viaProxy(%q) = %q, want %q", in, got, want)
		}
	}
	if got := (&harness{}).viaProxy("http://127.0.0.1:4437"); got != "http://127.0.0.1:4437" {
		t.Errorf("without the mode: %q", got)
	}
}

// The soak reads a worker's gauges from its /metrics page as the Go and
// process collectors write them.
func TestScrapeMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	m, err := scrapeMetrics(context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", "process_open_fds"} {
		if m[name] <= 0 {
			t.Errorf("%s = %v, want > 0 (read %d gauges)", name, m[name], len(m))
		}
	}
}

func TestValidateModes(t *testing.T) {
	ok := config{lease: 5 * time.Second, pauseFor: 18 * time.Second, scalePayments: 10, soakRate: 1, soakFaultEvery: time.Second, soakSample: time.Second,
		providerTimeout: time.Second}
	if err := ok.validateModes(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	// make chaos's rate-limited provider.
	rl := ok
	rl.providerRateLimit, rl.providerLatencyMedian, rl.providerLatencyP99, rl.providerConcurrencyLimit = 200, 50*time.Millisecond, 200*time.Millisecond, 64
	rl.providerRate, rl.providerMax429Share = 180, 0.02
	if err := rl.validateModes(); err != nil {
		t.Fatalf("a rate-limited provider: %v", err)
	}
	for name, tc := range map[string]struct {
		edit func(*config)
		want string
	}{
		"two nodes":            {func(c *config) { c.natsCluster = 2 }, "-nats-cluster"},
		"short pause":          {func(c *config) { c.pauses, c.pauseFor = 1, time.Second }, "-pause-for"},
		"no payments":          {func(c *config) { c.scale, c.scalePayments = []int{1}, 0 }, "-scale-payments"},
		"negative soak":        {func(c *config) { c.soak = -time.Second }, "-soak must not"},
		"soak and scale":       {func(c *config) { c.soak, c.scale = time.Minute, []int{1} }, "exclude"},
		"zero rate":            {func(c *config) { c.soak, c.soakRate = time.Minute, 0 }, "-soak-rate"},
		"replay never":         {func(c *config) { c.replay = "never" }, "-replay"},
		"short pg stop":        {func(c *config) { c.pgRestarts, c.pgLongStop = 1, time.Second }, "must exceed the lease"},
		"no pg stop":           {func(c *config) { c.pgLongStop = 8 * time.Second }, "-pg-long-stop needs"},
		"puback alone":         {func(c *config) { c.pubAckLosses = 2 }, "-puback-losses needs -gateway-clients"},
		"negative rate limit":  {func(c *config) { c.providerRateLimit = -1 }, "-provider-rate-limit"},
		"NaN rate limit":       {func(c *config) { c.providerRateLimit = math.NaN() }, "-provider-rate-limit"},
		"negative concurrency": {func(c *config) { c.providerConcurrencyLimit = -1 }, "-provider-concurrency-limit"},
		"negative median":      {func(c *config) { c.providerLatencyMedian = -time.Millisecond }, "-provider-latency-median"},
		"p99 alone":            {func(c *config) { c.providerLatencyP99 = time.Millisecond }, "needs -provider-latency-median"},
		"p99 under median": {func(c *config) {
			c.providerLatencyMedian, c.providerLatencyP99 = 200*time.Millisecond, 50*time.Millisecond
		}, "must be at least -provider-latency-median"},
		"p99 past timeout": {func(c *config) {
			c.providerLatencyMedian, c.providerLatencyP99 = 50*time.Millisecond, 2*time.Second
		}, "under -provider-timeout"},
		"median past timeout":  {func(c *config) { c.providerLatencyMedian = 2 * time.Second }, "under -provider-timeout"},
		"negative fleet rate":  {func(c *config) { c.providerRate = -5 }, "-provider-rate must"},
		"share above one":      {func(c *config) { c.providerMax429Share = 1.5 }, "-provider-max-429-share"},
		"rate limit and scale": {func(c *config) { c.providerRateLimit, c.scale = 100, []int{1} }, "not -scale or -soak"},
		"gateway, no payments": {func(c *config) {
			c.gatewayClients, c.gatewayPayments, c.gatewayPublishTimeout, c.clientGiveUp = 4, 0, time.Second, time.Minute
		}, "-gateway-payments"},
	} {
		c := ok
		tc.edit(&c)
		if err := c.validateModes(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %s", name, err, tc.want)
		}
	}
}

// The provider model's flags reach the simulator as its own flags, and
// the fleet budget reaches the workers only when it is set.
func TestProviderModelArgs(t *testing.T) {
	var off config
	if args, env := off.simModelArgs(), off.providerRateEnv(); len(args) != 0 || len(env) != 0 || off.rateLimitMode() {
		t.Fatalf("mode off: simulator %v, workers %v, mode %v", args, env, off.rateLimitMode())
	}
	c := config{providerRateLimit: 100, providerConcurrencyLimit: 25, providerLatencyMedian: 50 * time.Millisecond,
		providerLatencyP99: 200 * time.Millisecond, providerRate: 90.5}
	want := []string{"--latency-median", "50ms", "--latency-p99", "200ms", "--rate-limit", "100", "--concurrency-limit", "25"}
	if got := c.simModelArgs(); !slices.Equal(got, want) {
		t.Errorf("simModelArgs() = %v, want %v", got, want)
	}
	if got := c.providerRateEnv(); !slices.Equal(got, []string{"PAYDEDUP_PROVIDER_RATE=90.5"}) {
		t.Errorf("providerRateEnv() = %v", got)
	}
}

// The report counts the account's 429s apart from the injected ones, the
// workers' pause lines by cause (and on a 429) and their messages at the
// last delivery, and checks -provider-max-429-share.
func TestProviderLoad(t *testing.T) {
	dir := t.TempDir()
	logs := map[string]string{
		"worker-0.log": `---- 2026-12-07T00:00:00Z: start worker-0
{"time":"2026-12-07T00:00:01Z","level":"WARN","msg":"worker paused; not fetching","cause":"provider_unavailable","error":"provider: retryable: status 429 invalid_request_error/rate_limit: Too many requests","held":3}
{"time":"2026-12-07T00:00:01Z","level":"WARN","msg":"provider unavailable on a message's last delivery and to a lookup: worker paused, message held","deliveries":5}
{"time":"2026-12-07T00:00:02Z","level":"INFO","msg":"worker resumed","cause":"provider_unavailable"}
{"time":"2026-12-07T00:00:03Z","level":"WARN","msg":"worker paused; not fetching","cause":"postgres_unavailable","held":0}
`,
		"worker-1.log": `{"time":"2026-12-07T00:00:01Z","level":"WARN","msg":"worker paused; not fetching","cause":"provider_unavailable","held":1}
{"time":"2026-12-07T00:00:01Z","level":"WARN","msg":"probe after a pause","note":"worker paused; not fetching"}
{"time":"2026-12-07T00:00:01Z","level":"WARN","msg":"last allowed delivery ended retry; published again","deliveries":5}
not json: worker paused; not fetching
`,
		"gateway.log": `{"msg":"worker paused; not fetching","cause":"provider_unavailable"}` + "\n",
	}
	for name, body := range logs {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	logged := readWorkerLogs(dir)
	if want := map[string]int{"provider_unavailable": 2, "postgres_unavailable": 1}; !maps.Equal(logged.pauses, want) ||
		logged.pausesOn429 != 1 || logged.lastDeliveries != 2 {
		t.Errorf("readWorkerLogs = %+v, want pauses %v, 1 on a 429, 2 last deliveries", logged, want)
	}
	l := providerLoad{read: true, logged: logged, stats: stripesim.Stats{
		Requests: map[string]int64{"create": 900, "retrieve": 100}, RequestsTotal: 1000,
		RateLimited:      map[string]int64{stripesim.ReasonGlobalRate: 30, stripesim.ReasonGlobalConcurrency: 10, stripesim.ReasonInjected: 50},
		RateLimitedTotal: 90, PeakInFlight: 64,
	}}
	if l.limited() != 40 || math.Abs(l.limitedShare()-0.04) > 1e-9 || l.pauseTotal() != 3 {
		t.Errorf("limited %d, share %v, pauses %d; want 40, 0.04, 3", l.limited(), l.limitedShare(), l.pauseTotal())
	}
	line := l.providerLine()
	for _, want := range []string{"1000 requests (create=900 retrieve=100)", "90 answered 429 (global-concurrency=10 global-rate=30 injected=50)",
		"refused 4.0 %", "peak in flight 64", "worker pauses 3 (postgres_unavailable=1 provider_unavailable=2; 1 on a 429)",
		"last delivery without an outcome 2"} {
		if !strings.Contains(line, want) {
			t.Errorf("providerLine() = %q, lacks %q", line, want)
		}
	}
	h := &harness{cfg: config{providerRateLimit: 100, providerMax429Share: 0.05}, load: l}
	if err := h.checkProviderLoad(); err != nil {
		t.Errorf("4 %% under a 5 %% bound: %v", err)
	}
	if s := h.providerSummary(); !strings.Contains(s, "provider_429_share=0.040") || !strings.Contains(s, "worker_pauses=3 worker_pauses_on_429=1 last_deliveries=2") {
		t.Errorf("providerSummary() = %q", s)
	}
	h.cfg.providerMax429Share = 0.02
	if err := h.checkProviderLoad(); err == nil || !strings.Contains(err.Error(), "40 of 1000") {
		t.Errorf("4 %% over a 2 %% bound: %v", err)
	}
	h.load.read = false
	if err := h.checkProviderLoad(); err == nil {
		t.Error("a bound checked against stats never read passed")
	}
	h.cfg.providerMax429Share = 0
	if err := h.checkProviderLoad(); err != nil {
		t.Errorf("no bound: %v", err)
	}
	if s := (&harness{}).providerSummary(); s != "" {
		t.Errorf("mode off: summary %q", s)
	}
}
