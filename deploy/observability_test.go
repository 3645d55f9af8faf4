package deploy

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// metrics are paydedup's Prometheus metrics (ops), with the label
// values the dashboard and the alerts may match on. Keep it in step with
// ops: a name here that the binary does not export fails
// TestMetricsExported.
var metrics = map[string]struct {
	histogram bool
	labels    map[string][]string
}{
	"paydedup_messages_total": {labels: map[string][]string{
		"result": {"processed", "declined", "duplicate", "in_flight_nak", "retry_nak", "dead_lettered", "requeued"},
	}},
	"paydedup_dead_lettered_total":       {labels: map[string][]string{"reason": nil}},
	"paydedup_in_flight":                 {},
	"paydedup_claim_duration_seconds":    {histogram: true},
	"paydedup_complete_duration_seconds": {histogram: true},
	"paydedup_complete_batch_size":       {histogram: true},
	"paydedup_provider_call_duration_seconds": {histogram: true, labels: map[string][]string{
		"result": {"charged", "declined", "processing", "unknown_outcome", "retryable", "idempotency_mismatch", "rejected", "unauthorized"},
	}},
	"paydedup_provider_errors_total": {labels: map[string][]string{
		"class": {"unknown_outcome", "retryable", "idempotency_mismatch", "rejected", "unauthorized"},
	}},
	"paydedup_reconciler_runs_total":          {labels: map[string][]string{"result": {"ok", "lookup_errors", "error"}}},
	"paydedup_reconciler_lookup_errors_total": {},
	"paydedup_reconciler_rows_total": {labels: map[string][]string{
		"result": {"completed", "declined", "failed", "left", "lease_lost", "foreign_intent", "settled_succeeded", "settled_failed"},
	}},
	"paydedup_purged_rows_total":                      {},
	"paydedup_stuck_pending_rows":                     {},
	"paydedup_reconciler_last_pass_timestamp_seconds": {},
	"paydedup_build_info":                             {labels: map[string][]string{"version": nil}},
	"paydedup_pending_rows":                           {},
	// Refunds, captures and cancels stuck or unknown (ops.WatchOperations).
	"paydedup_stuck_operations":   {labels: map[string][]string{"kind": {"refund", "capture", "cancel"}}},
	"paydedup_unknown_operations": {labels: map[string][]string{"kind": {"refund", "capture", "cancel"}}},
	// The outbox of outcome events (cmd/paydedup/outcomes.go).
	"paydedup_outcome_events_unrelayed":  {},
	"paydedup_outcome_relay_lag_seconds": {},
	// The publishers' intake (cmd/paydedup/outcomes.go, package intake).
	"paydedup_intake_commands_waiting":  {},
	"paydedup_intake_relay_lag_seconds": {},
	"paydedup_intake_commands_rejected": {},
	// A worker's pause (consumer's gate) and the messages it holds.
	"paydedup_worker_paused":        {labels: map[string][]string{"cause": {"provider_auth", "provider_unavailable", "postgres_unavailable"}}},
	"paydedup_worker_held_messages": {},
	// Fairness between merchants (consumer's lanes, the fair call slots).
	"paydedup_worker_lanes":               {},
	"paydedup_provider_merchants_waiting": {},
	// The fleet's provider budget (budget/metrics.go).
	"paydedup_provider_budget_rate":         {},
	"paydedup_provider_budget_wait_seconds": {histogram: true},
	"paydedup_provider_rate_limited_total": {labels: map[string][]string{
		"reason": {"global-rate", "global-concurrency", "endpoint-rate", "endpoint-concurrency", "resource-specific", "none", "other"},
	}},
	"paydedup_provider_requests_total":            {},
	"paydedup_provider_budget_store_errors_total": {},
	// The workers' JetStream consumer, read from its info at scrape time.
	"paydedup_consumer_pending_messages":           {labels: map[string][]string{"stream": nil, "consumer": nil}},
	"paydedup_stream_bytes":                        {labels: map[string][]string{"stream": nil, "consumer": nil}},
	"paydedup_stream_messages":                     {labels: map[string][]string{"stream": nil, "consumer": nil}},
	"paydedup_stream_max_bytes":                    {labels: map[string][]string{"stream": nil, "consumer": nil}},
	"paydedup_stream_max_messages":                 {labels: map[string][]string{"stream": nil, "consumer": nil}},
	"paydedup_stream_oldest_unsettled_age_seconds": {labels: map[string][]string{"stream": nil, "consumer": nil}},
	"paydedup_consumer_ack_pending_messages":       {labels: map[string][]string{"stream": nil, "consumer": nil}},
	"paydedup_consumer_redelivered_messages":       {labels: map[string][]string{"stream": nil, "consumer": nil}},
	"paydedup_consumer_waiting_pulls":              {labels: map[string][]string{"stream": nil, "consumer": nil}},
	"paydedup_consumer_info_up":                    {labels: map[string][]string{"stream": nil, "consumer": nil}},
	// The PostgreSQL pool of the worker and the gateway (ops.WatchPool).
	"paydedup_pg_pool_max_connections":            {},
	"paydedup_pg_pool_connections":                {},
	"paydedup_pg_pool_acquired_connections":       {},
	"paydedup_pg_pool_acquires_total":             {},
	"paydedup_pg_pool_waited_acquires_total":      {},
	"paydedup_pg_pool_acquire_wait_seconds_total": {},
	// The gateway (gateway/metrics.go).
	"paydedup_gateway_requests_total": {labels: map[string][]string{
		"route": {"post_payment", "get_payment", "stripe_webhook", "other"}, "code": nil,
	}},
	"paydedup_gateway_request_duration_seconds": {histogram: true, labels: map[string][]string{
		"route": {"post_payment", "get_payment", "stripe_webhook", "other"},
	}},
	"paydedup_gateway_idempotency_total": {labels: map[string][]string{
		"result": {"new", "replayed", "in_flight", "mismatch", "dead_lettered", "not_republished"},
	}},
	"paydedup_gateway_publishes_total":          {labels: map[string][]string{"result": {"ok", "error"}}},
	"paydedup_gateway_publish_duration_seconds": {histogram: true},
	"paydedup_gateway_waits_total": {labels: map[string][]string{
		"result": {"completed", "dead_lettered", "timeout", "shutdown", "cancelled"},
	}},
	"paydedup_gateway_auth_failures_total": {},
	"paydedup_gateway_webhook_events_total": {labels: map[string][]string{
		"result": {"bad_signature", "ignored_type", "not_ours", "no_payment", "foreign_intent", "still_processing", "settled", "agrees", "disagrees",
			"recheck_requested", "not_recorded", "error"},
	}},
}

// promql parses expressions as Prometheus does.
var promql = parser.NewParser(parser.Options{})

// grafanaVars are Grafana's built-in range variables, replaced by a range so
// that dashboard queries parse as PromQL.
var plainAlternatives = regexp.MustCompile(`^[a-z0-9_]+(\|[a-z0-9_]+)*$`)

var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// exprProblems parses a PromQL expression (Grafana variables substituted)
// and lists the paydedup metrics it selects and what is wrong with it: a
// parse error, a metric paydedup does not export, a histogram used bare, or
// a label value it never sets.
func exprProblems(expr string) (names, problems []string) {
	ast, err := promql.ParseExpr(grafanaVars.Replace(expr))
	if err != nil {
		return nil, []string{"parse: " + err.Error()}
	}
	base := func(ref string) string {
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			if b := strings.TrimSuffix(ref, suffix); b != ref && metrics[b].histogram {
				return b
			}
		}
		return ref
	}
	parser.Inspect(ast, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok || !strings.HasPrefix(vs.Name, "paydedup_") {
			return nil
		}
		name := base(vs.Name)
		m, ok := metrics[name]
		switch {
		case !ok:
			problems = append(problems, "unknown metric "+vs.Name)
			return nil
		case m.histogram && name == vs.Name:
			problems = append(problems, "histogram "+vs.Name+" used without _bucket, _count or _sum")
		}
		names = append(names, name)
		for _, lm := range vs.LabelMatchers {
			values := m.labels[lm.Name]
			if values == nil || strings.Contains(lm.Value, "$") {
				continue
			}
			switch lm.Type {
			case labels.MatchEqual:
				if !slices.Contains(values, lm.Value) {
					problems = append(problems, fmt.Sprintf("%s{%s=%q}: %q is not one of %v", name, lm.Name, lm.Value, lm.Value, values))
				}
			case labels.MatchRegexp:
				// An alternation of plain words: each must be a value paydedup
				// sets (a typo in one would match nothing, silently). Any other
				// regexp must match at least one.
				if plainAlternatives.MatchString(lm.Value) {
					for _, v := range strings.Split(lm.Value, "|") {
						if !slices.Contains(values, v) {
							problems = append(problems, fmt.Sprintf("%s{%s=~%q}: %q is not one of %v", name, lm.Name, lm.Value, v, values))
						}
					}
				} else if !slices.ContainsFunc(values, lm.Matches) {
					problems = append(problems, fmt.Sprintf("%s{%s=~%q} matches none of %v", name, lm.Name, lm.Value, values))
				}
			}
		}
		return nil
	})
	return names, problems
}

// checkExpr reports exprProblems and returns the metrics named.
func checkExpr(t *testing.T, where, expr string) []string {
	t.Helper()
	names, problems := exprProblems(expr)
	for _, p := range problems {
		t.Errorf("%s: %s in %q", where, p, expr)
	}
	return names
}

func TestMetricsExported(t *testing.T) {
	b := readBinary(t)
	var missing []string
	for name := range metrics {
		if !b.literals[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	// The dashboard and the alerts match on these names: one the binary
	// does not register would draw an empty panel or an alert that never
	// fires.
	if len(missing) > 0 {
		t.Errorf("named by the dashboard and alerts but not registered in paydedup's source: %s", strings.Join(missing, ", "))
	}
}

func TestGrafanaDashboard(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("grafana", "paydedup.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID        string            `json:"uid"`
		Title      string            `json:"title"`
		Panels     []json.RawMessage `json:"panels"`
		Templating struct {
			List []struct {
				Name string `json:"name"`
				Type string `json:"type"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("grafana/paydedup.json: %v", err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Error("dashboard needs a uid and a title")
	}
	if !slices.ContainsFunc(dash.Templating.List, func(v struct {
		Name string `json:"name"`
		Type string `json:"type"`
	}) bool {
		return v.Name == "datasource" && v.Type == "datasource"
	}) {
		t.Error("dashboard has no datasource variable: it would be tied to one Prometheus")
	}

	type target struct {
		Expr string `json:"expr"`
	}
	type panel struct {
		Title      string          `json:"title"`
		Type       string          `json:"type"`
		Datasource json.RawMessage `json:"datasource"`
		Targets    []target        `json:"targets"`
		Panels     []panel         `json:"panels"`
	}
	used := map[string]bool{}
	var titles []string
	var walk func(p panel)
	walk = func(p panel) {
		titles = append(titles, strings.ToLower(p.Title))
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no queries", p.Title)
		}
		if len(p.Targets) > 0 && !strings.Contains(string(p.Datasource), "${datasource}") {
			t.Errorf("panel %q does not use the ${datasource} variable", p.Title)
		}
		for _, tg := range p.Targets {
			for _, n := range checkExpr(t, "panel "+p.Title, tg.Expr) {
				used[n] = true
			}
		}
		for _, c := range p.Panels {
			walk(c)
		}
	}
	for _, raw := range dash.Panels {
		var p panel
		if err := json.Unmarshal(raw, &p); err != nil {
			t.Fatal(err)
		}
		walk(p)
	}
	for name := range metrics {
		if !used[name] {
			t.Errorf("no panel shows %s", name)
		}
	}
	// The panels the operators asked for, by title.
	for _, want := range []string{"throughput by result", "dead letters by reason", "in flight", "p50 / p99", "unknown-outcome rate", "stuck pending", "reconcile",
		"consumer backlog", "pending rows", "gateway requests", "gateway latency"} {
		if !slices.ContainsFunc(titles, func(s string) bool { return strings.Contains(s, want) }) {
			t.Errorf("no panel titled like %q", want)
		}
	}
}

// loadAlerts strict-decodes prometheus/alerts.yaml.
func loadAlerts(t *testing.T) prometheusRule {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("prometheus", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var pr prometheusRule
	if err := strictYAML(data, &pr); err != nil {
		t.Fatalf("prometheus/alerts.yaml: %v", err)
	}
	return pr
}

func TestPrometheusAlerts(t *testing.T) {
	pr := loadAlerts(t)
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" {
		t.Errorf("alerts.yaml is %s %s, want monitoring.coreos.com/v1 PrometheusRule", pr.APIVersion, pr.Kind)
	}
	covered := checkRules(t, pr.Spec)
	// What must page someone: money in limbo, refused messages, a provider
	// that leaves outcomes unknown, and nobody resolving them.
	for _, want := range []string{
		"paydedup_stuck_pending_rows",
		"paydedup_dead_lettered_total",
		`paydedup_provider_errors_total{class="unknown_outcome"}`,
		"paydedup_reconciler_last_pass_timestamp_seconds",
	} {
		if !slices.ContainsFunc(covered, func(expr string) bool { return strings.Contains(expr, want) }) {
			t.Errorf("no alert on %s", want)
		}
	}
}

// checkRules checks a rule file and returns its alert expressions.
func checkRules(t *testing.T, rf ruleFile) []string {
	t.Helper()
	if len(rf.Groups) == 0 {
		t.Error("rule file has no groups")
	}
	// Prometheus's own loader: the group and rule schema, every expression
	// parsed, every annotation and label template compiled.
	data, err := yaml.Marshal(rf)
	if err != nil {
		t.Fatal(err)
	}
	if _, errs := rulefmt.Parse(data, false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler)); len(errs) > 0 {
		for _, err := range errs {
			t.Errorf("rulefmt: %v", err)
		}
	}
	runbooks := runbookAnchors(t)
	var exprs []string
	seen := map[string]bool{}
	for _, g := range rf.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("rule group %q is unnamed or empty", g.Name)
		}
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			where := "alert " + r.Alert
			if seen[r.Alert] {
				t.Errorf("%s: defined twice", where)
			}
			seen[r.Alert] = true
			if strings.TrimSpace(r.Expr) == "" {
				t.Errorf("%s: no expr", where)
			}
			if u := r.Annotations["runbook_url"]; !strings.HasPrefix(u, runbookBase) || !runbooks[strings.TrimPrefix(u, runbookBase)] {
				t.Errorf("%s: runbook_url %q is not %s#<a heading of docs/runbooks.md>", where, u, runbookBase)
			} else if want := runbookBase + strings.ToLower(r.Alert); u != want {
				t.Errorf("%s: runbook_url %q, want its own section %s", where, u, want)
			}
			if len(checkExpr(t, where, r.Expr)) == 0 {
				t.Errorf("%s: names no paydedup metric", where)
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q, want warning or critical", where, s)
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("%s: no summary annotation", where)
			}
			exprs = append(exprs, r.Expr)
		}
	}
	return exprs
}

// runbookBase is where alerts link: docs/runbooks.md as GitHub renders it.
const runbookBase = "https://github.com/paydedup/paydedup/blob/main/docs/runbooks.md#"

// runbookAnchors returns the anchors of docs/runbooks.md's second-level
// headings, as GitHub derives them (lower case; spaces to dashes).
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(mainModule, "docs", "runbooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			anchors[strings.ReplaceAll(strings.ToLower(strings.TrimSpace(h)), " ", "-")] = true
		}
	}
	return anchors
}

// TestRunbooksCoverAlerts: every runbook section belongs to an alert, so
// the document does not keep procedures for alerts that are gone.
func TestRunbooksCoverAlerts(t *testing.T) {
	pr := loadAlerts(t)
	alerts := map[string]bool{}
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			alerts[strings.ToLower(r.Alert)] = true
		}
	}
	for a := range runbookAnchors(t) {
		if !alerts[a] {
			t.Errorf("docs/runbooks.md has a section #%s for no alert", a)
		}
	}
}

func TestExprProblems(t *testing.T) {
	tests := []struct {
		expr string
		ok   bool
	}{
		{`sum by (result) (rate(paydedup_messages_total[5m]))`, true},
		{`histogram_quantile(0.99, sum by (le) (rate(paydedup_claim_duration_seconds_bucket[5m])))`, true},
		{`rate(paydedup_provider_errors_total{class="unknown_outcome"}[5m])`, true},
		{`rate(paydedup_provider_errors_total{class="timeout"}[5m])`, false},
		{`rate(paydedup_messages_total{result=~"processed|declined"}[5m])`, true},
		{`rate(paydedup_messages_total{result="acked"}[5m])`, false},
		{`rate(paydedup_reconciler_rows_total{result="left"}[5m]) + rate(paydedup_messages_total{result="duplicate"}[5m])`, true},
		{`rate(paydedup_messages_total{namespace=~"$namespace"}[5m])`, true},
		{`rate(paydedup_message_total[5m])`, false},
		{`paydedup_claim_duration_seconds`, false},
		{`rate(paydedup_messages_total{result=~"processed|acked"}[5m])`, false},
		{`sum(rate(paydedup_gateway_requests_total{code=~"5.."}[$__rate_interval]))`, true},
		{`sum(rate(paydedup_messages_total[5m])`, false},
		{`rate(paydedup_messages_total[5m]) +`, false},
	}
	for _, tt := range tests {
		_, problems := exprProblems(tt.expr)
		if ok := len(problems) == 0; ok != tt.ok {
			t.Errorf("exprProblems(%s) = %q, want ok %v", tt.expr, problems, tt.ok)
		}
	}
}
