package model

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// check is one bounded run of the model: spin's -D flags, and the assertion
// the run must violate ("" when it must find no error).
type check struct {
	name  string
	flags []string
	want  string
}

// The fixed protocol, exhaustively, in three bounded configurations (one
// configuration with everything at once is too large to check in minutes):
// two workers racing on two copies of the command, one worker dying, one
// worker with a dead letter replayed. Then the bugs the code was fixed of,
// each put back by a switch: the checker must find what each one breaks.
var checks = []check{
	{"two workers, one crash", []string{"-DNW=2", "-DMAXDEL=1", "-DMAXCRASH=1", "-DNOREPLAY"}, ""},
	{"one worker, one crash, two deliveries", []string{"-DNW=1", "-DMAXDEL=2", "-DMAXCRASH=1", "-DNOREPLAY"}, ""},
	{"one worker, dead letter replayed", []string{"-DNW=1", "-DMAXDEL=2", "-DMAXCRASH=0"}, ""},

	// A 409 idempotency_key_in_use read as "not charged": the row is failed
	// while the first request is still executing, and it charges.
	{"409 read as not charged", []string{"-DNW=1", "-DMAXCRASH=0", "-DNOREPLAY", "-DBUG_409"},
		"assertion violated  !(((status==3)&&(charges>0)))"},
	// ... and with the failed row past its key window called blind, the
	// provider (which has forgotten the key) charges a second time.
	{"409 read as not charged, failed row called blind past its window",
		[]string{"-DNW=1", "-DMAXCRASH=0", "-DNOREPLAY", "-DBUG_409", "-DBUG_WINDOW", "-DNO_FAILED_INV"},
		"assertion violated (charges<=1)"},
	// The reconciler not waiting SearchLag: a not-found lookup fails a row
	// whose charge is still executing or not yet searchable.
	{"reconciler ignores the search lag", []string{"-DNW=1", "-DMAXCRASH=0", "-DNOREPLAY", "-DBUG_NOLAG"},
		"assertion violated  !(((status==3)&&(charges>0)))"},
}

func tools(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"spin", "gcc"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not installed: .ci/run installs it (apt-get install -y spin gcc)", tool)
			}
			t.Skipf("%s is not installed (Debian: apt-get install -y spin gcc); the protocol model is not checked", tool)
		}
	}
}

var (
	statesRe  = regexp.MustCompile(`(\d+) states, stored`)
	elapsedRe = regexp.MustCompile(`elapsed time ([0-9.e+]+) seconds`)
	errorsRe  = regexp.MustCompile(`errors: (\d+)`)
)

// TestProtocolModel checks paydedup.pml with spin: for each configuration it
// generates the verifier (spin -a), compiles it (gcc), and runs it to the
// end of the state space or its first error.
func TestProtocolModel(t *testing.T) {
	tools(t)
	src, err := os.ReadFile("paydedup.pml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "paydedup.pml"), src, 0o644); err != nil {
				t.Fatal(err)
			}
			run := func(name string, args ...string) string {
				cmd := exec.Command(name, args...)
				cmd.Dir = dir
				out, err := cmd.CombinedOutput()
				if err != nil && name != "./pan" {
					t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
				}
				return string(out)
			}
			run("spin", append(c.flags, "-a", "paydedup.pml")...)
			// COLLAPSE compresses the stored states; MEMLIM stops a run
			// that would outgrow the machine (reported below as incomplete).
			run("gcc", "-O2", "-w", "-DSAFETY", "-DCOLLAPSE", "-DMEMLIM=2048", "-o", "pan", "pan.c")
			out := run("./pan", "-m1000000")

			states, elapsed := "?", "?"
			if m := statesRe.FindStringSubmatch(out); m != nil {
				states = m[1]
			}
			if m := elapsedRe.FindStringSubmatch(out); m != nil {
				elapsed = m[1]
			}
			t.Logf("%s: %s states, %s s", strings.Join(c.flags, " "), states, elapsed)
			m := errorsRe.FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("pan printed no error count:\n%s", out)
			}
			switch {
			case c.want == "" && m[1] != "0":
				trail := run("spin", append(c.flags, "-t", "paydedup.pml")...)
				t.Fatalf("the model has an error:\n%s\ncounterexample:\n%s", out, trail)
			case c.want == "" && (strings.Contains(out, "Search not completed") || strings.Contains(out, "MEMLIM")):
				t.Fatalf("the search did not cover the state space:\n%s", out)
			case c.want != "" && !strings.Contains(out, c.want):
				t.Fatalf("want the checker to find %q; it reported:\n%s", c.want, out)
			}
		})
	}
}
