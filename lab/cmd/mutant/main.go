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
//	go run ./lab/cmd/mutant [-table lab/cmd/mutant/mutants.txt] [-only REGEX] [-timeout 3m] [-workers 2]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
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
	fmt.Fprintf(out, "mutant: baseline: the named tests on the unmutated tree\n")
	if err := runners[0].Baseline(ctx, ms); err != nil {
		return err
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
	fmt.Fprintf(out, "mutant: %-8s %-28s %5.1fs  %s%s\n", res.Outcome, res.Mutant.Name, res.Elapsed.Seconds(), res.Mutant.File, by)
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
