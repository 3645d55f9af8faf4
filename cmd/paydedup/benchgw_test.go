//go:build !nolab

package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/lab/gwbench"
	"github.com/paydedup/paydedup/lab/testenv"
)

// TestBenchGatewayReportsJSON runs the real gateway bench, small: the last
// line is the JSON report, with every accepted payment on the stream
// exactly once.
func TestBenchGatewayReportsJSON(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "NATS_URL": testenv.NATSURL(t)}
	out, errOut, err := runCLI(context.Background(), env, "bench", "gateway", "--json",
		"--requests", "300", "--connections", "16", "--retries", "0.2", "--duplicates", "0.2")
	if err != nil {
		t.Fatalf("bench gateway: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	var m gwbench.Result
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &m); err != nil {
		t.Fatalf("last line is not the JSON report: %v\n%s", err, out)
	}
	// 300 payments, each accepted once; retries and the second of each
	// duplicate pair are 409 (no worker runs).
	if !m.OnStreamOnce || m.Accepted != 300 || m.Conflicts != m.Requests-300 || m.Errors != 0 || m.Shed != 0 {
		t.Errorf("report %+v", m)
	}
	if m.RequestsPerSec <= 0 || m.P50MS <= 0 || m.P99MS < m.P50MS || m.RSSMB <= 0 || m.PGRoundTripsPerRequest <= 0 {
		t.Errorf("implausible figures %+v", m)
	}
}

func TestBenchGatewayBadFlags(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "gateway", "--mode", "batched"}, "unknown flag: --mode"},
		{[]string{"bench", "gateway", "--connections", "0"}, "--connections must be within 1..10000"},
		{[]string{"bench", "gateway", "--retries", "2"}, "--retries and --duplicates must be within 0..1"},
		{[]string{"bench", "gateway", "--pool-size", "0"}, "--pool-size must be within 1..1000"},
	} {
		if _, _, err := runCLI(context.Background(), map[string]string{}, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}

// With --worker the worker charges every accepted payment once, and the
// report has the POST→charged figures.
func TestBenchGatewayWithWorker(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "NATS_URL": testenv.NATSURL(t)}
	out, errOut, err := runCLI(context.Background(), env, "bench", "gateway", "--json", "--worker",
		"--requests", "300", "--connections", "16", "--retries", "0.2", "--duplicates", "0.2")
	if err != nil {
		t.Fatalf("bench gateway --worker: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	var r gwbench.Result
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatalf("last line is not the JSON report: %v\n%s", err, out)
	}
	// Retries meet the key held (409) or charged (replayed).
	if !r.OnStreamOnce || r.Accepted != 300 || r.Conflicts+r.Replayed != r.Requests-300 || r.Errors != 0 {
		t.Fatalf("report %+v", r)
	}
	c := r.Charged
	if c == nil || c.Completed != 300 || c.DoubleCharges != 0 || c.Lost != 0 || c.PerSec <= 0 || c.P50MS <= 0 || c.P99MS < c.P50MS {
		t.Fatalf("charged %+v, want 300 charged once with plausible figures", c)
	}
}
