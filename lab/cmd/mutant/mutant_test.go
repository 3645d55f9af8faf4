package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

const sample = `# a comment
mutant two-lines
file   a/b.go
pkg    ./a ./c
run    ^TestX$
guards something
<<<
x := 1
	y := 2
===
x := 2
>>>

mutant empty-replacement
file   a/b.go
pkg    ./a
run    TestY
guards something else
<<<
z
===

>>>
`

func TestParseTable(t *testing.T) {
	ms, err := ParseTable(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 {
		t.Fatalf("%d mutants, want 2", len(ms))
	}
	m := ms[0]
	if m.Name != "two-lines" || m.File != "a/b.go" || strings.Join(m.Packages, ",") != "./a,./c" || m.Run != "^TestX$" ||
		m.Guards != "something" || m.Original != "x := 1\n\ty := 2" || m.Replacement != "x := 2" || m.Line != 2 {
		t.Errorf("first mutant %+v", m)
	}
	if ms[1].Original != "z" || ms[1].Replacement != "" {
		t.Errorf("second mutant %+v", ms[1])
	}
}

func TestParseTableRejects(t *testing.T) {
	for name, table := range map[string]string{
		"field before mutant":  "file a.go\n",
		"unknown field":        "mutant a\nfile a.go\nwhat x\n",
		"missing run":          "mutant a\nfile a.go\npkg ./a\nguards g\n<<<\nx\n===\ny\n>>>\n",
		"missing guards":       "mutant a\nfile a.go\npkg ./a\nrun T\n<<<\nx\n===\ny\n>>>\n",
		"missing original":     "mutant a\nfile a.go\npkg ./a\nrun T\nguards g\n",
		"unterminated":         "mutant a\nfile a.go\npkg ./a\nrun T\nguards g\n<<<\nx\n===\ny\n",
		"no separator":         "mutant a\nfile a.go\npkg ./a\nrun T\nguards g\n<<<\nx\n",
		"same text":            "mutant a\nfile a.go\npkg ./a\nrun T\nguards g\n<<<\nx\n===\nx\n>>>\n",
		"bad subtest regex":    "mutant a\nfile a.go\npkg ./a\nrun T/(\nguards g\n<<<\nx\n===\ny\n>>>\n",
		"bad regex":            "mutant a\nfile a.go\npkg ./a\nrun (\nguards g\n<<<\nx\n===\ny\n>>>\n",
		"package not relative": "mutant a\nfile a.go\npkg github.com/x\nrun T\nguards g\n<<<\nx\n===\ny\n>>>\n",
		"file outside":         "mutant a\nfile ../a.go\npkg ./a\nrun T\nguards g\n<<<\nx\n===\ny\n>>>\n",
		"bad name":             "mutant A B\nfile a.go\npkg ./a\nrun T\nguards g\n<<<\nx\n===\ny\n>>>\n",
		"name twice":           "mutant a\nfile a.go\npkg ./a\nrun T\nguards g\n<<<\nx\n===\ny\n>>>\nmutant a\nfile a.go\npkg ./a\nrun T\nguards g\n<<<\nx\n===\ny\n>>>\n",
	} {
		if _, err := ParseTable(strings.NewReader(table)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestApplyExactlyOnce(t *testing.T) {
	m := Mutant{Name: "m1", File: "dedup/lease.go", Original: "attempts = @attempt", Replacement: "true", Line: 7}
	got, err := m.Apply([]byte("a AND attempts = @attempt AND b"))
	if err != nil || string(got) != "a AND true AND b" {
		t.Fatalf("apply: %q %v", got, err)
	}
	for src, want := range map[string]string{
		"a AND b": "is not in dedup/lease.go",
		"attempts = @attempt OR attempts = @attempt": "occurs 2 times in dedup/lease.go",
	} {
		_, err := m.Apply([]byte(src))
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "mutant m1 (table line 7)") {
			t.Errorf("apply to %q: %v, want an error naming the mutant and saying %q", src, err, want)
		}
	}
}

// TestRunSubtests: a run splits as go test -run splits it, so that a
// mutant can name the subtests that kill it.
func TestRunSubtests(t *testing.T) {
	run := `^TestStoreConformance$/^(Fencing|CompleteBatch)$|^TestB$`
	if got := topLevel(run); got != `^TestStoreConformance$|^TestB$` {
		t.Errorf("topLevel = %q", got)
	}
	for name, want := range map[string]bool{
		"TestStoreConformance/Fencing":       true,
		"TestStoreConformance/CompleteBatch": true,
		"TestStoreConformance/ClaimNewKey":   false,
		"TestStoreConformance":               false,
		"TestB":                              true,
		"TestB/sub":                          false,
		"TestC":                              false,
	} {
		if got := runMatches(run, name); got != want {
			t.Errorf("runMatches(%q) = %v, want %v", name, got, want)
		}
	}
	if got := splitRun(`^T[/|]$/a\/b`); len(got) != 1 || len(got[0]) != 2 || got[0][0] != `^T[/|]$` {
		t.Errorf("splitRun kept neither brackets nor escapes: %q", got)
	}
}

// TestTableMatchesTree keeps the table honest in the ordinary test run:
// every original text occurs exactly once in today's code, and every -run
// regex names a test that exists in its packages.
func TestTableMatchesTree(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("mutants.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ms, err := ParseTable(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) < 15 {
		t.Errorf("only %d mutants in the table", len(ms))
	}
	if err := Check(root, ms); err != nil {
		t.Error(err)
	}
	testFunc := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz)\w+)\((?:t \*testing\.T|f \*testing\.F)\)`)
	for _, m := range ms {
		re := regexp.MustCompile(topLevel(m.Run))
		for _, p := range m.Packages {
			files, _ := filepath.Glob(filepath.Join(root, p, "*_test.go"))
			found := false
			for _, file := range files {
				src, err := os.ReadFile(file)
				if err != nil {
					t.Fatal(err)
				}
				for _, sm := range testFunc.FindAllSubmatch(src, -1) {
					found = found || re.Match(sm[1])
				}
			}
			if !found {
				t.Errorf("mutant %s (table line %d): no test in %s matches -run %s", m.Name, m.Line, p, m.Run)
			}
		}
	}
}

// TestRunMutant runs the runner on a small module of its own: a mutant the
// test notices is killed, an equivalent one survives, one that does not
// build or names no test is broken.
func TestRunMutant(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n\ngo 1.22\n")
	write("m.go", "package m\n\n// Max returns the larger.\nfunc Max(a, b int) int {\n\tif a > b {\n\t\treturn a\n\t}\n\treturn b\n}\n")
	write("m_test.go", "package m\n\nimport \"testing\"\n\nfunc TestMax(t *testing.T) {\n\tt.Run(\"pair\", func(t *testing.T) {\n\t\tif Max(1, 2) != 2 || Max(3, 2) != 3 {\n\t\t\tt.Fatal(\"wrong\")\n\t\t}\n\t})\n}\n")
	scratch := t.TempDir()
	if err := CopyTree(dir, scratch); err != nil {
		t.Fatal(err)
	}
	r := Runner{Dir: scratch, Timeout: time.Minute, Go: "go"}
	base := Mutant{File: "m.go", Packages: []string{"./"}, Run: "^TestMax$", Guards: "g"}
	for _, tc := range []struct {
		name, orig, repl, run string
		want                  Outcome
	}{
		{"killed", "a > b", "a < b", "", Killed},
		{"survives", "a > b", "a >= b", "", Survived},
		{"broken-build", "return b\n}", "return c\n}", "", Broken},
		{"no-test", "a > b", "a < b", "^TestNothing$", Broken},
		{"killed-by-subtest", "a > b", "a < b", "^TestMax$/^pair$", Killed},
		{"no-subtest", "a > b", "a < b", "^TestMax$/^none$", Broken},
	} {
		m := base
		m.Name, m.Original, m.Replacement = tc.name, tc.orig, tc.repl
		if tc.run != "" {
			m.Run = tc.run
		}
		res := r.RunMutant(context.Background(), m)
		if res.Outcome != tc.want {
			t.Errorf("%s: %v (%s), want %v", tc.name, res.Outcome, res.Detail, tc.want)
		}
		if tc.want == Killed && (len(res.Failed) != 1 || res.Failed[0] != "TestMax") {
			t.Errorf("%s: failed tests %v, want [TestMax]", tc.name, res.Failed)
		}
	}
	// The scratch copy is restored after each mutant.
	got, err := os.ReadFile(filepath.Join(scratch, "m.go"))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(filepath.Join(dir, "m.go"))
	if string(got) != string(want) {
		t.Errorf("scratch copy not restored:\n%s", got)
	}
	if _, err := Baseline(context.Background(), []Runner{r}, []Mutant{base}); err != nil {
		t.Errorf("baseline: %v", err)
	}
	sub := base
	sub.Name, sub.Run = "sub", "^TestMax$/^pair$"
	if _, err := Baseline(context.Background(), []Runner{r, r}, []Mutant{base, sub}); err != nil {
		t.Errorf("baseline of a subtest: %v", err)
	}
	missing := base
	missing.Name, missing.Run = "missing", "^TestMax$/^gone$"
	if _, err := Baseline(context.Background(), []Runner{r}, []Mutant{missing}); err == nil || !strings.Contains(err.Error(), "mutant missing") {
		t.Errorf("baseline with a missing test: %v, want an error naming the mutant", err)
	}
}
