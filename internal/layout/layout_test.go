// Package layout holds the import rules of the module's packages: the core
// (payment, dedup, provider, stream, consumer, reconciler) imports nothing of
// the gateway, the console, the lab or cmd, and each outside dependency stays in the
// package that owns it. (That the production build, -tags nolab, links no
// lab is cmd/paydedup's TestNolabBuildLeavesTheLabOut.) The rules read the module's real import graph with
// `go list`, so a new import that breaks one fails here, naming it.
package layout

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/paydedup/paydedup"

type pkg struct {
	ImportPath string
	Imports    []string // direct, non-test
	Deps       []string // transitive, non-test
	Name       string
}

// list returns the module's packages as `go list -deps` sees them (non-test
// imports only: tests may use the lab, e.g. the simulator and testenv).
func list(t *testing.T) map[string]pkg {
	t.Helper()
	args := []string{"list", "-json=ImportPath,Imports,Deps,Name"}
	args = append(args, module+"/...")
	cmd := exec.Command("go", args...)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string]pkg{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list: %v", err)
		}
		pkgs[strings.TrimPrefix(p.ImportPath, module+"/")] = p
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages; the rules would check nothing", len(pkgs))
	}
	return pkgs
}

// under reports whether path (module-relative or external) is dir or inside it.
func under(path, dir string) bool {
	path = strings.TrimPrefix(path, module+"/")
	return path == dir || strings.HasPrefix(path, dir+"/")
}

func anyUnder(path string, dirs []string) string {
	for _, d := range dirs {
		if under(path, d) {
			return d
		}
	}
	return ""
}

// core is the money path; lab is what only demonstrates or tests it.
var (
	core = []string{"payment", "dedup", "provider", "stream", "consumer", "reconciler"}
	lab  = []string{"internal/lab", "internal/workload", "internal/chaos", "internal/testenv",
		"internal/mutant", "internal/providertest", "provider/stripesim", "github.com/nats-io/nats-server"}
)

func TestCoreImportsNoGatewayLabOrCmd(t *testing.T) {
	pkgs := list(t)
	checked := 0
	for path, p := range pkgs {
		if anyUnder(path, core) == "" || anyUnder(path, lab) != "" {
			continue
		}
		checked++
		for _, d := range p.Deps {
			bad := anyUnder(d, append([]string{"gateway", "httpidem", "console", "cmd"}, lab...))
			if bad != "" {
				t.Errorf("%s depends on %s (the core must not depend on %s)", path, d, bad)
			}
		}
	}
	if checked < len(core) {
		t.Fatalf("checked %d core packages, want at least %d", checked, len(core))
	}
}

func TestNothingImportsCmd(t *testing.T) {
	for path, p := range list(t) {
		for _, d := range p.Imports {
			if under(d, "cmd") {
				t.Errorf("%s imports %s", path, d)
			}
		}
	}
}

// Each outside dependency lives in the packages that own it (STYLE.md).
func TestOutsideDependenciesStayHome(t *testing.T) {
	rules := []struct {
		dep     string
		allowed []string
	}{
		{"github.com/stripe/stripe-go", []string{"provider/stripe"}},
		{"github.com/jackc/pgx", []string{"internal/pg", "dedup", "gateway/pgstore", "httpidem/pgstore",
			"internal/lab/localpg", "internal/testenv"}},
		{"github.com/nats-io/nats.go", []string{"stream", "consumer", "dlq", "console", "cmd/paydedup",
			"internal/lab", "internal/chaos", "internal/workload", "internal/testenv"}},
		{"github.com/nats-io/nats-server", []string{"internal/lab/inproc", "internal/testenv"}},
		{"github.com/exaring/otelpgx", []string{"internal/pg"}},
		{"github.com/Shopify/toxiproxy", []string{"internal/chaos", "internal/testenv"}},
	}
	pkgs := list(t)
	for _, r := range rules {
		users := 0
		for path, p := range pkgs {
			for _, d := range p.Imports {
				if !strings.HasPrefix(d, r.dep) {
					continue
				}
				users++
				if anyUnder(path, r.allowed) == "" {
					t.Errorf("%s imports %s; only %v may", path, d, r.allowed)
				}
			}
		}
		if users == 0 {
			t.Errorf("nothing imports %s: the rule checks nothing (update it)", r.dep)
		}
	}
}
