package main

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/paydedup/paydedup/lab/localpg"
)

// The outage faults, injected from outside the code:
//
//   - -puback-losses N: N times, the gateway's link to NATS stops carrying
//     anything from NATS to the gateway for longer than the gateway's
//     publish timeout (a toxiproxy `timeout` toxic on the downstream only):
//     the gateway's PUB reaches the stream and is stored, its PubAck does
//     not come back in time. What was held back arrives when it heals, too
//     late to be anyone's answer.
//   - -provider-outage D: once, the workers' link to the provider refuses
//     every connection (and drops those open) for D, longer than the
//     delivery schedule (-max-deliver deliveries, backing off from 1 s),
//     as a provider down for maintenance.
//   - -pg-long-stop D: the first Postgres stop lasts D instead of a
//     second, longer than the lease.
type outages struct {
	server   *toxiproxy.ApiServer
	provider *netLink // the workers' link to the provider, with -provider-outage

	providerOutages atomic.Int64
	pgLongStops     atomic.Int64
}

// initOutages puts the provider behind its own link when the provider
// outage is on; it must run before initNetFaults and the first workerEnv.
func (h *harness) initOutages() error {
	h.outage = &outages{server: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())}
	if h.cfg.providerOutage <= 0 {
		return nil
	}
	port, err := localpg.FreePort()
	if err != nil {
		return err
	}
	l := &netLink{name: "provider-outage", addr: fmt.Sprintf("127.0.0.1:%d", port)}
	l.proxy = toxiproxy.NewProxy(h.outage.server, l.name, l.addr, h.simAddr)
	if err := l.proxy.Start(); err != nil {
		return fmt.Errorf("proxy %s: %w", l.name, err)
	}
	h.outage.provider = l
	return nil
}

func (h *harness) stopOutages() {
	if h.outage != nil && h.outage.provider != nil {
		h.outage.provider.proxy.Stop()
	}
}

// providerAddr is where the workers reach the provider (before the
// network fault mode's own link, if any).
func (h *harness) providerAddr() string {
	if h.outage != nil && h.outage.provider != nil {
		return h.outage.provider.addr
	}
	return h.simAddr
}

// providerOutage cuts the workers' provider link for -provider-outage,
// from a tenth into the fault phase; the outage is always healed, even
// when the phase ends first.
func (h *harness) providerOutage(ctx context.Context) {
	if h.outage == nil || h.outage.provider == nil {
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(h.cfg.duration / 10):
	}
	l := h.outage.provider
	h.logf("provider outage: every connection to the provider refused for %v", h.cfg.providerOutage)
	l.proxy.Stop()
	h.outage.providerOutages.Add(1)
	time.Sleep(h.cfg.providerOutage)
	if err := l.proxy.Start(); err != nil {
		h.logf("provider outage: the link did not come back: %v", err)
		return
	}
	h.logf("provider outage over")
}

// pubAckLosses holds back everything NATS (each node) sends the gateway -puback-losses
// times, spread over the first 80 % of the phase (while the clients pay),
// each for the gateway's publish timeout and a second more.
func (h *harness) pubAckLosses(ctx context.Context) {
	if h.gw == nil || h.cfg.pubAckLosses <= 0 {
		return
	}
	hold := h.cfg.gatewayPublishTimeout + time.Second
	start := time.Now()
	for i := range h.cfg.pubAckLosses {
		at := start.Add(h.cfg.duration * 8 / 10 * time.Duration(2*i+1) / time.Duration(2*h.cfg.pubAckLosses))
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(at)):
		}
		// A window while NATS or Postgres restarts, or the gateway is
		// down, loses no PubAck: wait for them (at most 20 s).
		_ = waitFor(ctx, 20*time.Second, "the services", func() bool {
			select {
			case <-h.gw.slot.proc.exited():
				return false
			default:
			}
			return h.restarting.Load() == 0
		})
		h.logf("network: PubAcks to the gateway held back for %v (its PUBs still reach NATS)", hold)
		name := "puback_loss"
		toxic := `{"name":"` + name + `","stream":"downstream","type":"timeout","attributes":{"timeout":0}}`
		var held []*netLink
		for _, l := range h.gw.links {
			if _, err := l.proxy.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
				h.logf("network: PubAck loss on %s: %v", l.name, err)
				continue
			}
			held = append(held, l)
		}
		if len(held) > 0 {
			h.gw.pubAckLosses.Add(1)
			h.gw.holding.Store(true)
		}
		time.Sleep(hold) // not cut short by the end of the phase: undone below
		for _, l := range held {
			h.removeToxics(l, []string{name})
		}
		h.gw.holding.Store(false)
	}
}

// pgDowntime is how long the next Postgres stop lasts: -pg-long-stop for
// the first one when set, a second otherwise.
func (h *harness) pgDowntime() time.Duration {
	if h.cfg.pgLongStop > 0 && h.outage != nil && h.outage.pgLongStops.CompareAndSwap(0, 1) {
		return h.cfg.pgLongStop
	}
	return time.Second
}

func (h *harness) outageSummary() string {
	s := ""
	if h.cfg.providerOutage > 0 && h.outage != nil {
		s += fmt.Sprintf(" provider_outages=%d", h.outage.providerOutages.Load())
	}
	if h.cfg.pgLongStop > 0 && h.outage != nil {
		s += fmt.Sprintf(" pg_long_stops=%d", h.outage.pgLongStops.Load())
	}
	return s
}
