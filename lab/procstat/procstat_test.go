package procstat

import (
	"os"
	"os/exec"
	"path/filepath"
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

// TreeCPU counts a parent's own time, the time of a child still running,
// and the time of a child that has exited and been waited for: the three
// places a PostgreSQL server's CPU goes while a client's pool comes and
// goes. This test process is the parent.
func TestTreeCPUCountsLiveAndExitedChildren(t *testing.T) {
	burn := func() *exec.Cmd {
		// About 300 ms of CPU in a process of its own: this test binary,
		// which spins when PROCSTAT_BURN is set (TestMain).
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "PROCSTAT_BURN=300ms")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	self := os.Getpid()
	before, err := TreeCPU(self)
	if err != nil {
		t.Fatal(err)
	}
	exited := burn()
	if err := exited.Wait(); err != nil {
		t.Fatal(err)
	}
	spentExited := exited.ProcessState.UserTime() + exited.ProcessState.SystemTime()
	live := burn()
	defer func() { _ = live.Wait() }()
	time.Sleep(150 * time.Millisecond)
	liveCPU, ok := PIDCPU(live.Process.Pid)
	if !ok {
		t.Fatal("the running child's /proc entry is not readable")
	}
	after, err := TreeCPU(self)
	if err != nil {
		t.Fatal(err)
	}
	// /proc counts in 10 ms ticks, user and system time each rounded
	// down: 30 ms of slack.
	if got, want := after-before, spentExited+liveCPU; got < want-30*time.Millisecond {
		t.Errorf("tree CPU grew by %v; the exited child spent %v and the running one %v so far", got, spentExited, liveCPU)
	}
	if spentExited <= 0 || liveCPU <= 0 {
		t.Errorf("children spent %v and %v: the burn did not run", spentExited, liveCPU)
	}
	if ppid, comm, err := PPID(live.Process.Pid); err != nil || ppid != self || comm != filepath.Base(os.Args[0])[:min(15, len(filepath.Base(os.Args[0])))] {
		t.Errorf("PPID of the child: %d, %q, %v; want %d and this binary's name", ppid, comm, err, self)
	}
	if _, err := TreeCPU(1 << 30); err == nil {
		t.Error("a process that does not exist: no error")
	}
}

// TestMain runs the tests, or, started by TestTreeCPUCountsLiveAndExitedChildren
// with PROCSTAT_BURN set, spins for that long and exits: the child whose
// CPU the tree must count.
func TestMain(m *testing.M) {
	if d, err := time.ParseDuration(os.Getenv("PROCSTAT_BURN")); err == nil {
		for start := time.Now(); time.Since(start) < d; {
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
