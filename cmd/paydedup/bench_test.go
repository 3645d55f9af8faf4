//go:build !nolab

package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/lab/bench"
	"github.com/paydedup/paydedup/lab/testenv"
)

// TestBenchReportsJSON runs the real bench, small, in both modes and with
// both providers: the last line is the JSON report, with CPU figures, and
// the simulator's ledger says every payment was charged exactly once.
func TestBenchReportsJSON(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "NATS_URL": testenv.NATSURL(t)}
	for _, c := range []struct {
		name, mode, provider string
		payments, dups       int
		args                 []string
	}{
		{"batched-sim", "batched", "sim", 400, 120, []string{"--duplicates", "0.3", "--completed-duplicates"}},
		{"batched-stripe", "batched", "stripe", 200, 0, []string{"--provider-latency", "2ms", "--concurrency", "32"}},
		{"batched-pool-2", "batched", "sim", 300, 0, []string{"--pool-size", "2"}},
		{"naive-sim", "naive", "sim", 100, 0, nil},
		{"naive-sim-8", "naive", "sim", 100, 0, []string{"--concurrency", "8"}},
		{"compare-naive", "batched", "sim", 200, 0, []string{"--compare-naive", "--naive-payments", "40"}},
		{"warmup", "batched", "sim", 300, 0, []string{"--warmup", "200", "--window", "100"}},
	} {
		// One at a time: each run profiles the process's CPU, which a
		// process does for one caller at a time, and splits the process's
		// CPU time, which a parallel run would blur.
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"bench", "--json", "--mode", c.mode, "--provider", c.provider,
				"--payments", strconv.Itoa(c.payments)}, c.args...)
			out, errOut, err := runCLI(context.Background(), env, args...)
			if err != nil {
				t.Fatalf("bench: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
			}
			lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
			var r bench.Result
			if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
				t.Fatalf("last line is not the JSON report: %v\n%s", err, out)
			}
			if r.Mode != c.mode || r.Provider != c.provider || r.Payments != c.payments || r.Duplicates != c.dups ||
				r.Messages != c.payments+c.dups {
				t.Errorf("report %+v, want mode %s, provider %s, %d payments, %d duplicates", r, c.mode, c.provider, c.payments, c.dups)
			}
			if r.DoubleCharges != 0 || r.Lost != 0 {
				t.Errorf("%d double charges, %d lost", r.DoubleCharges, r.Lost)
			}
			if r.Seconds <= 0 || r.PaymentsPerSec <= 0 || r.P50MS <= 0 || r.P99MS < r.P50MS || r.RSSMB <= 0 {
				t.Errorf("implausible figures: %+v", r)
			}
			// Batched: one claim per fetch and one commit per group, so far
			// fewer than one round trip per payment; naive: two per payment.
			switch {
			case c.mode == "batched" && (r.PGRoundTripsPerPayment <= 0 || r.PGRoundTripsPerPayment >= 1):
				t.Errorf("batched: %.2f round trips per payment", r.PGRoundTripsPerPayment)
			case c.mode == "naive" && r.PGRoundTripsPerPayment < 2:
				t.Errorf("naive: %.2f round trips per payment, want at least 2", r.PGRoundTripsPerPayment)
			}
			// The bench's backends are on this machine (testenv's local
			// server), and the worker spends CPU on every payment. (The
			// process's other tests run beside it, so the split itself is
			// not asserted here: cpu_test.go checks it.)
			if r.PGCPUUSPerPayment <= 0 || r.PGBackends < 1 || r.WorkerCPUUSPerPayment <= 0 || r.SimCPUUSPerPayment < 0 ||
				r.NATSCPUUSPerPayment < 0 || r.ProcessCPUUSPerPayment < r.WorkerCPUUSPerPayment || r.HeapWorkerMB <= 0 {
				t.Errorf("implausible CPU or heap figures: %+v", r)
			}
			// Every payment writes WAL (its key row, its ledger row); the
			// figure is the cluster's, other tests' writes included.
			if r.PGWALBytesPerPayment <= 0 || r.PGCheckpoints < 0 {
				t.Errorf("WAL: %v bytes per payment, %d checkpoints", r.PGWALBytesPerPayment, r.PGCheckpoints)
			}
			// The worker's pool as "paydedup worker" opens it, unless
			// --pool-size says otherwise; the naive design has at least a
			// connection per handler. The bench's backends are the pool's.
			wantPool := map[string]int{"batched-pool-2": 2, "naive-sim-8": max(8, consumer.DefaultPoolSize())}[c.name]
			if wantPool == 0 {
				wantPool = consumer.DefaultPoolSize()
			}
			if r.PGPoolSize != wantPool || r.PGBackends > r.PGPoolSize {
				t.Errorf("pool of %d connections, %d backends; want a pool of %d", r.PGPoolSize, r.PGBackends, wantPool)
			}
			wantConc := map[string]int{"naive-sim": 1, "naive-sim-8": 8}[c.name]
			if wantConc > 0 && r.Concurrency != wantConc {
				t.Errorf("naive ran %d handlers, want %d", r.Concurrency, wantConc)
			}
			if c.name == "compare-naive" {
				if len(r.Naive) != 3 || r.NaiveBestPerSec <= 0 || r.RatioToBestNaive != r.PaymentsPerSec/r.NaiveBestPerSec {
					t.Errorf("compare-naive: %d naive runs, best %v at %d, ratio %v", len(r.Naive), r.NaiveBestPerSec, r.NaiveBest, r.RatioToBestNaive)
				}
				for i, n := range r.Naive {
					if n.Mode != "naive" || n.Concurrency != bench.NaiveConcurrencies[i] || n.Payments != 40 || n.DoubleCharges != 0 || n.Lost != 0 {
						t.Errorf("naive run %d: %+v", i, n)
					}
				}
			}
			// The warm-up's payments are worked first by a worker of their
			// own and checked in the ledger (a lost or double one fails the
			// run), but the clock and the windows count the timed ones only.
			if c.name == "warmup" {
				if r.WarmupPayments != 200 || !strings.Contains(errOut, "warm-up: 200 payments settled") {
					t.Errorf("warm-up: %d in the report; stderr:\n%s", r.WarmupPayments, errOut)
				}
				if n := len(r.Windows); n != 3 || r.Windows[n-1].Settled != int64(c.payments) {
					t.Errorf("windows %+v, want 3 over the %d timed payments", r.Windows, c.payments)
				}
			} else if r.WarmupPayments != 0 {
				t.Errorf("a warm-up of %d without --warmup", r.WarmupPayments)
			}
			if c.name == "batched-sim" && (r.CompletedDuplicates != c.payments || r.CompletedDupMessagesSec <= 0) {
				t.Errorf("completed duplicates: %d at %.0f/s, want %d", r.CompletedDuplicates, r.CompletedDupMessagesSec, c.payments)
			}
			if !strings.Contains(errOut, "settled") && !strings.Contains(errOut, "publishing") {
				t.Errorf("no progress on stderr:\n%s", errOut)
			}
		})
	}
}

func TestBenchBadFlags(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--provider", "paypal"}, "--provider must be sim or stripe"},
		{[]string{"bench", "--mode", "fast"}, "--mode must be batched or naive"},
		{[]string{"bench", "--duplicates", "1.5"}, "--duplicates must be within 0..1"},
		{[]string{"bench", "--payments", "0"}, "--payments must be at least 1"},
		{[]string{"bench", "--pool-size", "0"}, "--pool-size must be at least 1"},
		{[]string{"bench", "--compare-naive", "--mode", "naive"}, "--compare-naive needs --mode batched"},
		{[]string{"bench", "--compare-naive", "--naive-payments", "0"}, "--naive-payments of at least 1"},
		{[]string{"bench", "--warmup", "-1"}, "--warmup must not be negative"},
		{[]string{"bench", "--warmup", "100", "--duplicates", "0.1"}, "--warmup cannot be combined with --duplicates"},
		{[]string{"bench", "growth", "--warmup", "-5", "--rows", "0"}, "--warmup must not be negative"},
	} {
		if _, _, err := runCLI(context.Background(), map[string]string{}, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}
