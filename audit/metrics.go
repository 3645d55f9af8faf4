package audit

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the gauges of the last audit, for alerting: `paydedup audit
// --every` serves them on its admin listener.
type Metrics struct {
	findings    *prometheus.GaugeVec
	intents     prometheus.Gauge
	lastSuccess prometheus.Gauge
	runs        *prometheus.CounterVec
}

// NewMetrics registers the audit's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	m := &Metrics{
		findings: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "paydedup_audit_findings",
			Help: "Findings of the last completed audit, by kind; any value above 0 is drift between the ledger and the provider.",
		}, []string{"kind"}),
		intents: f.NewGauge(prometheus.GaugeOpts{
			Name: "paydedup_audit_intents",
			Help: "Provider intents with paydedup's metadata in the last completed audit's window.",
		}),
		lastSuccess: f.NewGauge(prometheus.GaugeOpts{
			Name: "paydedup_audit_last_success_timestamp_seconds",
			Help: "When the last audit completed (with or without findings), Unix seconds; stale means the audit itself is failing.",
		}),
		runs: f.NewCounterVec(prometheus.CounterOpts{
			Name: "paydedup_audit_runs_total",
			Help: "Audits run, by result: clean, drift, or error (could not read the provider or the ledger).",
		}, []string{"result"}),
	}
	for _, k := range Kinds {
		m.findings.WithLabelValues(string(k))
	}
	for _, r := range []string{"clean", "drift", "error"} {
		m.runs.WithLabelValues(r)
	}
	return m
}

// Observe records one audit: its report, or the error that withheld it (the
// gauges then keep the last completed audit's values).
func (m *Metrics) Observe(rep *Report, err error, at time.Time) {
	if err != nil || rep == nil {
		m.runs.WithLabelValues("error").Inc()
		return
	}
	for k, n := range rep.Counts() {
		m.findings.WithLabelValues(string(k)).Set(float64(n))
	}
	m.intents.Set(float64(rep.Intents))
	m.lastSuccess.Set(float64(at.Unix()))
	if rep.Drift() {
		m.runs.WithLabelValues("drift").Inc()
	} else {
		m.runs.WithLabelValues("clean").Inc()
	}
}
