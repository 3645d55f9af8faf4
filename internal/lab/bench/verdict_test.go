package bench

import (
	"strings"
	"testing"

	"github.com/paydedup/paydedup/internal/workload"
)

// TestBenchVerdictOnDoubleCharge gives the bench's judge a ledger with a
// key charged twice: it is counted, and the run fails.
func TestBenchVerdictOnDoubleCharge(t *testing.T) {
	t.Parallel()
	done := workload.Row{Status: "completed", ResponseStatus: 200, ChargeID: "pi_1"}
	rows := map[string]workload.Row{"m_bench:p-0": done, "m_bench:p-1": done, "m_bench:p-2": done, "m_bench:p-3": done}
	charges := map[string]int{"m_bench:p-0": 1, "m_bench:p-1": 2, "m_bench:p-2": 1, "m_bench:p-3": 1}
	w := workload.Numbered{N: 4}
	if double, lost := benchJudge(charges, rows, w); double != 1 || lost != 0 {
		t.Errorf("one key charged twice: %d double, %d lost; want 1 and 0", double, lost)
	}
	charges["m_bench:p-1"] = 1
	delete(charges, "m_bench:p-2")                        // never charged
	rows["m_bench:p-3"] = workload.Row{Status: "pending"} // charged, not recorded
	if double, lost := benchJudge(charges, rows, w); double != 0 || lost != 2 {
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
