package cpusplit

import (
	"bytes"
	"context"
	"os"
	"runtime/pprof"
	"testing"
	"time"
)

// TestSharesSplitsTheProfile profiles a spin under one part's label and
// one without: the label's share is about half, not all or none.
func TestSharesSplitsTheProfile(t *testing.T) {
	s := New(Part{Name: "sim"}, Part{Name: "nats", Packages: []string{"github.com/nats-io/nats-server/"}})
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		t.Fatal(err)
	}
	spin := func(context.Context) {
		for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		}
	}
	s.Do(context.Background(), "sim", spin)
	spin(context.Background())
	pprof.StopCPUProfile()
	shares, err := s.Shares(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if sh := shares["sim"]; sh < 0.25 || sh > 0.75 {
		t.Errorf("the labelled part's share %.2f of a half-labelled profile", sh)
	}
	if sh := shares["nats"]; sh != 0 {
		t.Errorf("the idle part's share %.2f, want 0", sh)
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
