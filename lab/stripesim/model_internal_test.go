package stripesim

import (
	"math"
	"testing"
	"time"
)

// TestLatencyHistQuantiles: the histogram's quantiles are within 1 % of a
// known sample's.
func TestLatencyHistQuantiles(t *testing.T) {
	t.Parallel()
	var h latencyHist
	if h.quantile(0.5) != 0 {
		t.Error("an empty histogram has a median")
	}
	for i := 1; i <= 1000; i++ {
		h.add(time.Duration(i) * time.Millisecond)
	}
	h.add(0)
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Millisecond}, {0.99, 990 * time.Millisecond}, {1, time.Second}} {
		if got := h.quantile(c.q); math.Abs(float64(got-c.want)) > 0.011*float64(c.want) {
			t.Errorf("quantile(%v) = %v, want %v within 1 %%", c.q, got, c.want)
		}
	}
	var z latencyHist
	z.add(0)
	z.add(0)
	z.add(time.Second)
	if z.quantile(0.5) != 0 || z.n != 3 {
		t.Errorf("zeros: median %v of %d, want 0 of 3", z.quantile(0.5), z.n)
	}
}
