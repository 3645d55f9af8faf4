package deploy

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/promqltest"
)

// firing evaluates an alert as Prometheus's rule manager does, once a
// minute: it fires at `at` when its expression returned series at every
// evaluation of the `for` window before it. It returns the firing series'
// labels.
func firing(t *testing.T, r rule, series string, at time.Duration) []string {
	t.Helper()
	st := promqltest.LoadedStorage(t, series)
	t.Cleanup(func() { _ = st.Close() })
	engine := promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery)
	var hold time.Duration
	if r.For != "" {
		d, err := model.ParseDuration(r.For)
		if err != nil {
			t.Fatalf("%s: for %q: %v", r.Alert, r.For, err)
		}
		hold = time.Duration(d)
	}
	var labels []string
	for ts := at - hold; ts <= at; ts += time.Minute {
		q, err := engine.NewInstantQuery(context.Background(), st, nil, r.Expr, time.Unix(0, 0).Add(ts))
		if err != nil {
			t.Fatalf("%s: %v", r.Alert, err)
		}
		res := q.Exec(context.Background())
		if res.Err != nil {
			t.Fatalf("%s at %v: %v", r.Alert, ts, res.Err)
		}
		vec, err := res.Vector()
		if err != nil {
			t.Fatalf("%s: %v", r.Alert, err)
		}
		q.Close()
		if len(vec) == 0 {
			return nil
		}
		labels = labels[:0]
		for _, s := range vec {
			labels = append(labels, s.Metric.String())
		}
	}
	slices.Sort(labels)
	return labels
}

// TestAlertsFire runs the alert rules over synthetic series, like
// promtool test rules: each fires on what it is for, with the labels its
// runbook needs, and stays quiet on the ordinary case next to it.
func TestAlertsFire(t *testing.T) {
	pr := loadAlerts(t)
	rules := map[string]rule{}
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			rules[r.Alert] = r
		}
	}
	tests := []struct {
		name, alert, series string
		at                  time.Duration
		want                []string // nil: must not fire
	}{
		{
			name: "backlog growing for 10m", alert: "PaydedupConsumerBacklogGrowing",
			series: `load 1m
				paydedup_consumer_pending_messages{namespace="pay",stream="PAYMENTS",consumer="paydedup-worker",pod="w1"} 0+200x30
				paydedup_consumer_pending_messages{namespace="pay",stream="PAYMENTS",consumer="paydedup-worker",pod="w2"} 0+200x30`,
			at:   25 * time.Minute,
			want: []string{`{consumer="paydedup-worker", namespace="pay", stream="PAYMENTS"}`},
		},
		{
			name: "large but draining backlog", alert: "PaydedupConsumerBacklogGrowing",
			series: `load 1m
				paydedup_consumer_pending_messages{namespace="pay",stream="PAYMENTS",consumer="paydedup-worker",pod="w1"} 20000-200x30`,
			at: 25 * time.Minute,
		},
		{
			name: "small backlog growing", alert: "PaydedupConsumerBacklogGrowing",
			series: `load 1m
				paydedup_consumer_pending_messages{namespace="pay",stream="PAYMENTS",consumer="paydedup-worker",pod="w1"} 0+10x30`,
			at: 25 * time.Minute,
		},
		{
			name: "backlog grew for 5m only", alert: "PaydedupConsumerBacklogGrowing",
			series: `load 1m
				paydedup_consumer_pending_messages{namespace="pay",stream="PAYMENTS",consumer="paydedup-worker",pod="w1"} 5000x20 5000+500x5`,
			at: 25 * time.Minute,
		},
		{
			name: "payments stream filling", alert: "PaydedupPaymentsStreamFilling",
			series: `load 1m
				paydedup_stream_bytes{namespace="pay",stream="PAYMENTS",consumer="paydedup-worker",pod="w1"} 0+100x30
				paydedup_stream_max_bytes{namespace="pay",stream="PAYMENTS",consumer="paydedup-worker",pod="w1"} 2000x30
				paydedup_stream_messages{namespace="pay",stream="PAYMENTS",consumer="paydedup-worker",pod="w1"} 10x30
				paydedup_stream_max_messages{namespace="pay",stream="PAYMENTS",consumer="paydedup-worker",pod="w1"} 1000x30`,
			at:   25 * time.Minute,
			want: []string{`{namespace="pay", stream="PAYMENTS"}`},
		},
		{
			name: "a refund unknown and a capture stuck for 20m", alert: "PaydedupStuckOperations",
			series: `load 1m
				paydedup_stuck_operations{namespace="pay",kind="refund",pod="w1"} 0x30
				paydedup_unknown_operations{namespace="pay",kind="refund",pod="w1"} 1x30
				paydedup_stuck_operations{namespace="pay",kind="capture",pod="w1"} 0x5 2x25
				paydedup_unknown_operations{namespace="pay",kind="capture",pod="w1"} 0x30
				paydedup_stuck_operations{namespace="pay",kind="cancel",pod="w1"} 0x30
				paydedup_unknown_operations{namespace="pay",kind="cancel",pod="w1"} 0x30`,
			at:   25 * time.Minute,
			want: []string{`{kind="capture"}`, `{kind="refund"}`},
		},
		{
			name: "an operation unknown for 10m only", alert: "PaydedupStuckOperations",
			series: `load 1m
				paydedup_stuck_operations{namespace="pay",kind="refund",pod="w1"} 0x30
				paydedup_unknown_operations{namespace="pay",kind="refund",pod="w1"} 0x15 1x15`,
			at: 25 * time.Minute,
		},
		{
			name: "payments stream with room, and one without a bound", alert: "PaydedupPaymentsStreamFilling",
			series: `load 1m
				paydedup_stream_bytes{namespace="pay",stream="PAYMENTS",consumer="paydedup-worker",pod="w1"} 1000x30
				paydedup_stream_max_bytes{namespace="pay",stream="PAYMENTS",consumer="paydedup-worker",pod="w1"} 2000x30
				paydedup_stream_messages{namespace="pay",stream="OLD",consumer="paydedup-worker",pod="w1"} 5000x30
				paydedup_stream_max_messages{namespace="pay",stream="OLD",consumer="paydedup-worker",pod="w1"} -1x30`,
			at: 25 * time.Minute,
		},
		{
			name: "consumer info unreadable", alert: "PaydedupConsumerInfoFailing",
			series: `load 1m
				paydedup_consumer_info_up{namespace="pay",stream="PAYMENTS",consumer="paydedup-worker",pod="w1"} 0x20`,
			at:   15 * time.Minute,
			want: []string{`{consumer="paydedup-worker", namespace="pay", stream="PAYMENTS"}`},
		},
		{
			name: "one pod reads it", alert: "PaydedupConsumerInfoFailing",
			series: `load 1m
				paydedup_consumer_info_up{namespace="pay",stream="PAYMENTS",consumer="paydedup-worker",pod="w1"} 0x20
				paydedup_consumer_info_up{namespace="pay",stream="PAYMENTS",consumer="paydedup-worker",pod="w2"} 1x20`,
			at: 15 * time.Minute,
		},
		{
			// Any reason, including ones added later (provider_rejected).
			name: "dead letters by reason", alert: "PaydedupDeadLetters",
			series: `load 1m
				paydedup_dead_lettered_total{namespace="pay",pod="w1",reason="provider_rejected"} 0x5 1+1x10
				paydedup_dead_lettered_total{namespace="pay",pod="w1",reason="invalid_amount"} 0x15`,
			at:   15 * time.Minute,
			want: []string{`{reason="provider_rejected"}`},
		},
		{
			name: "outcome events unpublished for 15m", alert: "PaydedupOutcomeRelayLagging",
			series: `load 1m
				paydedup_outcome_relay_lag_seconds{namespace="pay",pod="w1"} 0+60x30
				paydedup_outcome_relay_lag_seconds{namespace="pay",pod="w2"} 0+60x30`,
			at:   20 * time.Minute,
			want: []string{`{namespace="pay"}`},
		},
		{
			name: "outcome events relayed within seconds", alert: "PaydedupOutcomeRelayLagging",
			series: `load 1m
				paydedup_outcome_relay_lag_seconds{namespace="pay",pod="w1"} 2x10 400x3 1x20`,
			at: 30 * time.Minute,
		},
		{
			name: "intake commands unpublished for 15m", alert: "PaydedupIntakeRelayLagging",
			series: `load 1m
				paydedup_intake_relay_lag_seconds{namespace="pay",pod="w1"} 0+60x30
				paydedup_intake_relay_lag_seconds{namespace="pay",pod="w2"} 0+60x30`,
			at:   20 * time.Minute,
			want: []string{`{namespace="pay"}`},
		},
		{
			name: "intake commands relayed within seconds", alert: "PaydedupIntakeRelayLagging",
			series: `load 1m
				paydedup_intake_relay_lag_seconds{namespace="pay",pod="w1"} 2x10 400x3 1x20`,
			at: 30 * time.Minute,
		},
		{
			name: "an intake row rejected", alert: "PaydedupIntakeCommandsRejected",
			series: `load 1m
				paydedup_intake_commands_rejected{namespace="pay",pod="w1"} 0x5 1x10
				paydedup_intake_commands_rejected{namespace="pay",pod="w2"} 0x5 1x10`,
			at:   10 * time.Minute,
			want: []string{`{namespace="pay"}`},
		},
		{
			name: "no intake row rejected", alert: "PaydedupIntakeCommandsRejected",
			series: `load 1m
				paydedup_intake_commands_rejected{namespace="pay",pod="w1"} 0x20`,
			at: 15 * time.Minute,
		},
		{
			name: "stuck pending rows for 15m", alert: "PaydedupStuckPendingRows",
			series: `load 1m
				paydedup_stuck_pending_rows{namespace="pay",pod="w1"} 2x30`,
			at:   20 * time.Minute,
			want: []string{`{}`},
		},
		{
			name: "rows resolved within the grace", alert: "PaydedupStuckPendingRows",
			series: `load 1m
				paydedup_stuck_pending_rows{namespace="pay",pod="w1"} 0x10 1x5 0x15`,
			at: 30 * time.Minute,
		},
		{
			name: "gateway 5% 5xx", alert: "PaydedupGatewayErrors",
			series: `load 1m
				paydedup_gateway_requests_total{namespace="pay",pod="g1",route="post_payment",code="202"} 0+950x20
				paydedup_gateway_requests_total{namespace="pay",pod="g1",route="post_payment",code="503"} 0+50x20`,
			at:   15 * time.Minute,
			want: []string{`{namespace="pay"}`},
		},
		{
			name: "gateway 4xx only", alert: "PaydedupGatewayErrors",
			series: `load 1m
				paydedup_gateway_requests_total{namespace="pay",pod="g1",route="post_payment",code="202"} 0+500x20
				paydedup_gateway_requests_total{namespace="pay",pod="g1",route="post_payment",code="422"} 0+500x20`,
			at: 15 * time.Minute,
		},
		{
			name: "worker paused for 5m", alert: "PaydedupWorkerPaused",
			series: `load 1m
				paydedup_worker_paused{namespace="pay",pod="w1",cause="provider_unavailable"} 0x5 1x15
				paydedup_worker_paused{namespace="pay",pod="w1",cause="postgres_unavailable"} 0x20
				paydedup_worker_paused{namespace="pay",pod="w2",cause="provider_unavailable"} 0x20`,
			at:   15 * time.Minute,
			want: []string{`{cause="provider_unavailable", namespace="pay"}`},
		},
		{
			// 10 % of two pods' calls answered 429 for 20 minutes.
			name: "sustained 429 share", alert: "PaydedupProviderRateLimited",
			series: `load 1m
				paydedup_provider_requests_total{namespace="pay",pod="w1"} 0+600x40
				paydedup_provider_requests_total{namespace="pay",pod="w2"} 0+600x40
				paydedup_provider_rate_limited_total{namespace="pay",pod="w1",reason="global-rate"} 0+60x40
				paydedup_provider_rate_limited_total{namespace="pay",pod="w2",reason="none"} 0+60x40`,
			at:   35 * time.Minute,
			want: []string{`{namespace="pay"}`},
		},
		{
			// 1 %: the budget doing its work.
			name: "a few 429s", alert: "PaydedupProviderRateLimited",
			series: `load 1m
				paydedup_provider_requests_total{namespace="pay",pod="w1"} 0+600x40
				paydedup_provider_rate_limited_total{namespace="pay",pod="w1",reason="global-rate"} 0+6x40`,
			at: 35 * time.Minute,
		},
		{
			// A burst of 429s for 5 minutes, then none.
			name: "brief 429 storm", alert: "PaydedupProviderRateLimited",
			series: `load 1m
				paydedup_provider_requests_total{namespace="pay",pod="w1"} 0+600x40
				paydedup_provider_rate_limited_total{namespace="pay",pod="w1",reason="global-rate"} 0x20 0+300x5 1500x15`,
			at: 39 * time.Minute,
		},
		{
			name: "worker paused briefly", alert: "PaydedupWorkerPaused",
			series: `load 1m
				paydedup_worker_paused{namespace="pay",pod="w1",cause="postgres_unavailable"} 0x10 1x3 0x10`,
			at: 20 * time.Minute,
		},
		{
			name: "slow reads", alert: "PaydedupGatewaySlowReads",
			series: `load 1m
				paydedup_gateway_request_duration_seconds_bucket{namespace="pay",pod="g1",route="get_payment",le="0.5"} 0+10x30
				paydedup_gateway_request_duration_seconds_bucket{namespace="pay",pod="g1",route="get_payment",le="2"} 0+100x30
				paydedup_gateway_request_duration_seconds_bucket{namespace="pay",pod="g1",route="get_payment",le="+Inf"} 0+100x30`,
			at:   20 * time.Minute,
			want: []string{`{namespace="pay"}`},
		},
		{
			// A POST held open by Prefer: wait is slow on purpose.
			name: "slow waiting posts", alert: "PaydedupGatewaySlowReads",
			series: `load 1m
				paydedup_gateway_request_duration_seconds_bucket{namespace="pay",pod="g1",route="post_payment",le="0.5"} 0+10x30
				paydedup_gateway_request_duration_seconds_bucket{namespace="pay",pod="g1",route="post_payment",le="+Inf"} 0+100x30`,
			at: 20 * time.Minute,
		},
		{
			name: "slow publishes", alert: "PaydedupGatewaySlowPublishes",
			series: `load 1m
				paydedup_gateway_publish_duration_seconds_bucket{namespace="pay",pod="g1",le="0.1"} 0+10x30
				paydedup_gateway_publish_duration_seconds_bucket{namespace="pay",pod="g1",le="1"} 0+100x30
				paydedup_gateway_publish_duration_seconds_bucket{namespace="pay",pod="g1",le="+Inf"} 0+100x30`,
			at:   20 * time.Minute,
			want: []string{`{namespace="pay"}`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, ok := rules[tt.alert]
			if !ok {
				t.Fatalf("no alert %s", tt.alert)
			}
			got := firing(t, r, tt.series, tt.at)
			if !slices.Equal(got, tt.want) {
				t.Errorf("%s at %v: firing %q, want %q", tt.alert, tt.at, got, tt.want)
			}
		})
	}
}
