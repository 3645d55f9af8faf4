package main

import (
	"context"
	"math"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
	ok := config{lease: 5 * time.Second, pauseFor: 18 * time.Second, scalePayments: 10, soakRate: 1, soakFaultEvery: time.Second, soakSample: time.Second}
	if err := ok.validateModes(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for name, tc := range map[string]struct {
		edit func(*config)
		want string
	}{
		"two nodes":      {func(c *config) { c.natsCluster = 2 }, "-nats-cluster"},
		"short pause":    {func(c *config) { c.pauses, c.pauseFor = 1, time.Second }, "-pause-for"},
		"no payments":    {func(c *config) { c.scale, c.scalePayments = []int{1}, 0 }, "-scale-payments"},
		"negative soak":  {func(c *config) { c.soak = -time.Second }, "-soak must not"},
		"soak and scale": {func(c *config) { c.soak, c.scale = time.Minute, []int{1} }, "exclude"},
		"zero rate":      {func(c *config) { c.soak, c.soakRate = time.Minute, 0 }, "-soak-rate"},
		"replay never":   {func(c *config) { c.replay = "never" }, "-replay"},
		"short pg stop":  {func(c *config) { c.pgRestarts, c.pgLongStop = 1, time.Second }, "must exceed the lease"},
		"no pg stop":     {func(c *config) { c.pgLongStop = 8 * time.Second }, "-pg-long-stop needs"},
		"puback alone":   {func(c *config) { c.pubAckLosses = 2 }, "-puback-losses needs -gateway-clients"},
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
