// Command mutant checks that the tests guarding the money path can fail: it
// applies each mutant of a table (mutants.txt beside this file: small,
// realistic slips in the core, each an exact source edit) to a scratch copy
// of the tree, one at a time, runs only the tests named for it, and fails if
// any mutant survives. It never edits the working tree.
//
// It first checks that every mutant's original text occurs exactly once in
// the current code, and that the named tests exist and pass on the
// unmutated copy; a table that drifted from the code fails with the
// mutant's name and file, so that fixing the table is quick.
//
//	go run ./lab/cmd/mutant [-table lab/cmd/mutant/mutants.txt] [-only REGEX] [-timeout 3m] [-workers 2] [-check | -baseline]
//
// It compiles once, with -trimpath, what the tests import, so that the
// runners (and later runs on the same machine) share the build cache; the
// baseline's packages are shared out among the runners. Each mutant's
// tests run with -failfast and without go vet; it reports
// each mutant's time (and of it, its tests' own run; the rest is building
// the test binary) and, at the end, the slowest mutants.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "mutant:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fl := flag.NewFlagSet("mutant", flag.ContinueOnError)
	table := fl.String("table", "lab/cmd/mutant/mutants.txt", "the mutant table (a relative path is from the module root)")
	only := fl.String("only", "", "run only the mutants whose name matches this regex")
	timeout := fl.Duration("timeout", 3*time.Minute, "go test -timeout for one mutant's tests")
	workers := fl.Int("workers", 2, "mutants run at once, each in its own scratch copy")
	keep := fl.Bool("keep", false, "keep the scratch copies")
	checkOnly := fl.Bool("check", false, "only check that every mutant's original text occurs exactly once")
	baselineOnly := fl.Bool("baseline", false, "stop after the baseline: the named tests pass on the unmutated tree and each run selects a test")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *workers < 1 || *timeout <= 0 {
		return errors.New("-workers must be at least 1 and -timeout positive")
	}
	var onlyRE *regexp.Regexp
	if *only != "" {
		var err error
		if onlyRE, err = regexp.Compile(*only); err != nil {
			return fmt.Errorf("-only: %w", err)
		}
	}
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	tablePath := *table
	if !filepath.IsAbs(tablePath) {
		tablePath = filepath.Join(root, tablePath)
	}
	f, err := os.Open(tablePath)
	if err != nil {
		return err
	}
	ms, err := ParseTable(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", *table, err)
	}
	if onlyRE != nil {
		var sel []Mutant
		for _, m := range ms {
			if onlyRE.MatchString(m.Name) {
				sel = append(sel, m)
			}
		}
		ms = sel
	}
	if len(ms) == 0 {
		return errors.New("no mutant to run")
	}
	if err := Check(root, ms); err != nil {
		return fmt.Errorf("the table %s no longer matches the code:\n%w", *table, err)
	}
	if *checkOnly {
		fmt.Fprintf(out, "mutant: %d mutants, every original text found exactly once\n", len(ms))
		return nil
	}

	start := time.Now()
	gobin := "go"
	if g := os.Getenv("GO"); g != "" {
		gobin = g
	}
	n := min(*workers, len(ms))
	runners := make([]Runner, n)
	for i := range runners {
		dir, err := os.MkdirTemp("", "paydedup-mutant-*")
		if err != nil {
			return err
		}
		if !*keep {
			defer os.RemoveAll(dir)
		} else {
			fmt.Fprintf(out, "mutant: scratch copy %s\n", dir)
		}
		if err := CopyTree(root, dir); err != nil {
			return fmt.Errorf("copy the tree: %w", err)
		}
		runners[i] = Runner{Dir: dir, Timeout: *timeout, Go: gobin}
	}
	var pkgs []string
	for _, m := range ms {
		for _, p := range m.Packages {
			if !slices.Contains(pkgs, p) {
				pkgs = append(pkgs, p)
			}
		}
	}
	fmt.Fprintf(out, "mutant: compiling what the tests of %d packages import\n", len(pkgs))
	if err := runners[0].Prewarm(ctx, pkgs); err != nil {
		return err
	}
	fmt.Fprintf(out, "mutant: baseline: the named tests on the unmutated tree, %d packages at a time (%.0fs so far)\n", n, time.Since(start).Seconds())
	times, err := Baseline(ctx, runners, ms)
	if err != nil {
		return err
	}
	// The slowest tests the mutants run: each mutant that runs one pays
	// for it (unless it fails early), on top of its build.
	for _, tt := range times[:min(10, len(times))] {
		fmt.Fprintf(out, "mutant: slow test: %-48s %5.1fs  run by %d mutant(s)  %s\n", tt.Test, tt.Elapsed.Seconds(), tt.Mutants, tt.Package)
	}
	if *baselineOnly {
		fmt.Fprintf(out, "mutant: baseline passed in %.0fs\n", time.Since(start).Seconds())
		return nil
	}
	fmt.Fprintf(out, "mutant: baseline passed in %.0fs; %d mutants, %d at a time\n", time.Since(start).Seconds(), len(ms), n)

	results := make([]Result, len(ms))
	next := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, r := range runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				res := r.RunMutant(ctx, ms[i])
				results[i] = res
				mu.Lock()
				report(out, res)
				mu.Unlock()
			}
		}()
	}
	for i := range ms {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}

	counts := map[Outcome]int{}
	var bad []error
	for _, res := range results {
		counts[res.Outcome]++
		switch res.Outcome {
		case Survived:
			bad = append(bad, fmt.Errorf("mutant %s survived: no test noticed that %s breaks (%s); reproduce: apply it by hand, then go test -count=1 -run '%s' %v",
				res.Mutant.Name, res.Mutant.File, res.Mutant.Guards, res.Mutant.Run, res.Mutant.Packages))
		case Broken:
			bad = append(bad, fmt.Errorf("mutant %s is broken: %s", res.Mutant.Name, res.Detail))
		}
	}
	// The slowest mutants, where a narrower run would save most.
	slow := slices.Clone(results)
	slices.SortFunc(slow, func(a, b Result) int { return cmp.Compare(b.Elapsed, a.Elapsed) })
	for _, res := range slow[:min(10, len(slow))] {
		if res.Outcome != 0 {
			fmt.Fprintf(out, "mutant: slow: %-28s %5.1fs (tests %4.1fs)  -run %s %v\n", res.Mutant.Name, res.Elapsed.Seconds(), res.Tests.Seconds(), res.Mutant.Run, res.Mutant.Packages)
		}
	}
	fmt.Fprintf(out, "mutant: %d killed, %d survived, %d broken, of %d, in %.0fs\n",
		counts[Killed], counts[Survived], counts[Broken], len(ms), time.Since(start).Seconds())
	return errors.Join(bad...)
}

func report(out io.Writer, res Result) {
	by := ""
	if len(res.Failed) > 0 {
		by = fmt.Sprintf(" by %v", res.Failed)
		if res.Why != "" {
			by += ": " + res.Why
		}
	} else if res.Detail != "" && res.Outcome == Killed {
		by = " (" + res.Detail + ")"
	}
	fmt.Fprintf(out, "mutant: %-8s %-28s %5.1fs (tests %4.1fs)  %s%s\n", res.Outcome, res.Mutant.Name, res.Elapsed.Seconds(), res.Tests.Seconds(), res.Mutant.File, by)
}

// moduleRoot is the nearest directory at or above the working directory
// with a go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod at or above the working directory")
		}
		dir = parent
	}
}
