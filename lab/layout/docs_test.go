package layout

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// testNamed matches a test the prose names: `TestX` in backticks.
var testNamed = regexp.MustCompile("`(Test[A-Z][A-Za-z0-9_]*)`")

// testDeclared matches a top-level test function.
var testDeclared = regexp.MustCompile(`(?m)^func (Test[A-Z][A-Za-z0-9_]*)\(`)

// TestBoundaryTableNamesRealTests: every test the boundary table
// (docs/boundaries.md), the README and the docs pages name is a test in the
// tree, so no row of the table, and no guarantee, stands on a test that was
// renamed or removed.
func TestBoundaryTableNamesRealTests(t *testing.T) {
	declared := map[string]bool{}
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range testDeclared.FindAllSubmatch(b, -1) {
			declared[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(declared) < 100 {
		t.Fatalf("found %d tests in the tree; the check would prove nothing", len(declared))
	}
	table, err := os.ReadFile("../../docs/boundaries.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(testNamed.FindAll(table, -1)); n < 30 {
		t.Fatalf("docs/boundaries.md names %d tests; want a test for every row", n)
	}
	for _, doc := range []string{
		"docs/boundaries.md", "README.md", "docs/guarantees.md", "docs/http-api.md",
		"docs/operations.md", "docs/schema.md", "docs/configuration.md", "docs/performance.md",
		"docs/message-contract.md", "docs/provider.md", "docs/demo.md", "docs/clients.md",
		"docs/security.md", "docs/runbooks.md", "docs/scaling.md",
	} {
		b, err := os.ReadFile(filepath.Join("../..", doc))
		if err != nil {
			t.Fatal(err)
		}
		missing := map[string]bool{}
		for _, m := range testNamed.FindAllSubmatch(b, -1) {
			if !declared[string(m[1])] {
				missing[string(m[1])] = true
			}
		}
		if len(missing) > 0 {
			var names []string
			for n := range missing {
				names = append(names, n)
			}
			sort.Strings(names)
			t.Errorf("%s names tests that do not exist: %s", doc, strings.Join(names, ", "))
		}
	}
}
