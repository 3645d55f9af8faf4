package main

// modeSummary is the modes' part of the summary line (each mode's counts,
// empty for a mode that is off).
func (h *harness) modeSummary() string {
	return h.clusterSummary() + h.pauseSummary() + h.netSummary()
}
