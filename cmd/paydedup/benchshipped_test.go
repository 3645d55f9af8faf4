//go:build !nolab

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/lab/shipbench"
	"github.com/paydedup/paydedup/lab/testenv"
)

// TestBenchShippedRunsTheRealWorker builds the binary and measures its own
// worker command, small, with both providers: every payment settled, none
// charged twice (by the simulator's ledger, which the stripe provider
// serves from its own process), and CPU figures read for each process.
func TestBenchShippedRunsTheRealWorker(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "paydedup")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	env := map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "NATS_URL": testenv.NATSURL(t)}
	for _, provider := range []string{shipbench.ProviderStripeTLS, shipbench.ProviderStripe, shipbench.ProviderSim} {
		t.Run(provider, func(t *testing.T) {
			args := []string{"bench", "shipped", "--binary", bin, "--json",
				"--payments", "300", "--provider", provider, "--worker-env", "PAYDEDUP_LOG_LEVEL=warn"}
			if provider == shipbench.ProviderSim {
				// An admin address of the user's own: the batches are read there.
				args = append(args, "--worker-env", fmt.Sprintf("PAYDEDUP_ADMIN_ADDR=127.0.0.1:%d", testenv.FreePort(t)))
			}
			out, errOut, err := runCLI(context.Background(), env, args...)
			if err != nil {
				t.Fatalf("bench shipped: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
			}
			lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
			var r shipbench.Result
			if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
				t.Fatalf("last line is not the JSON report: %v\n%s", err, out)
			}
			if r.Mode != "shipped" || r.Provider != provider || r.Payments != 300 || r.Lost != 0 {
				t.Errorf("report %+v, want shipped, %s, 300 payments, none lost", r, provider)
			}
			wantDoubles := 0
			if provider == shipbench.ProviderSim {
				wantDoubles = -1 // the ledger is inside the worker: not checked
			}
			if r.DoubleCharges != wantDoubles {
				t.Errorf("double charges %d, want %d", r.DoubleCharges, wantDoubles)
			}
			if r.PaymentsPerSec <= 0 || r.WorkerCPUUSPerPayment <= 0 || r.WorkerRSSMB <= 0 || r.PGCPUUSPerPayment <= 0 || r.PGBackends < 1 {
				t.Errorf("implausible figures: %+v", r)
			}
			// The worker's defaults: fetch batches and group commits of at
			// most 200.
			if r.ClaimBatchMean < 1 || r.ClaimBatchMean > 200 || r.CommitBatchMean < 1 || r.CommitBatchMean > 200 {
				t.Errorf("the worker's batches: %v messages per claim, %v per group commit; want both within 1..200", r.ClaimBatchMean, r.CommitBatchMean)
			}
			// The whole server over the drain holds at least the worker's
			// own backends (other tests share the server: more, never less).
			if r.PGServerCPUUSPerPayment < 0 && testenv.InCI() {
				t.Errorf("the server's CPU was not read; CI runs PostgreSQL on this machine: %+v", r)
			}
			if r.PGServerCPUUSPerPayment >= 0 && r.PGServerCPUUSPerPayment < r.PGCPUUSPerPayment-100 {
				t.Errorf("the server's CPU %v µs per payment is below its worker backends' %v", r.PGServerCPUUSPerPayment, r.PGCPUUSPerPayment)
			}
			if (provider != shipbench.ProviderSim) != (r.SimCPUUSPerPayment > 0) {
				t.Errorf("provider-sim CPU %v µs with provider %s", r.SimCPUUSPerPayment, provider)
			}
		})
	}
}

func TestBenchShippedRejectsBadSettings(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--payments", "0"}, "--payments"},
		{[]string{"--provider", "paypal"}, "--provider"},
		{[]string{"--worker-env", "NOEQUALS"}, "--worker-env"},
	} {
		_, _, err := runCLI(context.Background(), nil, append([]string{"bench", "shipped"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err %v, want one naming %s", c.args, err, c.want)
		}
	}
}
