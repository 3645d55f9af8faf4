package procstat

import (
	"testing"
	"time"
)

func TestReadsTheProcess(t *testing.T) {
	if rss := PeakRSSMB(); rss <= 0 || rss > 1<<20 {
		t.Errorf("peak RSS %v MiB, want a positive figure", rss)
	}
	before := CPU()
	for start := time.Now(); time.Since(start) < 50*time.Millisecond; {
	}
	if spent := CPU() - before; spent <= 0 {
		t.Errorf("50 ms of busy loop counted %v of CPU time", spent)
	}
	a, b := RunSuffix(), RunSuffix()
	if len(a) != 8 || a == b {
		t.Errorf("run suffixes %q and %q, want two distinct 8-digit ones", a, b)
	}
}
