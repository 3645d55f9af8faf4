package bench

import (
	"cmp"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Window is one window of a run's settled payments: how many were settled
// at its end, its own rate, and the process's resident set then.
type Window struct {
	Settled        int64   `json:"settled"`
	PaymentsPerSec float64 `json:"payments_per_sec"`
	RSSMB          float64 `json:"rss_mb"`
}

// windowMark is the moment the count of settled payments reached a
// multiple of the window (or the run ended).
type windowMark struct {
	settled int64
	at      time.Time
	rssMB   float64
}

// windows records a mark each time the settled payments reach a multiple
// of size: once per window, so it costs nothing per payment but an
// atomic add and a modulo (benchObserver.Settled).
type windows struct {
	size  int64
	mu    sync.Mutex
	marks []windowMark
}

func (w *windows) mark(settled int64, at time.Time) {
	m := windowMark{settled: settled, at: at, rssMB: currentRSSMB()}
	w.mu.Lock()
	w.marks = append(w.marks, m)
	w.mu.Unlock()
}

// rates returns the windows of a run that started at start and settled
// total payments by end: one per full window, and a last shorter one
// when total is not a multiple of the size.
func (w *windows) rates(start, end time.Time, total int64) []Window {
	w.mu.Lock()
	marks := append([]windowMark(nil), w.marks...)
	w.mu.Unlock()
	// Two goroutines can reach their multiples in one order and record
	// them in the other.
	slices.SortFunc(marks, func(a, b windowMark) int { return cmp.Compare(a.settled, b.settled) })
	if n := len(marks); total > 0 && (n == 0 || marks[n-1].settled < total) {
		marks = append(marks, windowMark{settled: total, at: end, rssMB: currentRSSMB()})
	}
	return windowRates(start, marks)
}

// windowRates turns marks (in order of settled) into per-window rates:
// each window's payments over the time since the previous mark.
func windowRates(start time.Time, marks []windowMark) []Window {
	out := make([]Window, 0, len(marks))
	prevN, prevAt := int64(0), start
	for _, m := range marks {
		w := Window{Settled: m.settled, RSSMB: m.rssMB}
		if d := m.at.Sub(prevAt).Seconds(); d > 0 {
			w.PaymentsPerSec = float64(m.settled-prevN) / d
		}
		out = append(out, w)
		prevN, prevAt = m.settled, m.at
	}
	return out
}

// currentRSSMB is the process's resident set now (VmRSS, from
// /proc/self/statm), 0 where /proc does not tell.
func currentRSSMB() float64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0
	}
	return float64(pages*int64(os.Getpagesize())) / (1 << 20)
}
