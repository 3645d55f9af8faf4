package bench

import (
	"bytes"
	"context"
	"os"
	"runtime/pprof"
	"testing"
	"time"
)

// TestLabelSharesSplitsTheProfile profiles a spin under the simulator's
// label and one without: the label's share is about half, not all or none.
func TestLabelSharesSplitsTheProfile(t *testing.T) {
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		t.Fatal(err)
	}
	spin := func(context.Context) {
		for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		}
	}
	labelled(context.Background(), labelSim, spin)
	spin(context.Background())
	pprof.StopCPUProfile()
	shares, err := labelShares(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if s := shares[labelSim]; s < 0.25 || s > 0.75 {
		t.Errorf("simulator's share %.2f of a half-labelled profile", s)
	}
	if s := shares[labelNATS]; s != 0 {
		t.Errorf("NATS server's share %.2f, want 0", s)
	}
}

// TestProcCPUReadsOnlyPostgres: a pid that is not a postgres process is
// not counted as a backend.
func TestProcCPUReadsOnlyPostgres(t *testing.T) {
	if _, ok := procCPU(os.Getpid()); ok {
		t.Error("the test process was read as a postgres backend")
	}
	if _, ok := procCPU(-1); ok {
		t.Error("pid -1 was read")
	}
}
