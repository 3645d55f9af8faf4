package gateway

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// A second gateway's metrics on the same registry are an error, not a
// panic: gateway.New returns it.
func TestMetricsOnATakenRegistryAreAnError(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := newMetrics(reg); err != nil {
		t.Fatalf("first registration: %v", err)
	}
	m, err := newMetrics(reg)
	if err == nil || m != nil || !strings.Contains(err.Error(), "gateway metrics") {
		t.Fatalf("second registration: %v, %v; want an error naming the gateway's metrics", m, err)
	}
}
