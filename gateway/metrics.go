package gateway

import (
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// metrics are the gateway's Prometheus metrics. Labels are low-cardinality:
// route, status code class and result names, never a key or a merchant.
type metrics struct {
	requests        *prometheus.CounterVec
	duration        *prometheus.HistogramVec
	idempotency     *prometheus.CounterVec
	publishes       *prometheus.CounterVec
	publishDuration prometheus.Histogram
	waits           *prometheus.CounterVec
	authFailures    prometheus.Counter
	authThrottled   prometheus.Counter
	connsRefused    prometheus.Counter
	connsOpen       prometheus.Gauge
	webhooks        *prometheus.CounterVec
	queued          prometheus.Gauge
	batchSize       prometheus.Histogram
}

// newMetrics makes the gateway's metrics on reg; a registration that
// fails (a second gateway on one registry) is an error, not a panic.
func newMetrics(reg prometheus.Registerer) (m *metrics, err error) {
	defer func() {
		if r := recover(); r != nil {
			m, err = nil, fmt.Errorf("gateway metrics: %v", r)
		}
	}()
	f := promauto.With(reg)
	m = &metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "paydedup_gateway_requests_total",
			Help: "HTTP requests answered by the gateway, by route and status code.",
		}, []string{"route", "code"}),
		duration: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "paydedup_gateway_request_duration_seconds",
			Help:    "Time to answer an HTTP request, Prefer: wait included, by route.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"route"}),
		idempotency: f.NewCounterVec(prometheus.CounterOpts{
			Name: "paydedup_gateway_idempotency_total",
			Help: "POST /v1/payments by what the Idempotency-Key found: new, replayed, in_flight, mismatch, dead_lettered, waiting_for_operator, not_republished; shed and shed_merchant when the batched intake had no room.",
		}, []string{"result"}),
		publishes: f.NewCounterVec(prometheus.CounterOpts{
			Name: "paydedup_gateway_publishes_total",
			Help: "Commands published to JetStream by the gateway, by result (ok, error).",
		}, []string{"result"}),
		publishDuration: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "paydedup_gateway_publish_duration_seconds",
			Help:    "Time from publish to PubAck.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		waits: f.NewCounterVec(prometheus.CounterOpts{
			Name: "paydedup_gateway_waits_total",
			Help: "Prefer: wait requests by how the wait ended: completed, dead_lettered, waiting_for_operator, timeout, shutdown, cancelled.",
		}, []string{"result"}),
		authFailures: f.NewCounter(prometheus.CounterOpts{
			Name: "paydedup_gateway_auth_failures_total",
			Help: "Requests with an invalid or revoked API key.",
		}),
		authThrottled: f.NewCounter(prometheus.CounterOpts{
			Name: "paydedup_gateway_auth_throttled_total",
			Help: "Requests answered 429 without an API key look-up because their source address failed to authenticate too often.",
		}),
		connsRefused: f.NewCounter(prometheus.CounterOpts{
			Name: "paydedup_gateway_connections_refused_total",
			Help: "Connections answered 503 and closed at once because the gateway had its maximum open.",
		}),
		connsOpen: f.NewGauge(prometheus.GaugeOpts{
			Name: "paydedup_gateway_connections_open",
			Help: "Connections the gateway holds open.",
		}),
		webhooks: f.NewCounterVec(prometheus.CounterOpts{
			Name: "paydedup_gateway_webhook_events_total",
			Help: "Stripe webhook events by what they did: settled, agrees, disagrees (a final ledger row the event contradicts; the row is unchanged), still_processing, foreign_intent, no_payment, not_ours, ignored_type, bad_signature, error.",
		}, []string{"result"}),
		queued: f.NewGauge(prometheus.GaugeOpts{
			Name: "paydedup_gateway_intake_queued",
			Help: "POSTs waiting in the batched intake's queue for a batch.",
		}),
		batchSize: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "paydedup_gateway_intake_batch_size",
			Help:    "POSTs per batch of the batched intake.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
	}
	return m, nil
}

func (m *metrics) observe(route string, code int, d time.Duration) {
	if code == 0 {
		code = 200
	}
	m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
	m.duration.WithLabelValues(route).Observe(d.Seconds())
}

// What a webhook event did, the values of
// paydedup_gateway_webhook_events_total{result}.
const (
	WebhookBadSignature    = "bad_signature"
	WebhookIgnoredType     = "ignored_type"
	WebhookNotOurs         = "not_ours"
	WebhookNoPayment       = "no_payment"
	WebhookForeignIntent   = "foreign_intent"
	WebhookStillProcessing = "still_processing"
	WebhookSettled         = "settled"
	WebhookAgrees          = "agrees"
	WebhookDisagrees       = "disagrees"
	// WebhookRecheckRequested: a refund event says the provider failed a
	// refund the ledger holds succeeded; the reconciler looks it up again.
	WebhookRecheckRequested = "recheck_requested"
	// WebhookNotRecorded: a refund event for a refund the ledger holds
	// without the provider's refund id yet; answered 503, so the provider
	// sends it again once the worker recorded it.
	WebhookNotRecorded = "not_recorded"
	WebhookError       = "error"
)
