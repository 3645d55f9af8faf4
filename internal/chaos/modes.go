package main

import (
	"errors"
	"fmt"
)

// modeSummary is the modes' part of the summary line (each mode's counts,
// empty for a mode that is off).
func (h *harness) modeSummary() string {
	return h.clusterSummary() + h.pauseSummary() + h.netSummary()
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
	return errors.Join(errs...)
}
