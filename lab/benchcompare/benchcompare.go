// Package benchcompare runs benchmarks of different queues, each a command
// of its own, interleaved on the same machine and PostgreSQL, and reports
// each one's best rate and the ratio between them. It owns the running,
// the interleaving, the choice of the best and the report; how to start
// and read each contestant (paydedup's bench, River's) is in its own file.
package benchcompare

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"text/tabwriter"
	"time"
)

// DefaultRounds is how many times each contestant runs: best of two.
const DefaultRounds = 2

// Contestant is one benchmark run as an outside command: how to start it
// and how to read its rate from what it printed.
type Contestant struct {
	Name    string     // short name in the report: "paydedup", "river"
	Unit    string     // what its rate counts: "payments/s", "jobs/s"
	Prepare [][]string // commands run once before the first round (e.g. a migration)
	Command []string   // the benchmark, run once per round
	Env     []string   // KEY=VALUE added to this process's environment
	// Parse reads the figures from the command's standard output.
	Parse func(stdout []byte) (Figures, error)
}

// Figures are what one run reports of itself.
type Figures struct {
	Rate    float64         `json:"rate"`             // items per second, as the contestant times it
	Items   int             `json:"items"`            // items worked
	Seconds float64         `json:"seconds"`          // the timed span the rate is over
	Detail  json.RawMessage `json:"detail,omitempty"` // the contestant's own report, when it gives one as JSON
}

// Run is one run of one contestant.
type Run struct {
	Name  string `json:"name"`
	Unit  string `json:"unit"`
	Round int    `json:"round"`
	Figures
	// WallSeconds is the whole command, setup included. CPUUSPerItem is
	// the command's process CPU time (user+system, as wait4 reports it)
	// over the whole command, setup included, per item: what the
	// contestant's own process spent, not PostgreSQL's.
	WallSeconds  float64 `json:"wall_seconds"`
	CPUSeconds   float64 `json:"cpu_seconds"`
	CPUUSPerItem float64 `json:"cpu_us_per_item"`
	// ServerCPUSeconds is the whole PostgreSQL server's CPU time over the
	// same command (Config.ServerCPU: every backend, those the command's
	// pool opened and closed included, and the background workers), and
	// ServerCPUUSPerItem that per item; MachineCPUUSPerItem is the
	// process's and the server's together. All three are -1 when the
	// server is not metered.
	ServerCPUSeconds    float64 `json:"server_cpu_seconds"`
	ServerCPUUSPerItem  float64 `json:"server_cpu_us_per_item"`
	MachineCPUUSPerItem float64 `json:"machine_cpu_us_per_item"`
}

// Best is a contestant's best run.
type Best struct {
	Name  string  `json:"name"`
	Unit  string  `json:"unit"`
	Rate  float64 `json:"rate"`
	Round int     `json:"round"`
	// RatioToBaseline is Rate over the baseline's best rate.
	RatioToBaseline float64 `json:"ratio_to_baseline"`
}

// Result is the comparison's report.
type Result struct {
	Rounds   int    `json:"rounds"`
	Runs     []Run  `json:"runs"`
	Best     []Best `json:"best"` // in the contestants' order
	Baseline string `json:"baseline"`
	// Ratio is the first contestant's best rate over the baseline's best.
	Ratio float64 `json:"ratio"`
}

// Config is one comparison.
type Config struct {
	Contestants []Contestant
	Rounds      int    // runs of each contestant, interleaved; 0 is DefaultRounds
	Baseline    string // the contestant the others' bests are divided by; "" is the last
	JSON        bool   // print one JSON object on the last line
	Out, ErrOut io.Writer
	// Exec runs one command; nil runs it as a child process. Tests replace it.
	Exec func(ctx context.Context, args, env []string, stderr io.Writer) (Output, error)
	// ServerCPU, when set, reads the PostgreSQL server's CPU time so far
	// (procstat.TreeCPU of its postmaster); it is read before and after
	// each run. The contestants share one server, so this is what each
	// one's work cost it, on the machine the rate was measured on.
	ServerCPU func() (time.Duration, error)
}

// Output is what one command left: its standard output, and the time it took.
type Output struct {
	Stdout      []byte
	WallSeconds float64
	CPUSeconds  float64
}

// Validate checks the contestants and the rounds.
func (c Config) Validate() error {
	var errs []error
	if len(c.Contestants) < 2 {
		errs = append(errs, fmt.Errorf("a comparison needs at least two contestants, got %d", len(c.Contestants)))
	}
	if c.Rounds < 0 {
		errs = append(errs, fmt.Errorf("--rounds must be at least 1, got %d", c.Rounds))
	}
	seen := map[string]bool{}
	for _, k := range c.Contestants {
		if k.Name == "" || len(k.Command) == 0 || k.Parse == nil {
			errs = append(errs, fmt.Errorf("contestant %q needs a name, a command and a parser", k.Name))
		}
		if seen[k.Name] {
			errs = append(errs, fmt.Errorf("contestant %q named twice", k.Name))
		}
		seen[k.Name] = true
	}
	if c.Baseline != "" && !seen[c.Baseline] {
		errs = append(errs, fmt.Errorf("baseline %q is not a contestant", c.Baseline))
	}
	return errors.Join(errs...)
}

// Compare prepares each contestant, then runs them in turn, round after
// round (A B A B), and reports every run, each one's best and the ratio.
// Any run that fails or cannot be read stops the comparison.
func Compare(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	if cfg.Rounds == 0 {
		cfg.Rounds = DefaultRounds
	}
	if cfg.Baseline == "" {
		cfg.Baseline = cfg.Contestants[len(cfg.Contestants)-1].Name
	}
	if cfg.Exec == nil {
		cfg.Exec = execCommand
	}
	if cfg.ErrOut == nil {
		cfg.ErrOut = io.Discard
	}
	for _, k := range cfg.Contestants {
		for _, p := range k.Prepare {
			fmt.Fprintf(cfg.ErrOut, "benchcompare: %s: %s\n", k.Name, strings.Join(p, " "))
			if _, err := cfg.Exec(ctx, p, k.Env, cfg.ErrOut); err != nil {
				return Result{}, fmt.Errorf("prepare %s (%s): %w", k.Name, strings.Join(p, " "), err)
			}
		}
	}
	res := Result{Rounds: cfg.Rounds, Baseline: cfg.Baseline}
	for round := 1; round <= cfg.Rounds; round++ {
		for _, k := range cfg.Contestants {
			fmt.Fprintf(cfg.ErrOut, "benchcompare: round %d/%d: %s: %s\n", round, cfg.Rounds, k.Name, strings.Join(k.Command, " "))
			server0, err := serverCPU(cfg.ServerCPU)
			if err != nil {
				return res, fmt.Errorf("%s, round %d: %w", k.Name, round, err)
			}
			out, err := cfg.Exec(ctx, k.Command, k.Env, cfg.ErrOut)
			if err != nil {
				return res, fmt.Errorf("%s, round %d: %w%s", k.Name, round, err, tail(out.Stdout))
			}
			server1, err := serverCPU(cfg.ServerCPU)
			if err != nil {
				return res, fmt.Errorf("%s, round %d: %w", k.Name, round, err)
			}
			f, err := k.Parse(out.Stdout)
			if err != nil {
				return res, fmt.Errorf("%s, round %d: %w", k.Name, round, err)
			}
			r := Run{Name: k.Name, Unit: k.Unit, Round: round, Figures: f,
				WallSeconds: out.WallSeconds, CPUSeconds: out.CPUSeconds,
				ServerCPUSeconds: -1, ServerCPUUSPerItem: -1, MachineCPUUSPerItem: -1}
			if cfg.ServerCPU != nil {
				r.ServerCPUSeconds = (server1 - server0).Seconds()
			}
			if f.Items > 0 {
				r.CPUUSPerItem = out.CPUSeconds * 1e6 / float64(f.Items)
				if cfg.ServerCPU != nil {
					r.ServerCPUUSPerItem = r.ServerCPUSeconds * 1e6 / float64(f.Items)
					r.MachineCPUUSPerItem = r.CPUUSPerItem + r.ServerCPUUSPerItem
				}
			}
			res.Runs = append(res.Runs, r)
		}
	}
	best, err := Bests(res.Runs, cfg.Contestants, cfg.Baseline)
	if err != nil {
		return res, err
	}
	res.Best, res.Ratio = best, best[0].RatioToBaseline
	if cfg.Out != nil {
		if err := res.Report(cfg.Out, cfg.JSON); err != nil {
			return res, err
		}
	}
	return res, nil
}

// serverCPU reads the server's CPU time through read, 0 without a meter.
func serverCPU(read func() (time.Duration, error)) (time.Duration, error) {
	if read == nil {
		return 0, nil
	}
	d, err := read()
	if err != nil {
		return 0, fmt.Errorf("read PostgreSQL's CPU time: %w", err)
	}
	return d, nil
}

// Bests picks each contestant's fastest run (the earlier round on a tie)
// and divides each best rate by the baseline's.
func Bests(runs []Run, contestants []Contestant, baseline string) ([]Best, error) {
	var best []Best
	var base float64
	for _, k := range contestants {
		b := Best{Name: k.Name, Unit: k.Unit}
		for _, r := range runs {
			if r.Name == k.Name && (b.Round == 0 || r.Rate > b.Rate) {
				b.Rate, b.Round = r.Rate, r.Round
			}
		}
		if b.Round == 0 {
			return nil, fmt.Errorf("%s has no run", k.Name)
		}
		if k.Name == baseline {
			base = b.Rate
		}
		best = append(best, b)
	}
	if base <= 0 {
		return nil, fmt.Errorf("baseline %q has no positive rate", baseline)
	}
	for i := range best {
		best[i].RatioToBaseline = best[i].Rate / base
	}
	return best, nil
}

// Report prints a table of the runs and the bests, and with asJSON the
// result as one JSON object on the last line.
func (r Result) Report(w io.Writer, asJSON bool) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "round\tcontestant\trate\tunit\titems\tseconds\twall s\tprocess CPU µs/item\tPostgreSQL CPU µs/item\tboth µs/item\t")
	perItem := func(v float64) string {
		if v < 0 {
			return "-" // not metered
		}
		return fmt.Sprintf("%.1f", v)
	}
	for _, x := range r.Runs {
		fmt.Fprintf(tw, "%d\t%s\t%.1f\t%s\t%d\t%.2f\t%.1f\t%.1f\t%s\t%s\t\n", x.Round, x.Name, x.Rate, x.Unit, x.Items, x.Seconds,
			x.WallSeconds, x.CPUUSPerItem, perItem(x.ServerCPUUSPerItem), perItem(x.MachineCPUUSPerItem))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, b := range r.Best {
		fmt.Fprintf(w, "best %s: %.1f %s (round %d), %.2f× %s\n", b.Name, b.Rate, b.Unit, b.Round, b.RatioToBaseline, r.Baseline)
	}
	if len(r.Best) > 0 {
		fmt.Fprintf(w, "ratio %s/%s: %.2f\n", r.Best[0].Name, r.Baseline, r.Ratio)
	}
	if !asJSON {
		return nil
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// execCommand runs args as a child process with env added, its standard
// error passed through, and returns its standard output and times.
func execCommand(ctx context.Context, args, env []string, stderr io.Writer) (Output, error) {
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	if len(env) > 0 {
		cmd.Env = append(cmd.Environ(), env...)
	}
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, stderr
	start := time.Now()
	err := cmd.Run()
	out := Output{Stdout: stdout.Bytes(), WallSeconds: time.Since(start).Seconds()}
	if ps := cmd.ProcessState; ps != nil {
		out.CPUSeconds = (ps.UserTime() + ps.SystemTime()).Seconds()
	}
	return out, err
}

// tail is the end of what a failed command printed, for its error.
func tail(b []byte) string {
	s := strings.TrimSpace(string(b))
	if s == "" {
		return " (it printed nothing on stdout)"
	}
	if len(s) > 600 {
		s = "…" + s[len(s)-600:]
	}
	return "; its stdout ended:\n" + s
}
