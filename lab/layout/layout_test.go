// Package layout holds the import rules of the module's packages: what
// ships is everything outside lab/ (TestWhatShipsIsOutsideLab); the core
// (payment, ledger, dedup, provider, stream, consumer, reconciler) imports nothing
// of the gateway, the console, the lab or cmd; and each outside dependency
// stays in the package that owns it; and only the PostgreSQL
// implementations link pgx (TestDriverStaysInItsStores). The rules read the module's real
// import graph with `go list`, so a new import that breaks one fails here,
// naming it. Inside gateway and consumer, the files form layers: each uses
// names only from the files below it (TestGatewayFilesFormLayers,
// TestConsumerFilesFormLayers, which type-check the package's files).
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
	core = []string{"payment", "ledger", "dedup", "provider", "stream", "consumer", "reconciler"}
	lab  = []string{"lab", "github.com/nats-io/nats-server"}
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

// TestWhatShipsIsOutsideLab is the house's one rule: what ships is
// everything outside lab/. The production build (-tags nolab) of every
// package outside lab/ links nothing of lab/ (only cmd/paydedup's lab
// commands, built without nolab, and tests import it), and internal/ holds
// only what the production binary links.
func TestWhatShipsIsOutsideLab(t *testing.T) {
	cmd := exec.Command("go", "list", "-tags", "nolab", "-json=ImportPath,Deps", module+"/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -tags nolab: %v", err)
	}
	linked := map[string]bool{}
	outside := 0
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list: %v", err)
		}
		path := strings.TrimPrefix(p.ImportPath, module+"/")
		if under(path, "lab") {
			continue
		}
		outside++
		for _, d := range p.Deps {
			if under(d, "lab") && strings.HasPrefix(d, module+"/") {
				t.Errorf("%s links %s in the production build: what ships must not need the lab", path, d)
			}
			if path == "cmd/paydedup" {
				linked[strings.TrimPrefix(d, module+"/")] = true
			}
		}
	}
	if outside < 10 || len(linked) < 10 {
		t.Fatalf("checked %d packages outside lab/, %d linked by the binary: the rule checks nothing", outside, len(linked))
	}
	for path := range list(t) {
		if under(path, "internal") && !linked[path] {
			t.Errorf("%s is under internal/ but the production binary does not link it: it belongs in lab/", path)
		}
	}
}

// TestInternalIsTheBasement: what internal/ holds (the clock, the pg
// helpers, redaction) stands under every other package, so it imports
// nothing of the module outside internal/: no import runs back up a floor.
func TestInternalIsTheBasement(t *testing.T) {
	checked := 0
	for path, p := range list(t) {
		if !under(path, "internal") {
			continue
		}
		checked++
		for _, d := range p.Imports {
			if strings.HasPrefix(d, module+"/") && !under(d, "internal") {
				t.Errorf("%s imports %s: internal/ is the floor under the module's packages", path, d)
			}
		}
	}
	if checked < 3 {
		t.Fatalf("checked %d packages under internal/; the rule checks nothing", checked)
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

// Each outside dependency lives in the packages that own it, so a driver or
// an SDK is wrapped once and its types do not spread.
func TestOutsideDependenciesStayHome(t *testing.T) {
	rules := []struct {
		dep     string
		allowed []string
	}{
		{"github.com/stripe/stripe-go", []string{"provider/stripe"}},
		{"github.com/pressly/goose", []string{"migrations/migrate"}},
		// intake is the publishers' PostgreSQL API: its functions take the
		// caller's pgx.Tx, so it links pgx like the stores.
		{"github.com/jackc/pgx", []string{"internal/pg", "dedup", "migrations/migrate", "gateway/pgstore", "httpidem/pgstore", "budget/pgstore",
			"intake", "lab/localpg", "lab/testenv"}},
		{"github.com/nats-io/nats.go", []string{"stream", "consumer", "dlq", "console", "client", "cmd/paydedup",
			"lab", "lab/cmd/chaos", "lab/workload", "lab/testenv"}},
		{"github.com/nats-io/nats-server", []string{"lab/inproc", "lab/testenv"}},
		{"github.com/exaring/otelpgx", []string{"internal/pg"}},
		{"github.com/Shopify/toxiproxy", []string{"lab/cmd/chaos", "lab/testenv"}},
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

// pgxHome are the packages that may link pgx: the PostgreSQL
// implementations of the stores, the helpers they share, the migrator; the
// publishers' intake, whose API takes the caller's pgx.Tx; cmd,
// which wires them; and the lab, whose tools and test environment open
// databases.
var pgxHome = []string{"internal/pg", "dedup", "gateway/pgstore", "httpidem/pgstore", "budget/pgstore", "intake", "migrations/migrate", "cmd", "lab"}

// driverFree must be listed and free of pgx whatever else changes: the
// packages above the stores, which declare the store interfaces they use in
// the core's words (ledger), the core itself, and the Go client that
// users import.
var driverFree = []string{"gateway", "consumer", "reconciler", "audit", "console", "dlq", "ledger", "client"}

// TestDriverStaysInItsStores: no package of the module outside pgxHome
// links github.com/jackc/pgx, directly or through any import (`go list
// -deps`). A failure names the package and the chain of imports that
// brings pgx in.
func TestDriverStaysInItsStores(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Imports", module+"/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list -deps: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list -deps: %v", err)
	}
	imports := map[string][]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list: %v", err)
		}
		imports[p.ImportPath] = p.Imports
	}
	isPgx := func(path string) bool { return strings.HasPrefix(path, "github.com/jackc/pgx") }
	// chain returns the imports from start to the first pgx package it
	// reaches (breadth first: the shortest), or nil.
	chain := func(start string) []string {
		parent := map[string]string{start: ""}
		queue := []string{start}
		for len(queue) > 0 {
			p := queue[0]
			queue = queue[1:]
			if isPgx(p) {
				var path []string
				for ; p != ""; p = parent[p] {
					path = append([]string{strings.TrimPrefix(p, module+"/")}, path...)
				}
				return path
			}
			for _, d := range imports[p] {
				if _, seen := parent[d]; !seen {
					parent[d] = p
					queue = append(queue, d)
				}
			}
		}
		return nil
	}
	checked := map[string]bool{}
	for path := range imports {
		if !strings.HasPrefix(path, module+"/") {
			continue
		}
		rel := strings.TrimPrefix(path, module+"/")
		if anyUnder(rel, pgxHome) != "" {
			continue
		}
		checked[rel] = true
		if c := chain(path); c != nil {
			t.Errorf("%s links pgx: %s (only %v may)", rel, strings.Join(c, " -> "), pgxHome)
		}
	}
	for _, p := range driverFree {
		if !checked[p] {
			t.Errorf("%s is not in go list's graph: the rule does not check it (update driverFree)", p)
		}
	}
}
