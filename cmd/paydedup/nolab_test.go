package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/lab/testenv"
)

// TestNolabBuildLeavesTheLabOut builds the production binary as the
// Dockerfile does (-tags nolab): it links neither the embedded nats-server,
// nor the lab's packages, nor the simulator, and offers no lab command.
func TestNolabBuildLeavesTheLabOut(t *testing.T) {
	if testing.Short() && !testenv.InCI() {
		t.Skip("builds the binary")
	}
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-tags", "nolab", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const mod = "github.com/paydedup/paydedup"
	for _, pkg := range strings.Fields(string(out)) {
		for _, bad := range []string{"github.com/nats-io/nats-server", mod + "/lab", mod + "/lab/workload", mod + "/lab/stripesim"} {
			if pkg == bad || strings.HasPrefix(pkg, bad+"/") {
				t.Errorf("the nolab build links %s", pkg)
			}
		}
	}

	bin := filepath.Join(t.TempDir(), "paydedup")
	if out, err := exec.Command("go", "build", "-tags", "nolab", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -tags nolab: %v\n%s", err, out)
	}
	help, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("paydedup --help: %v\n%s", err, help)
	}
	cmds := map[string]bool{}
	_, list, _ := strings.Cut(string(help), "Available Commands:")
	list, _, _ = strings.Cut(list, "\n\n")
	for _, line := range strings.Split(list, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			cmds[f[0]] = true
		}
	}
	if !cmds["worker"] || !cmds["gateway"] {
		t.Fatalf("--help lists %v, want worker and gateway among them:\n%s", cmds, help)
	}
	for _, lab := range []string{"demo", "bench", "provider-sim"} {
		if cmds[lab] {
			t.Errorf("the nolab build offers %s", lab)
		}
	}
}
