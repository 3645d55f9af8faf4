package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/paydedup/paydedup/lab/localpg"
)

// The network fault mode (-net-latency, -net-cuts, -net-partitions): the
// workers reach Postgres, each NATS node and the provider through
// toxiproxy proxies run in-process on loopback, and during the fault phase
// the harness puts toxics on one link at a time:
//
//   - latency: 150 ms ± 100 ms each way, for 4 s;
//   - cut: every connection that carries data is reset (TCP RST) at once,
//     for 300 ms, so requests in flight are cut mid-way;
//   - partition: no byte passes either way for 6 s, longer than the lease
//     (the connections stay open, as behind a dead switch; what was sent
//     meanwhile arrives when it heals).
//
// The harness's own connections go direct; the reconcile, replay and audit
// commands it runs have the workers' environment, so go through the
// proxies too, once the faults are over.
type netFaults struct {
	server *toxiproxy.ApiServer
	links  []*netLink
	rng    *rand.Rand

	latency, cuts, partitions atomic.Int64
}

// netLink is one proxied link: the worker side listens on addr.
type netLink struct {
	name  string // postgres, nats-n0, provider
	proxy *toxiproxy.Proxy
	addr  string
}

func (h *harness) netFaultsOn() bool {
	return h.cfg.netLatency || h.cfg.netCuts || h.cfg.netPartitions
}

// initNetFaults starts a proxy in front of Postgres, each NATS node and
// the simulator; it must run before the first workerEnv.
func (h *harness) initNetFaults() error {
	if !h.netFaultsOn() {
		return nil
	}
	n := &netFaults{
		server: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop()),
		rng:    rand.New(rand.NewPCG(h.cfg.seed, 0x7e7)),
	}
	pgURL, err := url.Parse(h.dbURL("postgres", "paydedup"))
	if err != nil {
		return err
	}
	// A failover formation's URL names every node (host1:port1,host2:port2):
	// one link each.
	var upstreams [][2]string
	for i, host := range strings.Split(pgURL.Host, ",") {
		name := "postgres"
		if i > 0 || strings.Contains(pgURL.Host, ",") {
			name = fmt.Sprintf("postgres-%d", i)
		}
		upstreams = append(upstreams, [2]string{name, host})
	}
	upstreams = append(upstreams, [2]string{"provider", h.providerAddr()})
	if h.cluster != nil {
		for i, a := range h.cluster.addrs {
			upstreams = append(upstreams, [2]string{"nats-" + h.cluster.names[i], a})
		}
	} else {
		upstreams = append(upstreams, [2]string{"nats", h.natsAddr})
	}
	for _, u := range upstreams {
		port, err := localpg.FreePort()
		if err != nil {
			return err
		}
		l := &netLink{name: u[0], addr: fmt.Sprintf("127.0.0.1:%d", port)}
		l.proxy = toxiproxy.NewProxy(n.server, u[0], l.addr, u[1])
		if err := l.proxy.Start(); err != nil {
			return fmt.Errorf("proxy %s: %w", u[0], err)
		}
		n.links = append(n.links, l)
	}
	h.net = n
	h.logf("network faults: workers reach %d links through toxiproxy (latency %v, cuts %v, partitions %v)",
		len(n.links), h.cfg.netLatency, h.cfg.netCuts, h.cfg.netPartitions)
	return nil
}

// viaProxy rewrites the host:port of upstream to its proxy's, when the
// mode is on; upstream is returned as it is otherwise.
func (h *harness) viaProxy(upstream string) string {
	if h.net == nil {
		return upstream
	}
	// Each address ends at "/", "," or the end (URLs, URL lists), so a port
	// that is a prefix of another is not matched.
	for _, l := range h.net.links {
		for _, end := range []string{"/", ","} {
			upstream = strings.ReplaceAll(upstream, l.proxy.Upstream+end, l.addr+end)
		}
		if s, ok := strings.CutSuffix(upstream, l.proxy.Upstream); ok {
			upstream = s + l.addr
		}
	}
	return upstream
}

// stopNetFaults closes the proxies (and every connection through them).
func (h *harness) stopNetFaults() {
	if h.net == nil {
		return
	}
	for _, l := range h.net.links {
		l.proxy.Stop()
	}
}

// netFaultLoop puts one fault on one random link every 2-5 s until ctx
// ends, removing it again before the next.
func (h *harness) netFaultLoop(ctx context.Context) {
	if h.net == nil {
		return
	}
	n := h.net
	var kinds []string
	for k, on := range map[string]bool{"latency": h.cfg.netLatency, "cut": h.cfg.netCuts, "partition": h.cfg.netPartitions} {
		if on {
			kinds = append(kinds, k)
		}
	}
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(2*time.Second + time.Duration(n.rng.Int64N(int64(3*time.Second)))):
		}
		kind := kinds[i%len(kinds)]
		l := n.links[n.rng.IntN(len(n.links))]
		if err := h.netFault(kind, l); err != nil {
			h.logf("network fault %s on %s: %v", kind, l.name, err)
		}
	}
}

// netFault applies one fault to both directions of l and removes it when
// its time is up.
func (h *harness) netFault(kind string, l *netLink) error {
	var toxic string
	var hold time.Duration
	switch kind {
	case "latency":
		toxic, hold = `"type":"latency","attributes":{"latency":150,"jitter":100}`, 4*time.Second
		h.net.latency.Add(1)
	case "cut":
		toxic, hold = `"type":"reset_peer","attributes":{"timeout":0}`, 300*time.Millisecond
		h.net.cuts.Add(1)
	case "partition":
		toxic, hold = `"type":"timeout","attributes":{"timeout":0}`, 6*time.Second
		h.net.partitions.Add(1)
	}
	h.logf("network: %s on %s for %v", kind, l.name, hold)
	var added []string
	for _, dir := range []string{"upstream", "downstream"} {
		name := kind + "_" + dir
		if _, err := l.proxy.Toxics.AddToxicJson(strings.NewReader(`{"name":"` + name + `","stream":"` + dir + `",` + toxic + `}`)); err != nil {
			h.removeToxics(l, added)
			return err
		}
		added = append(added, name)
	}
	time.Sleep(hold) // not cut short by the end of the phase: it is undone below
	h.removeToxics(l, added)
	return nil
}

func (h *harness) removeToxics(l *netLink, names []string) {
	for _, name := range names {
		if err := l.proxy.Toxics.RemoveToxic(context.Background(), name); err != nil {
			h.logf("network: remove %s from %s: %v", name, l.name, err)
		}
	}
}

func (h *harness) netSummary() string {
	if h.net == nil {
		return ""
	}
	return fmt.Sprintf(" net_latency=%d net_cuts=%d net_partitions=%d", h.net.latency.Load(), h.net.cuts.Load(), h.net.partitions.Load())
}
