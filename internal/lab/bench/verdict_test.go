package bench

import (
	"strings"
	"testing"
)

// TestBenchVerdictOnDoubleCharge gives the bench's judge a ledger with a
// key charged twice: it is counted, and the run fails.
func TestBenchVerdictOnDoubleCharge(t *testing.T) {
	t.Parallel()
	completed := map[string]bool{"m_bench:p-0": true, "m_bench:p-1": true, "m_bench:p-2": true, "m_bench:p-3": true}
	charges := map[string]int{"m_bench:p-0": 1, "m_bench:p-1": 2, "m_bench:p-2": 1, "m_bench:p-3": 1}
	if double, lost := benchJudge(charges, completed, 4); double != 1 || lost != 0 {
		t.Errorf("one key charged twice: %d double, %d lost; want 1 and 0", double, lost)
	}
	charges["m_bench:p-1"] = 1
	delete(charges, "m_bench:p-2")   // never charged
	completed["m_bench:p-3"] = false // charged, not recorded
	if double, lost := benchJudge(charges, completed, 4); double != 0 || lost != 2 {
		t.Errorf("%d double, %d lost; want 0 and 2", double, lost)
	}
	if err := (Result{DoubleCharges: 1}).verdict(); err == nil || !strings.Contains(err.Error(), "1 double charges") {
		t.Errorf("verdict with a double charge: %v", err)
	}
	if err := (Result{Lost: 1}).verdict(); err == nil {
		t.Error("verdict with a lost payment: nil")
	}
	if err := (Result{}).verdict(); err != nil {
		t.Errorf("clean verdict: %v", err)
	}
}
