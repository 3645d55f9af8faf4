package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Mutant is one small source edit that some test must notice.
type Mutant struct {
	Name        string
	File        string   // relative to the module root
	Packages    []string // go test package patterns, e.g. ./dedup
	Run         string   // the -run regex of the tests that must kill it
	Guards      string   // the guarantee it breaks, in a sentence
	Original    string   // must occur exactly once in File
	Replacement string
	Line        int // of the mutant in the table, for messages
}

// ParseTable reads the table format described in mutants.txt.
func ParseTable(r io.Reader) ([]Mutant, error) {
	var (
		out  []Mutant
		cur  *Mutant
		sc   = bufio.NewScanner(r)
		line int
		errs []error
	)
	// block collects lines up to the terminator; it reports whether it
	// found it.
	block := func(stop ...string) (string, string, bool) {
		var b []string
		for sc.Scan() {
			line++
			l := sc.Text()
			for _, s := range stop {
				if l == s {
					return strings.Join(b, "\n"), s, true
				}
			}
			b = append(b, l)
		}
		return strings.Join(b, "\n"), "", false
	}
	finish := func() {
		if cur == nil {
			return
		}
		m := *cur
		cur = nil
		if err := m.validate(); err != nil {
			errs = append(errs, fmt.Errorf("line %d: mutant %s: %w", m.Line, m.Name, err))
			return
		}
		out = append(out, m)
	}
	for sc.Scan() {
		line++
		l := sc.Text()
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			continue
		}
		field, value, _ := strings.Cut(l, " ")
		value = strings.TrimSpace(value)
		switch field {
		case "mutant":
			finish()
			cur = &Mutant{Name: value, Line: line}
		case "file", "pkg", "run", "guards", "<<<":
			if cur == nil {
				errs = append(errs, fmt.Errorf("line %d: %q before any \"mutant NAME\" line", line, field))
				continue
			}
			switch field {
			case "file":
				cur.File = value
			case "pkg":
				cur.Packages = strings.Fields(value)
			case "run":
				cur.Run = value
			case "guards":
				cur.Guards = value
			case "<<<":
				orig, _, ok := block("===")
				if !ok {
					errs = append(errs, fmt.Errorf("line %d: mutant %s: \"<<<\" without \"===\"", line, cur.Name))
					return nil, errors.Join(errs...)
				}
				repl, _, ok := block(">>>")
				if !ok {
					errs = append(errs, fmt.Errorf("line %d: mutant %s: \"===\" without \">>>\"", line, cur.Name))
					return nil, errors.Join(errs...)
				}
				cur.Original, cur.Replacement = orig, repl
			}
		default:
			errs = append(errs, fmt.Errorf("line %d: unknown field %q", line, field))
		}
	}
	finish()
	if err := sc.Err(); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, m := range out {
		if seen[m.Name] {
			errs = append(errs, fmt.Errorf("line %d: mutant name %s used twice", m.Line, m.Name))
		}
		seen[m.Name] = true
	}
	return out, errors.Join(errs...)
}

var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

func (m Mutant) validate() error {
	switch {
	case !namePattern.MatchString(m.Name):
		return errors.New("the name must be lower-case letters, digits and dashes")
	case m.File == "" || filepath.IsAbs(m.File) || strings.Contains(m.File, ".."):
		return errors.New("needs a file relative to the module root")
	case len(m.Packages) == 0:
		return errors.New("needs pkg: the packages whose tests kill it")
	case m.Run == "":
		return errors.New("needs run: the -run regex of the tests that kill it")
	case m.Guards == "":
		return errors.New("needs guards: the guarantee it breaks")
	case m.Original == "":
		return errors.New("needs an original text between <<< and ===")
	case m.Original == m.Replacement:
		return errors.New("the replacement equals the original")
	}
	for _, p := range m.Packages {
		if !strings.HasPrefix(p, "./") {
			return fmt.Errorf("package %q must be a ./ path", p)
		}
	}
	for _, alt := range splitRun(m.Run) {
		for _, el := range alt {
			if _, err := regexp.Compile(el); err != nil {
				return fmt.Errorf("run: %w", err)
			}
		}
	}
	return nil
}

// splitRun splits a -run regex as go test does: into alternatives at the
// '|' outside brackets and parentheses, each a list of elements, one per
// level of test name (split at the '/' outside them): "^TestA$/^sub$|^TestB$"
// is [[^TestA$ ^sub$] [^TestB$]].
func splitRun(run string) [][]string {
	var (
		alts     [][]string
		elems    []string
		brackets int
		parens   int
	)
	for i := 0; i < len(run); i++ {
		switch run[i] {
		case '[':
			brackets++
		case ']':
			brackets = max(brackets-1, 0)
		case '(':
			if brackets == 0 {
				parens++
			}
		case ')':
			if brackets == 0 {
				parens--
			}
		case '\\':
			i++
		case '/', '|':
			if brackets == 0 && parens == 0 {
				elems = append(elems, run[:i])
				if run[i] == '|' {
					alts = append(alts, elems)
					elems = nil
				}
				run = run[i+1:]
				i = -1
			}
		}
	}
	return append(alts, append(elems, run))
}

// topLevel is the part of a -run regex that selects top-level tests: each
// alternative's first element.
func topLevel(run string) string {
	var firsts []string
	for _, alt := range splitRun(run) {
		firsts = append(firsts, alt[0])
	}
	return strings.Join(firsts, "|")
}

// runMatches reports whether go test -run run selects the test (or
// subtest) named name itself, to its full depth.
func runMatches(run, name string) bool {
	parts := strings.Split(name, "/")
	for _, alt := range splitRun(run) {
		if len(alt) != len(parts) {
			continue
		}
		ok := true
		for i, el := range alt {
			ok = ok && regexp.MustCompile(el).MatchString(parts[i])
		}
		if ok {
			return true
		}
	}
	return false
}

// Apply returns src with the mutant's edit, or an error naming the mutant
// and the file when the original does not occur exactly once.
func (m Mutant) Apply(src []byte) ([]byte, error) {
	switch n := bytes.Count(src, []byte(m.Original)); n {
	case 1:
		return bytes.Replace(src, []byte(m.Original), []byte(m.Replacement), 1), nil
	case 0:
		return nil, fmt.Errorf("mutant %s (table line %d): its original text is not in %s: the code changed; update the mutant's <<< text in the table to the current code, keeping the edit it makes", m.Name, m.Line, m.File)
	default:
		return nil, fmt.Errorf("mutant %s (table line %d): its original text occurs %d times in %s; lengthen it until it is unique", m.Name, m.Line, n, m.File)
	}
}

// Check verifies every mutant against the tree at root: the file exists and
// the original occurs exactly once.
func Check(root string, ms []Mutant) error {
	var errs []error
	for _, m := range ms {
		src, err := os.ReadFile(filepath.Join(root, m.File))
		if err != nil {
			errs = append(errs, fmt.Errorf("mutant %s (table line %d): %w", m.Name, m.Line, err))
			continue
		}
		if _, err := m.Apply(src); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// CopyTree copies the module at src to dst, leaving out version control
// and build output.
func CopyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if rel == ".git" || rel == "bin" {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), data, info.Mode().Perm())
	})
}

// Outcome is what running a mutant's tests found.
type Outcome int

// Outcomes.
const (
	Killed   Outcome = iota + 1 // a test failed
	Survived                    // every test passed
	Broken                      // the mutant does not build, or no test ran: a table error
)

func (o Outcome) String() string {
	switch o {
	case Killed:
		return "killed"
	case Survived:
		return "SURVIVED"
	case Broken:
		return "BROKEN"
	}
	return "unknown"
}

// Runner runs mutants' tests in a scratch copy of the tree.
type Runner struct {
	Dir     string        // the scratch copy
	Timeout time.Duration // per mutant
	Go      string        // the go command
}

// goTest runs go test -json in the scratch copy and returns the test
// events and the output. It runs without go vet: make lint vets the tree,
// and a mutant is judged by its tests alone (vet is a sixth of a
// package's build). It builds with -trimpath, so that what is compiled
// does not depend on the scratch copy's path: every runner, and every
// later run, reuses the build cache for each package the mutant leaves
// as it is (see Prewarm). It links without DWARF (-ldflags=-w): nothing
// debugs a mutant's test binary (a panic's trace comes from the pclntab,
// not DWARF), and a test binary that carries NATS, PostgreSQL's driver and
// the lab links in half the time (consumer.test: 9.5 s -> 4.9 s on 2
// loaded cores), once per mutant. extra are more go test flags.
func (r Runner) goTest(ctx context.Context, pkgs []string, run string, extra ...string) (events []testEvent, out []byte, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.Timeout+30*time.Second)
	defer cancel()
	args := append([]string{"test", "-count=1", "-json", "-vet=off", "-trimpath", "-ldflags=-w", "-timeout", r.Timeout.String(), "-run", run}, extra...)
	args = append(args, pkgs...)
	cmd := exec.CommandContext(ctx, r.Go, args...)
	cmd.Dir = r.Dir
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err = cmd.Run()
	out = buf.Bytes()
	for _, l := range bytes.Split(out, []byte("\n")) {
		var e testEvent
		if len(l) > 0 && l[0] == '{' && json.Unmarshal(l, &e) == nil {
			events = append(events, e)
		}
	}
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %v: %w", r.Timeout+30*time.Second, ctx.Err())
	}
	return events, out, err
}

type testEvent struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64 // seconds, on a pass or fail
}

// failLine is a test's failure message: "file_test.go:123: ...".
var failLine = regexp.MustCompile(`^\s+\w+_test\.go:\d+: `)

// Result is one mutant's run.
type Result struct {
	Mutant  Mutant
	Outcome Outcome
	Failed  []string // tests that failed
	Detail  string   // why, for a broken mutant
	Why     string   // the first failure line of a killing test
	Elapsed time.Duration
	Tests   time.Duration // of Elapsed, the test binaries' own run; the rest is the build
}

// RunMutant applies m in the scratch copy, runs its tests, and restores the
// file.
func (r Runner) RunMutant(ctx context.Context, m Mutant) Result {
	start := time.Now()
	res := Result{Mutant: m}
	path := filepath.Join(r.Dir, m.File)
	orig, err := os.ReadFile(path)
	if err != nil {
		res.Outcome, res.Detail = Broken, err.Error()
		return res
	}
	mutated, err := m.Apply(orig)
	if err != nil {
		res.Outcome, res.Detail = Broken, err.Error()
		return res
	}
	if err := os.WriteFile(path, mutated, 0o644); err != nil {
		res.Outcome, res.Detail = Broken, err.Error()
		return res
	}
	defer func() {
		if err := os.WriteFile(path, orig, 0o644); err != nil {
			panic(fmt.Sprintf("restore %s in the scratch copy: %v", m.File, err))
		}
	}()
	// One failing test kills the mutant: -failfast starts no test after
	// it.
	events, out, err := r.goTest(ctx, m.Packages, m.Run, "-failfast")
	res.Elapsed = time.Since(start)
	ran := map[string]bool{}
	for _, e := range events {
		switch {
		case e.Action == "run" && e.Test != "" && runMatches(m.Run, e.Test):
			ran[e.Package] = true
		case e.Action == "fail" && e.Test != "" && !strings.Contains(e.Test, "/"):
			res.Failed = append(res.Failed, e.Test)
		case (e.Action == "pass" || e.Action == "fail") && e.Test == "":
			res.Tests += time.Duration(e.Elapsed * float64(time.Second))
		case e.Action == "output" && res.Why == "" && failLine.MatchString(e.Output):
			res.Why = strings.TrimSpace(e.Output)
			if len(res.Why) > 240 {
				res.Why = res.Why[:240] + "…"
			}
		}
	}
	switch {
	case err == nil:
		res.Outcome = Survived
		if len(ran) == 0 {
			res.Outcome, res.Detail = Broken, "no test matched -run "+m.Run
		}
	case len(res.Failed) > 0:
		res.Outcome = Killed
	case bytes.Contains(out, []byte("[build failed]")) || bytes.Contains(out, []byte("[setup failed]")) ||
		bytes.Contains(out, []byte(`"Action":"build-fail"`)):
		res.Outcome, res.Detail = Broken, "the mutant does not build:\n"+buildOutput(events, out)
	default:
		// A panic or a timeout outside any one test, or the test binary
		// exiting: the mutant was noticed.
		res.Outcome, res.Detail = Killed, fmt.Sprintf("go test: %v", err)
	}
	return res
}

func buildOutput(events []testEvent, out []byte) string {
	var b strings.Builder
	for _, e := range events {
		if e.Action == "build-output" || (e.Test == "" && e.Action == "output") {
			b.WriteString(e.Output)
		}
	}
	if b.Len() == 0 {
		return string(out)
	}
	return b.String()
}

// Prewarm compiles, in one go command, every package the tests of pkgs
// import, as goTest builds them (-trimpath), into the build cache: the
// runners then only compile what a mutant changes, never the same
// package twice at once, and no cold build eats into a test's timeout.
// With a warm cache (an earlier run on this machine) it takes seconds.
func (r Runner) Prewarm(ctx context.Context, pkgs []string) error {
	args := append([]string{"list", "-trimpath", "-deps", "-test", "-f", "{{if not .ForTest}}{{.ImportPath}}{{end}}"}, pkgs...)
	cmd := exec.CommandContext(ctx, r.Go, args...)
	cmd.Dir = r.Dir
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("go list the tests' imports: %w", err)
	}
	var deps []string
	for _, p := range strings.Fields(string(out)) {
		if !strings.HasSuffix(p, ".test") {
			deps = append(deps, p)
		}
	}
	cmd = exec.CommandContext(ctx, r.Go, append([]string{"build", "-trimpath"}, deps...)...)
	cmd.Dir = r.Dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build the tests' imports: %w\n%s", err, out)
	}
	return nil
}

// Baseline runs every mutant's tests on the unmutated copies, one go test
// per package, the packages shared out among the runners (each in its own
// copy, the packages with most mutants first): they must pass, and each
// mutant's -run must select a test (or subtest) in each of its packages, or
// a kill would prove nothing. A run naming subtests runs their whole
// top-level test here.
//
// It returns each top-level test's time in the baseline, slowest first,
// with the mutants that run it: where a narrower run, or a test that
// waits less, saves most.
func Baseline(ctx context.Context, runners []Runner, ms []Mutant) ([]TestTime, error) {
	byPkg := map[string][]Mutant{}
	var pkgs []string
	for _, m := range ms {
		for _, p := range m.Packages {
			if byPkg[p] == nil {
				pkgs = append(pkgs, p)
			}
			byPkg[p] = append(byPkg[p], m)
		}
	}
	sort.SliceStable(pkgs, func(i, j int) bool { return len(byPkg[pkgs[i]]) > len(byPkg[pkgs[j]]) })
	errs := make([]error, len(pkgs))
	times := make([][]TestTime, len(pkgs))
	next := make(chan int)
	var wg sync.WaitGroup
	for _, r := range runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				times[i], errs[i] = r.baseline(ctx, pkgs[i], byPkg[pkgs[i]])
			}
		}()
	}
	for i := range pkgs {
		next <- i
	}
	close(next)
	wg.Wait()
	all := slices.Concat(times...)
	slices.SortStableFunc(all, func(a, b TestTime) int { return cmp.Compare(b.Elapsed, a.Elapsed) })
	return all, errors.Join(errs...)
}

// TestTime is a top-level test's time in the baseline, and the mutants
// whose run selects it.
type TestTime struct {
	Package, Test string
	Elapsed       time.Duration
	Mutants       int
}

// baselineTimeouts is how many mutants' timeouts the baseline of one
// package may take: it runs the tests of every mutant of the package at
// once (a hundred in consumer), where a mutant runs its own.
const baselineTimeouts = 4

// baseline runs the tests of ms in the package p on the unmutated copy.
func (r Runner) baseline(ctx context.Context, p string, ms []Mutant) ([]TestTime, error) {
	var res []string
	for _, m := range ms {
		res = append(res, topLevel(m.Run))
	}
	r.Timeout *= baselineTimeouts
	events, out, err := r.goTest(ctx, []string{p}, strings.Join(res, "|"))
	if err != nil {
		return nil, fmt.Errorf("the tests of %s fail on the unmutated tree (%v):\n%s", p, err, tail(out, 40))
	}
	var ran []string
	var times []TestTime
	at := map[string]int{} // a top-level test's index in times
	for _, e := range events {
		if e.Action == "run" && e.Test != "" {
			ran = append(ran, e.Test)
		}
		if e.Action != "pass" || e.Test == "" {
			continue
		}
		// A test whose subtests run in parallel ends before them: its
		// time is its longest subtest's.
		top, _, _ := strings.Cut(e.Test, "/")
		i, ok := at[top]
		if !ok {
			i, at[top] = len(times), len(times)
			times = append(times, TestTime{Package: p, Test: top})
			for _, m := range ms {
				if runMatches(topLevel(m.Run), top) {
					times[i].Mutants++
				}
			}
		}
		times[i].Elapsed = max(times[i].Elapsed, time.Duration(e.Elapsed*float64(time.Second)))
	}
	var errs []error
	for _, m := range ms {
		found := false
		for _, t := range ran {
			found = found || runMatches(m.Run, t)
		}
		if !found {
			errs = append(errs, fmt.Errorf("mutant %s (table line %d): no test in %s matches -run %s; the table names a test that does not exist", m.Name, m.Line, p, m.Run))
		}
	}
	return times, errors.Join(errs...)
}

// tail returns the last n lines of go test -json output as plain text.
func tail(out []byte, n int) string {
	var lines []string
	for _, l := range bytes.Split(out, []byte("\n")) {
		var e testEvent
		if len(l) > 0 && l[0] == '{' && json.Unmarshal(l, &e) == nil {
			if e.Output != "" {
				lines = append(lines, strings.TrimRight(e.Output, "\n"))
			}
			continue
		}
		if len(l) > 0 {
			lines = append(lines, string(l))
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
