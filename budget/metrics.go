package budget

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// metrics are the budget's; registered on the injected registerer (none:
// kept but not exported).
type metrics struct {
	rate        prometheus.Gauge
	waited      prometheus.Histogram
	limited     *prometheus.CounterVec
	requests    prometheus.Counter
	storeErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		rate: f.NewGauge(prometheus.GaugeOpts{
			Name: "paydedup_provider_budget_rate",
			Help: "The fleet's provider budget as this process last learned it, in requests per second; 0 while nothing limits it.",
		}),
		waited: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "paydedup_provider_budget_wait_seconds",
			Help:    "How long a provider call waited for a token of the fleet's budget.",
			Buckets: []float64{0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
		}),
		limited: f.NewCounterVec(prometheus.CounterOpts{
			Name: "paydedup_provider_rate_limited_total",
			Help: "Provider calls answered 429 rate_limit, by Stripe-Rate-Limited-Reason (none when absent).",
		}, []string{"reason"}),
		requests: f.NewCounter(prometheus.CounterOpts{
			Name: "paydedup_provider_requests_total",
			Help: "Provider calls (charges and lookups) sent through the budget: the denominator of the share answered 429.",
		}),
		storeErrors: f.NewCounter(prometheus.CounterOpts{
			Name: "paydedup_provider_budget_store_errors_total",
			Help: "Grants the budget's store could not give (PostgreSQL unreachable); the process then paces itself alone.",
		}),
	}
}
