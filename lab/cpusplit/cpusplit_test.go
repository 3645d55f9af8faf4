package cpusplit

import (
	"bytes"
	"context"
	"os"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/paydedup/paydedup/lab/testenv"
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

// TestProcCPUResolvesAShortQuery: a backend's CPU over a statement of a
// few milliseconds is read as that, not rounded to a clock tick (10 ms):
// the benches' runs of a few hundred payments, on a fast host, would read
// none at all. Read around one statement, it is more than nothing and no
// more than the statement's time on the wall.
func TestProcCPUResolvesAShortQuery(t *testing.T) {
	one, pid := testenv.OneConn(t, testenv.Pool(t))
	ctx := context.Background()
	if _, ok := procCPU(int(pid)); !ok {
		if testenv.InCI() {
			t.Fatalf("backend %d: its CPU time cannot be read, and CI's server is on this machine", pid)
		}
		t.Skipf("backend %d: not on this machine", pid)
	}
	for n := 20_000; ; n *= 2 {
		before, _ := procCPU(int(pid))
		start := time.Now()
		if _, err := one.Exec(ctx, `SELECT count(*) FROM generate_series(1, $1::int)`, n); err != nil {
			t.Fatal(err)
		}
		wall := time.Since(start)
		after, _ := procCPU(int(pid))
		if wall < time.Millisecond && n < 1<<24 {
			continue // too short to tell on this host: a longer one
		}
		if used := after - before; used <= 0 || used > wall {
			t.Fatalf("a statement of %v on the wall read as %v of the backend's CPU", wall, used)
		}
		return
	}
}
