package main

import (
	"errors"
	"fmt"
)

// modeSummary is the modes' part of the summary line (each mode's counts,
// empty for a mode that is off).
func (h *harness) modeSummary() string {
	return h.clusterSummary() + h.pauseSummary() + h.netSummary() + h.outageSummary() + h.gatewaySummary() + h.providerSummary() + h.outcomeSummary()
}

// validateModes checks the modes' flags, naming the one to fix.
func (c *config) validateModes() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.natsCluster != 0 && (c.natsCluster < 3 || c.natsCluster > 5) {
		bad("-nats-cluster must be 0 or 3 to 5 nodes, got %d", c.natsCluster)
	}
	if c.pauses < 0 {
		bad("-pauses must not be negative, got %d", c.pauses)
	}
	if c.pauses > 0 && c.pauseFor <= c.lease {
		bad("-pause-for %v must exceed the lease %v, or the pause proves nothing", c.pauseFor, c.lease)
	}
	if c.scale != nil && c.scalePayments < 1 {
		bad("-scale-payments must be at least 1, got %d", c.scalePayments)
	}
	if c.soak < 0 {
		bad("-soak must not be negative, got %v", c.soak)
	}
	if c.soak > 0 {
		if c.scale != nil {
			bad("-soak and -scale exclude each other")
		}
		if c.soakRate <= 0 || c.soakFaultEvery <= 0 || c.soakSample <= 0 {
			bad("-soak-rate, -soak-fault-every and -soak-sample must be positive, got %v, %v, %v", c.soakRate, c.soakFaultEvery, c.soakSample)
		}
	}
	switch c.replay {
	case "", "auto", "cli", "self", "none":
	default:
		bad("-replay must be auto, cli, self or none, got %q", c.replay)
	}
	if c.gatewayClients < 0 || c.gatewayClients > 256 {
		bad("-gateway-clients must be within 0..256, got %d", c.gatewayClients)
	}
	if c.gatewayClients > 0 {
		if c.gatewayPayments < 1 {
			bad("-gateway-payments must be at least 1, got %d", c.gatewayPayments)
		}
		if c.gatewayPublishTimeout <= 0 || c.clientGiveUp <= 0 {
			bad("-gateway-publish-timeout and -client-give-up must be positive, got %v and %v", c.gatewayPublishTimeout, c.clientGiveUp)
		}
	}
	if c.pubAckLosses < 0 || c.pubAckLosses > 0 && c.gatewayClients == 0 {
		bad("-puback-losses needs -gateway-clients (it cuts the gateway's link to NATS), got %d", c.pubAckLosses)
	}
	if c.clientsNewKeyOn503 && c.gatewayClients == 0 {
		bad("-clients-new-key-on-503 needs -gateway-clients")
	}
	if c.gatewayKills < 0 || c.gatewayKills > 0 && c.gatewayClients == 0 {
		bad("-gateway-kills needs -gateway-clients, got %d", c.gatewayKills)
	}
	if c.providerOutage < 0 {
		bad("-provider-outage must not be negative, got %v", c.providerOutage)
	}
	if c.pgLongStop != 0 {
		switch {
		case c.pgLongStop <= c.lease:
			bad("-pg-long-stop %v must exceed the lease %v, or it proves nothing", c.pgLongStop, c.lease)
		case c.pgRestarts < 1 || c.pgFailover > 0:
			bad("-pg-long-stop needs -pg-restarts of at least 1 and no -pg-failover")
		}
	}
	if (c.gatewayClients > 0 || c.providerOutage > 0 || c.pgLongStop > 0) && (c.scale != nil || c.soak > 0) {
		bad("-gateway-clients, -provider-outage and -pg-long-stop are for a chaos run, not -scale or -soak")
	}
	errs = append(errs, c.validateProvider()...)
	return errors.Join(errs...)
}
