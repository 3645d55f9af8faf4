package benchcompare

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ParseRiver reads the closing line of real runs: River's own CLI's
// ("river bench --num-total-jobs 60000", River v0.51.2, captured when
// make bench-compare ran that CLI) and our program's in ./river, which
// prints the same line.
func TestParseRiverRealOutput(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		file    string
		jobs    int
		rate    float64
		seconds float64
	}{
		{"testdata/river_bench_60000.txt", 60000, 6799.7, 8.823923762},
		{"testdata/river_program_60000.txt", 60000, 5488.0, 10.932864903},
	} {
		t.Run(c.file, func(t *testing.T) {
			t.Parallel()
			b, err := os.ReadFile(c.file)
			if err != nil {
				t.Fatal(err)
			}
			f, err := ParseRiver(b)
			if err != nil {
				t.Fatal(err)
			}
			if f.Items != c.jobs || f.Rate != c.rate || math.Abs(f.Seconds-c.seconds) > 1e-9 {
				t.Fatalf("read %+v, want %d jobs at %v/s over %vs", f, c.jobs, c.rate, c.seconds)
			}
		})
	}
}

func TestParseRiver(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, out string
		want      Figures
		err       string
	}{
		{name: "closing line among interval lines and logs",
			out: "time=x level=INFO msg=\"Available job count\" num_jobs=10\n" +
				"bench: jobs worked [          0 ], inserted [         10 ], job/sec [        0.0 ] [0s]\n" +
				"bench: total jobs worked [         10 ], total jobs inserted [         10 ], overall job/sec [      123.4 ], running 81.037ms\n",
			want: Figures{Rate: 123.4, Items: 10, Seconds: 0.081037}},
		{name: "no padding, no trailing newline",
			out:  "bench: total jobs worked [5], total jobs inserted [5], overall job/sec [2.5], running 2s",
			want: Figures{Rate: 2.5, Items: 5, Seconds: 2}},
		{name: "the last closing line counts",
			out:  "total jobs worked [ 1 ], total jobs inserted [ 1 ], overall job/sec [ 1.0 ], running 1s\ntotal jobs worked [ 4 ], total jobs inserted [ 4 ], overall job/sec [ 8.0 ], running 500ms\n",
			want: Figures{Rate: 8, Items: 4, Seconds: 0.5}},
		{name: "only interval lines", out: "bench: jobs worked [ 10 ], inserted [ 10 ], job/sec [ 5.0 ] [2s]\n",
			err: "job/sec [ 5.0 ] [2s]"},
		{name: "nothing", out: "", err: "printed: nothing"},
		{name: "no jobs worked: NaN rate", out: "bench: total jobs worked [ 0 ], total jobs inserted [ 0 ], overall job/sec [ NaN ], running 0s\n",
			err: "no jobs worked"},
		{name: "rate not a number", out: "bench: total jobs worked [ 3 ], total jobs inserted [ 3 ], overall job/sec [ fast ], running 1s\n",
			err: "fast"},
		{name: "duration not a duration", out: "bench: total jobs worked [ 3 ], total jobs inserted [ 3 ], overall job/sec [ 3.0 ], running soon\n",
			err: "soon"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseRiver([]byte(c.out))
			if c.err != "" {
				if !errors.Is(err, ErrRiverOutput) || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want ErrRiverOutput naming %q", err, c.err)
				}
				return
			}
			if err != nil || got.Rate != c.want.Rate || got.Items != c.want.Items || math.Abs(got.Seconds-c.want.Seconds) > 1e-9 {
				t.Fatalf("got %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
}

func TestRiverWantsEveryJobWorked(t *testing.T) {
	t.Parallel()
	k := River("river", "postgres://x/paydedup_river", 100)
	_, err := k.Parse([]byte("bench: total jobs worked [ 99 ], total jobs inserted [ 100 ], overall job/sec [ 9.0 ], running 11s\n"))
	if err == nil || !strings.Contains(err.Error(), "worked 99 jobs, want 100") {
		t.Fatalf("err %v", err)
	}
	want := []string{"river", "bench", "--database-url", "postgres://x/paydedup_river", "--num-total-jobs", "100"}
	if !slices.Equal(k.Command, want) || k.Prepare[0][1] != "migrate-up" {
		t.Fatalf("command %q, prepare %q", k.Command, k.Prepare)
	}
}

func TestParsePaydedup(t *testing.T) {
	t.Parallel()
	report := `{"mode":"batched","payments":60000,"seconds":5,"payments_per_sec":12000,"double_charges":0,"lost":0,"worker_cpu_us_per_payment":80}`
	f, err := ParsePaydedup([]byte("bench: publishing\nsome table\n" + report + "\n\n"))
	if err != nil || f.Rate != 12000 || f.Items != 60000 || f.Seconds != 5 || string(f.Detail) != report {
		t.Fatalf("got %+v, %v", f, err)
	}
	for _, c := range []struct{ out, err string }{
		{"a table\nno json here\n", "no json here"},
		{`{"payments":10,"seconds":1,"paymentsPerSec":10}`, "no payments, seconds or payments_per_sec"},
		{`{"payments":10,"seconds":1,"payments_per_sec":10,"double_charges":1,"lost":0}`, "charged 1 twice"},
		{`{"payments":10,"seconds":1,"payments_per_sec":0}`, "payments_per_sec 0"},
	} {
		if _, err := ParsePaydedup([]byte(c.out)); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: err %v, want %q", c.out, err, c.err)
		}
	}
	if _, err := Paydedup("paydedup", 11).Parse([]byte(report)); err == nil || !strings.Contains(err.Error(), "60000 payments, want 11") {
		t.Errorf("a report of another size: err %v", err)
	}
}

func TestBests(t *testing.T) {
	t.Parallel()
	ks := []Contestant{{Name: "paydedup", Unit: "payments/s"}, {Name: "shipped", Unit: "payments/s"}, {Name: "river", Unit: "jobs/s"}}
	runs := []Run{
		{Name: "paydedup", Round: 1, Figures: Figures{Rate: 900}},
		{Name: "shipped", Round: 1, Figures: Figures{Rate: 300}},
		{Name: "river", Round: 1, Figures: Figures{Rate: 500}},
		{Name: "paydedup", Round: 2, Figures: Figures{Rate: 1200}},
		{Name: "shipped", Round: 2, Figures: Figures{Rate: 300}},
		{Name: "river", Round: 2, Figures: Figures{Rate: 400}},
	}
	got, err := Bests(runs, ks, "river")
	if err != nil {
		t.Fatal(err)
	}
	want := []Best{
		{Name: "paydedup", Unit: "payments/s", Rate: 1200, Round: 2, RatioToBaseline: 2.4},
		{Name: "shipped", Unit: "payments/s", Rate: 300, Round: 1, RatioToBaseline: 0.6},
		{Name: "river", Unit: "jobs/s", Rate: 500, Round: 1, RatioToBaseline: 1},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("bests %+v\nwant %+v", got, want)
	}
	if _, err := Bests(runs[:1], ks, "river"); err == nil {
		t.Error("a contestant without a run: no error")
	}
}

// Compare runs A B A B with each contestant's preparation once before,
// and reports the bests and the ratio in the last line's JSON.
func TestCompareInterleavesAndReports(t *testing.T) {
	t.Parallel()
	rates := map[string][]string{"a": {"10", "30"}, "b": {"20", "15"}}
	var calls []string
	// The server's CPU: each run of a costs it 0.2 s, each run of b 0.1 s,
	// and 25 ms more passes by each read of the meter (other work): a run
	// is charged what passed between its two reads, its own second step
	// included.
	var server time.Duration
	serverCPU := func() (time.Duration, error) {
		server += 25 * time.Millisecond
		return server, nil
	}
	fake := func(_ context.Context, args, _ []string, _ io.Writer) (Output, error) {
		calls = append(calls, strings.Join(args, " "))
		if args[1] == "prepare" {
			return Output{}, nil
		}
		server += map[string]time.Duration{"a": 200 * time.Millisecond, "b": 100 * time.Millisecond}[args[0]]
		n := 0
		for _, c := range calls {
			if c == strings.Join(args, " ") {
				n++
			}
		}
		return Output{Stdout: []byte("rate " + rates[args[0]][n-1] + "\n"), CPUSeconds: 0.5, WallSeconds: 2}, nil
	}
	parse := func(b []byte) (Figures, error) {
		rate, err := strconv.ParseFloat(strings.Fields(string(b))[1], 64)
		return Figures{Rate: rate, Items: 1000}, err
	}
	var out bytes.Buffer
	res, err := Compare(context.Background(), Config{
		Contestants: []Contestant{
			{Name: "a", Unit: "payments/s", Command: []string{"a", "run"}, Parse: parse},
			{Name: "b", Unit: "jobs/s", Prepare: [][]string{{"b", "prepare"}}, Command: []string{"b", "run"}, Parse: parse},
		},
		JSON: true, Out: &out, Exec: fake, ServerCPU: serverCPU,
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"b prepare", "a run", "b run", "a run", "b run"}; !slices.Equal(calls, want) {
		t.Fatalf("calls %q, want %q", calls, want)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var got Result
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("last line: %v\n%s", err, out.String())
	}
	if got.Ratio != 1.5 || got.Baseline != "b" || got.Rounds != 2 || len(got.Runs) != 4 ||
		got.Best[0].Rate != 30 || got.Best[0].Round != 2 || got.Best[1].Rate != 20 || got.Best[1].Round != 1 ||
		got.Runs[0].CPUUSPerItem != 500 || res.Ratio != got.Ratio {
		t.Fatalf("report %+v\n%s", got, out.String())
	}
	if !strings.Contains(out.String(), "ratio a/b: 1.50") {
		t.Errorf("table:\n%s", out.String())
	}
	// Each run is charged the server's CPU between its own two reads.
	for _, r := range got.Runs {
		want := map[string]float64{"a": 225, "b": 125}[r.Name] // µs per item: (run + one read's step) / 1,000 items
		if math.Abs(r.ServerCPUUSPerItem-want) > 1e-6 || math.Abs(r.MachineCPUUSPerItem-(500+want)) > 1e-6 {
			t.Errorf("%s round %d: PostgreSQL %v and both %v µs per item, want %v and %v", r.Name, r.Round, r.ServerCPUUSPerItem, r.MachineCPUUSPerItem, want, 500+want)
		}
	}

	// Without a meter, the server's figures say so.
	res, err = Compare(context.Background(), Config{
		Contestants: []Contestant{
			{Name: "a", Unit: "payments/s", Command: []string{"a", "run"}, Parse: parse},
			{Name: "b", Unit: "jobs/s", Command: []string{"b", "run"}, Parse: parse},
		},
		Rounds: 1, Exec: func(_ context.Context, args, _ []string, _ io.Writer) (Output, error) {
			return Output{Stdout: []byte("rate 10\n"), CPUSeconds: 0.5}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Runs {
		if r.ServerCPUSeconds != -1 || r.ServerCPUUSPerItem != -1 || r.MachineCPUUSPerItem != -1 {
			t.Errorf("unmetered run %+v: want -1 for the server's figures", r)
		}
	}

	// A meter that cannot be read stops the comparison.
	_, err = Compare(context.Background(), Config{
		Contestants: []Contestant{
			{Name: "a", Unit: "payments/s", Command: []string{"a", "run"}, Parse: parse},
			{Name: "b", Unit: "jobs/s", Command: []string{"b", "run"}, Parse: parse},
		},
		Exec:      fake,
		ServerCPU: func() (time.Duration, error) { return 0, errors.New("no /proc here") },
	})
	if err == nil || !strings.Contains(err.Error(), "no /proc here") || !strings.Contains(err.Error(), "PostgreSQL's CPU") {
		t.Errorf("unreadable meter: %v", err)
	}
}

// A contestant whose output cannot be read stops the comparison, naming
// what it printed; so does one that exits non-zero.
func TestCompareStopsOnUnreadableOrFailedRun(t *testing.T) {
	t.Parallel()
	ks := []Contestant{
		Paydedup("paydedup", 10),
		River("river", "postgres://x", 10),
	}
	fake := func(stdout string, err error) func(context.Context, []string, []string, io.Writer) (Output, error) {
		return func(_ context.Context, args, _ []string, _ io.Writer) (Output, error) {
			if args[0] == "paydedup" || args[1] == "migrate-up" {
				return Output{Stdout: []byte(`{"payments":10,"seconds":1,"payments_per_sec":10}`)}, nil
			}
			return Output{Stdout: []byte(stdout)}, err
		}
	}
	_, err := Compare(context.Background(), Config{Contestants: ks, Exec: fake("river says hello\n", nil)})
	if !errors.Is(err, ErrRiverOutput) || !strings.Contains(err.Error(), "river says hello") || !strings.Contains(err.Error(), "river, round 1") {
		t.Fatalf("unreadable: %v", err)
	}
	_, err = Compare(context.Background(), Config{Contestants: ks, Exec: fake("panic: boom\n", errors.New("exit status 2"))})
	if err == nil || !strings.Contains(err.Error(), "exit status 2") || !strings.Contains(err.Error(), "panic: boom") {
		t.Fatalf("failed: %v", err)
	}
}

// The real child process: its stdout, exit status and CPU time.
func TestExecCommand(t *testing.T) {
	t.Parallel()
	out, err := execCommand(context.Background(), []string{"sh", "-c", `echo "$X"; echo noise >&2`}, []string{"X=from env"}, io.Discard)
	if err != nil || string(out.Stdout) != "from env\n" || out.WallSeconds <= 0 {
		t.Fatalf("%+v, %v", out, err)
	}
	if _, err := execCommand(context.Background(), []string{"sh", "-c", "exit 3"}, nil, io.Discard); err == nil {
		t.Fatal("exit 3: no error")
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	k := Contestant{Name: "a", Command: []string{"a"}, Parse: ParseRiver}
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Contestants: []Contestant{k}}, "at least two"},
		{Config{Contestants: []Contestant{k, k}}, `"a" named twice`},
		{Config{Contestants: []Contestant{k, {Name: "b"}}}, `"b" needs a name, a command and a parser`},
		{Config{Contestants: []Contestant{k, {Name: "b", Command: []string{"b"}, Parse: ParseRiver}}, Baseline: "c"}, `baseline "c"`},
	} {
		if err := c.cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v, want %q", err, c.want)
		}
	}
}
