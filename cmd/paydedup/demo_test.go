//go:build !nolab

package main

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/lab/localpg"
	"github.com/paydedup/paydedup/lab/testenv"
)

// TestDemoSmall runs the real demo, reduced, on the test's own schema and
// streams: its report must say no double charge and no lost payment.
func TestDemoSmall(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, testenv.PostgresURL(t), false)
	out, errOut, err := w.run("", "demo", "--payments", "300", "--workers", "2", "--seed", "42")
	if err != nil {
		t.Fatalf("demo failed: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	last := lines[len(lines)-1]
	m := regexp.MustCompile(`^demo: 300 payments, (\d+) duplicates, (\d+) charged once, (\d+) declined, (\d+) canceled, 0 double charges, 0 lost, 0 double refunds, (\d+) dead letters, \d+\.\d s$`).FindStringSubmatch(last)
	if m == nil {
		t.Fatalf("last line %q\nstdout:\n%s", last, out)
	}
	dups, _ := strconv.Atoi(m[1])
	charged, _ := strconv.Atoi(m[2])
	declined, _ := strconv.Atoi(m[3])
	canceled, _ := strconv.Atoi(m[4])
	dead, _ := strconv.Atoi(m[5])
	// One authorization of the lifecycle's flows is canceled: never charged.
	if dups != 120 || charged+declined+canceled != 300 || declined != 15 || canceled != 1 || dead < 2 {
		t.Fatalf("figures: %d duplicates, %d charged, %d declined, %d canceled, %d dead letters\n%s", dups, charged, declined, canceled, dead, out)
	}
	// The final verdict beside the demo's own check: the audit of the
	// provider's records against the ledger.
	if !strings.Contains(out, "(paydedup audit): 300 intents, 300 ledger rows: no drift") {
		t.Errorf("no clean audit in the report:\n%s", out)
	}
	if !strings.Contains(errOut, "killed demo-") || !strings.Contains(out, "one worker was killed") {
		t.Errorf("no worker was killed:\n%s\n%s", errOut, out)
	}
	if !strings.Contains(errOut, "completed") {
		t.Errorf("no progress shown:\n%s", errOut)
	}
}

func TestDemoBadFlags(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, "", false)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"demo", "--workers", "1"}, "--workers must be at least 2"},
		{[]string{"demo", "--payments", "0"}, "--payments must be at least 1"},
		{[]string{"demo", "--declines", "2"}, "--declines must be a fraction"},
	} {
		if _, _, err := w.run("", c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}

// TestDemoWithoutLocalPostgres is the first run on a machine where no
// PostgreSQL server runs: no DATABASE_URL, the local server's port closed.
// The demo starts a private cluster from the machine's binaries, passes on
// it, and removes it.
func TestDemoWithoutLocalPostgres(t *testing.T) {
	t.Parallel()
	if _, err := localpg.FindBin(); err != nil && !testenv.InCI() {
		t.Skip(err)
	}
	w := newCLIWorld(t, "", false)
	delete(w.env, "DATABASE_URL")
	w.env[localPostgresEnv] = "postgres://postgres@" + freeAddr(t) + "/postgres?sslmode=disable&connect_timeout=2"
	out, errOut, err := w.run("", "demo", "--payments", "200", "--workers", "2", "--seed", "7")
	if err != nil {
		t.Fatalf("demo failed: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	m := regexp.MustCompile(`PostgreSQL is a private PostgreSQL cluster in (\S+)`).FindStringSubmatch(errOut)
	if m == nil {
		t.Fatalf("the demo does not say it started a private cluster:\n%s", errOut)
	}
	if !regexp.MustCompile(`(?m)^demo: 200 payments, .* 0 double charges, 0 lost, `).MatchString(out) {
		t.Fatalf("no passing report:\n%s", out)
	}
	if _, err := os.Stat(m[1]); !os.IsNotExist(err) {
		t.Errorf("the private cluster's directory %s is still there (%v)", m[1], err)
	}
}
