package main

import (
	"bufio"
	"bytes"
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
	"strings"
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
	case strings.Contains(m.Run, "/"):
		return errors.New("run must name top-level tests (no '/')")
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
	if _, err := regexp.Compile(m.Run); err != nil {
		return fmt.Errorf("run: %w", err)
	}
	return nil
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
// events and the output.
func (r Runner) goTest(ctx context.Context, pkgs []string, run string) (events []testEvent, out []byte, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.Timeout+30*time.Second)
	defer cancel()
	args := append([]string{"test", "-count=1", "-json", "-timeout", r.Timeout.String(), "-run", run}, pkgs...)
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
	events, out, err := r.goTest(ctx, m.Packages, m.Run)
	res.Elapsed = time.Since(start)
	ran := map[string]bool{}
	for _, e := range events {
		switch {
		case e.Action == "run" && e.Test != "":
			ran[e.Package] = true
		case e.Action == "fail" && e.Test != "" && !strings.Contains(e.Test, "/"):
			res.Failed = append(res.Failed, e.Test)
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

// Baseline runs every mutant's tests on the unmutated copy, in one go test
// per package: they must pass, and each mutant's -run must match a test in
// each of its packages, or a kill would prove nothing.
func (r Runner) Baseline(ctx context.Context, ms []Mutant) error {
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
	var errs []error
	for _, p := range pkgs {
		var res []string
		for _, m := range byPkg[p] {
			res = append(res, "(?:"+m.Run+")")
		}
		events, out, err := r.goTest(ctx, []string{p}, strings.Join(res, "|"))
		var ran []string
		for _, e := range events {
			if e.Action == "run" && e.Test != "" && !strings.Contains(e.Test, "/") {
				ran = append(ran, e.Test)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("the tests of %s fail on the unmutated tree (%v):\n%s", p, err, tail(out, 40)))
			continue
		}
		for _, m := range byPkg[p] {
			re := regexp.MustCompile(m.Run)
			found := false
			for _, t := range ran {
				found = found || re.MatchString(t)
			}
			if !found {
				errs = append(errs, fmt.Errorf("mutant %s (table line %d): no test in %s matches -run %s; the table names a test that does not exist", m.Name, m.Line, p, m.Run))
			}
		}
	}
	return errors.Join(errs...)
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
