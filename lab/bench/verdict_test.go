package bench

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/lab/workload"
	"github.com/paydedup/paydedup/ledger"
)

// TestBenchVerdictOnDoubleCharge gives the bench's judge a ledger with a
// key charged twice: it is counted, and the run fails.
func TestBenchVerdictOnDoubleCharge(t *testing.T) {
	t.Parallel()
	done := workload.Row{Status: "completed", ResponseStatus: 200, ChargeID: "pi_1"}
	rows := map[string]workload.Row{"m_bench:p-0": done, "m_bench:p-1": done, "m_bench:p-2": done, "m_bench:p-3": done}
	charges := map[string]int{"m_bench:p-0": 1, "m_bench:p-1": 2, "m_bench:p-2": 1, "m_bench:p-3": 1}
	w := workload.Numbered{N: 4}
	if double, lost := benchJudge(charges, rows, w.Expected()); double != 1 || lost != 0 {
		t.Errorf("one key charged twice: %d double, %d lost; want 1 and 0", double, lost)
	}
	charges["m_bench:p-1"] = 1
	delete(charges, "m_bench:p-2")                        // never charged
	rows["m_bench:p-3"] = workload.Row{Status: "pending"} // charged, not recorded
	if double, lost := benchJudge(charges, rows, w.Expected()); double != 0 || lost != 2 {
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

// chunkGetter serves every payment's row as completed, but none for lost,
// and counts the reads.
type chunkGetter struct {
	lost  map[string]bool
	reads []int
}

func (g *chunkGetter) GetMany(_ context.Context, refs []ledger.KeyRef) ([]ledger.Record, error) {
	g.reads = append(g.reads, len(refs))
	var out []ledger.Record
	for _, r := range refs {
		if !g.lost[workload.RowKey(r)] {
			out = append(out, ledger.Record{MerchantID: r.MerchantID, IdempotencyKey: r.IdempotencyKey,
				Status: ledger.StatusCompleted, ResponseStatus: 200, ChargeID: "pi_1"})
		}
	}
	return out, nil
}

// TestBenchCheckReadsInChunks checks a run of more payments than one read
// holds: the rows are read a chunk at a time, a payment lost in any chunk
// counts once, and a double charge counts once, not once per chunk.
func TestBenchCheckReadsInChunks(t *testing.T) {
	t.Parallel()
	w := workload.Numbered{N: 2*checkChunk + 3}
	charges := map[string]int{}
	for _, e := range w.Expected() {
		charges[e.Key] = 1
	}
	last := workload.RowKey(w.Refs()[w.N-1])
	charges["m_bench:p-7"] = 2
	g := &chunkGetter{lost: map[string]bool{"m_bench:p-1": true, last: true}}
	double, lost, err := benchCheck(context.Background(), g, charges, w)
	if err != nil || double != 1 || lost != 2 {
		t.Fatalf("benchCheck: %d double, %d lost, %v; want 1, 2, nil", double, lost, err)
	}
	if want := []int{checkChunk, checkChunk, 3}; !slices.Equal(g.reads, want) {
		t.Errorf("reads of %v rows, want %v", g.reads, want)
	}
}
