//go:build !nolab

package main

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/lab/shipbench"
	"github.com/paydedup/paydedup/lab/testenv"
)

// TestBenchDoorRunsTheRealGateway builds the binary and runs a short door
// bench: wrk against its own gateway command, then its worker draining
// the backlog, then both at once. Every published POST completed, none
// charged twice. wrk is a Debian package .ci/run installs: under CI a
// missing wrk fails the test.
func TestBenchDoorRunsTheRealGateway(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("wrk"); err != nil {
		if testenv.InCI() {
			t.Fatalf("wrk is not on PATH (CI=true: .ci/run installs it; apt-get install -y wrk)")
		}
		t.Skip("wrk is not on PATH: apt-get install -y wrk")
	}
	bin := filepath.Join(t.TempDir(), "paydedup")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	env := map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "NATS_URL": testenv.NATSURL(t)}
	out, errOut, err := runCLI(context.Background(), env, "bench", "door", "--binary", bin, "--json",
		"--seconds", "2", "--connections", "16")
	if err != nil {
		t.Fatalf("bench door: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	var r shipbench.DoorResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatalf("last line is not the JSON report: %v\n%s", err, out)
	}
	if r.Mode != "door" || r.Connections != 16 || r.DoorAccepted <= 0 || r.DoorAcceptedPerSec <= 0 {
		t.Errorf("door phase %+v, want POSTs accepted at 16 connections", r)
	}
	if r.WorkerPayments < r.DoorAccepted || r.WorkerPaymentsPerSec <= 0 || r.DoorOverWorker <= 0 {
		t.Errorf("worker drained %d of %d accepted (%.0f/s)", r.WorkerPayments, r.DoorAccepted, r.WorkerPaymentsPerSec)
	}
	if r.P2CAccepted <= 0 || r.P2CCompleted < r.P2CAccepted || r.ChargedPerSec <= 0 || r.POSTToChargedP99MS <= 0 {
		t.Errorf("post-to-charged %d accepted, %d completed, %.0f/s, p99 %.1f ms", r.P2CAccepted, r.P2CCompleted, r.ChargedPerSec, r.POSTToChargedP99MS)
	}
	if r.GatewayCPUUSPerPOST <= 0 || r.PGCPUUSPerPOST <= 0 {
		t.Errorf("CPU per POST not read: gateway %v µs, PostgreSQL %v µs", r.GatewayCPUUSPerPOST, r.PGCPUUSPerPOST)
	}
	if r.WorkerCPUUSPerPayment <= 0 || r.WorkerPGCPUUSPerPayment <= 0 || r.SimCPUUSPerPayment <= 0 || r.GatewayCPUUSPerPaymentDraining < 0 {
		t.Errorf("CPU per payment drained not read: worker %v µs, its PostgreSQL %v µs, provider-sim %v µs, gateway %v µs",
			r.WorkerCPUUSPerPayment, r.WorkerPGCPUUSPerPayment, r.SimCPUUSPerPayment, r.GatewayCPUUSPerPaymentDraining)
	}
	if r.DoubleCharges != 0 || r.Lost != 0 {
		t.Errorf("double charges %d, lost %d, want none", r.DoubleCharges, r.Lost)
	}
}

func TestBenchDoorRejectsBadSettings(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--seconds", "0"}, "--seconds"},
		{[]string{"--threads", "0"}, "--threads"},
		{[]string{"--connections", "1", "--threads", "2"}, "--connections"},
		{[]string{"--provider", "paypal"}, "--provider"},
		{[]string{"--timeout", "0s"}, "--timeout"},
	} {
		_, _, err := runCLI(context.Background(), nil, append([]string{"bench", "door"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err %v, want one naming %s", c.args, err, c.want)
		}
	}
}
