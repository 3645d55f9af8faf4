// Package cpusplit tells a lab bench where its CPU time goes: the bench's
// own process is split between the part under test and the lab parts that
// share the process (the embedded NATS server, the simulator, the load's
// HTTP clients), and the PostgreSQL backends serving the bench's pool are
// read from /proc.
//
// The lab parts run under pprof labels (their goroutines inherit the label
// of the goroutine that started them), and a CPU profile of the measured
// phase gives each label's share of the samples. A sample is also a part's
// when a frame of its stack is in the part's packages (a goroutine a server
// starts from a timer carries no label). The process's own CPU time
// (getrusage) times those shares is each part's CPU. Samples of no part are
// the part under test's, including the runtime's background GC, part of
// which the lab parts' allocations cause: so its figure is an upper bound.
package cpusplit

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/google/pprof/profile"

	"github.com/paydedup/paydedup/lab/procstat"
)

// LabelKey is the pprof label whose value names a part.
const LabelKey = "paydedup_bench"

// Part is one lab part sharing the bench's process.
type Part struct {
	Name     string   // the value of its LabelKey label
	Packages []string // prefixes of the function names whose frames are its
}

// Splitter splits a process's CPU time and heap between its parts.
type Splitter struct {
	parts []Part
	sets  map[string]pprof.LabelSet // made once: a part may be entered per request
}

// New returns a Splitter for parts; what is none of theirs is the rest.
func New(parts ...Part) *Splitter {
	s := &Splitter{parts: parts, sets: map[string]pprof.LabelSet{}}
	for _, p := range parts {
		s.sets[p.Name] = pprof.Labels(LabelKey, p.Name)
	}
	return s
}

// Do runs f, and the goroutines it starts, labelled as part.
func (s *Splitter) Do(ctx context.Context, part string, f func(context.Context)) {
	pprof.Do(ctx, s.sets[part], f)
}

// Meter measures one phase: the process's CPU time, its profile, and the
// CPU time of the Postgres backends serving the bench's pool.
type Meter struct {
	s       *Splitter
	pids    func(context.Context) ([]int, error)
	prof    bytes.Buffer
	file    *os.File // the profile's copy, or nil
	split   bool     // the profile runs
	rusage  time.Duration
	mallocs uint64
	pgStart map[int]time.Duration
}

// Phase is one phase's CPU time by part, in microseconds per unit of work
// (payment, request).
type Phase struct {
	ProcessUS  float64            // the whole bench process
	Allocs     float64            // heap allocations of the whole process
	Parts      map[string]float64 // each part's
	RestUS     float64            // the process minus the parts: the part under test
	Split      bool               // false when the profiler was busy: the parts are 0, the rest is the process
	PGUS       float64            // the Postgres backends of pids; -1 when not measurable
	PGBackends int
}

// Start starts measuring a phase. pids lists the backends serving the
// bench's pool; profilePath, when not empty, gets a copy of the profile.
func (s *Splitter) Start(ctx context.Context, pids func(context.Context) ([]int, error), profilePath string) (*Meter, error) {
	m := &Meter{s: s, pids: pids}
	if profilePath != "" {
		f, err := os.Create(profilePath)
		if err != nil {
			return nil, fmt.Errorf("--cpuprofile: %w", err)
		}
		m.file = f
	}
	// The profiler is the process's one: when another phase in the process
	// (a parallel test's) has it, this phase is measured without a split.
	if err := pprof.StartCPUProfile(&m.prof); err == nil {
		m.split = true
	} else if m.file != nil {
		m.file.Close()
		return nil, fmt.Errorf("CPU profile: %w", err)
	}
	m.pgStart = backendCPU(ctx, pids)
	m.rusage, m.mallocs = procstat.CPU(), mallocs()
	return m, nil
}

// Abort ends the phase without figures.
func (m *Meter) Abort() {
	if m.split {
		pprof.StopCPUProfile()
	}
	if m.file != nil {
		m.file.Close()
	}
}

// Stop ends the phase and splits its CPU time over n units of work.
func (m *Meter) Stop(ctx context.Context, n int) (Phase, error) {
	total, allocs := procstat.CPU()-m.rusage, mallocs()-m.mallocs
	pgEnd := backendCPU(ctx, m.pids)
	n = max(n, 1)
	per := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(n) }
	c := Phase{ProcessUS: per(total), PGUS: -1, Allocs: float64(allocs) / float64(n), Parts: map[string]float64{}, Split: m.split}
	c.RestUS = c.ProcessUS
	if pgEnd != nil {
		var pg time.Duration
		for pid, end := range pgEnd {
			pg += end - m.pgStart[pid] // a backend that started during the phase counts from zero
		}
		c.PGUS, c.PGBackends = per(pg), len(pgEnd)
	}
	if !m.split {
		return c, nil
	}
	pprof.StopCPUProfile()
	if m.file != nil {
		_, err := m.file.Write(m.prof.Bytes())
		if cerr := m.file.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return Phase{}, fmt.Errorf("--cpuprofile: %w", err)
		}
	}
	shares, err := m.s.Shares(m.prof.Bytes())
	if err != nil {
		return Phase{}, fmt.Errorf("read the CPU profile: %w", err)
	}
	for _, p := range m.s.parts {
		c.Parts[p.Name] = c.ProcessUS * shares[p.Name]
		c.RestUS -= c.Parts[p.Name]
	}
	return c, nil
}

// Shares returns each part's share of a CPU profile's samples.
func (s *Splitter) Shares(raw []byte) (map[string]float64, error) {
	p, err := profile.Parse(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	vi := len(p.SampleType) - 1 // cpu nanoseconds
	var total int64
	by := map[string]int64{}
	for _, smp := range p.Sample {
		v := smp.Value[vi]
		total += v
		if part := s.owner(smp); part != "" {
			by[part] += v
		} else if l := smp.Label[LabelKey]; len(l) > 0 {
			by[l[0]] += v
		}
	}
	out := map[string]float64{}
	if total == 0 {
		return out, nil
	}
	for k, v := range by {
		out[k] = float64(v) / float64(total)
	}
	return out, nil
}

// owner names the part one of whose packages has a frame in the sample's
// stack, or "".
func (s *Splitter) owner(smp *profile.Sample) string {
	for _, loc := range smp.Location {
		for _, l := range loc.Line {
			if l.Function == nil {
				continue
			}
			for _, p := range s.parts {
				for _, pkg := range p.Packages {
					if strings.HasPrefix(l.Function.Name, pkg) {
						return p.Name
					}
				}
			}
		}
	}
	return ""
}

// Heap is the live heap now by part, in MiB, from a heap profile taken
// after a GC: an allocation is a part's when a frame of its stack is in the
// part's packages, else the rest's (key "").
func (s *Splitter) Heap() (map[string]float64, error) {
	runtime.GC()
	var buf bytes.Buffer
	if err := pprof.Lookup("heap").WriteTo(&buf, 0); err != nil {
		return nil, err
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		return nil, err
	}
	vi := -1
	for i, t := range p.SampleType {
		if t.Type == "inuse_space" {
			vi = i
		}
	}
	if vi < 0 {
		return nil, fmt.Errorf("heap profile without inuse_space")
	}
	out := map[string]float64{}
	for _, smp := range p.Sample {
		out[s.owner(smp)] += float64(smp.Value[vi]) / (1 << 20)
	}
	return out, nil
}

func mallocs() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs
}

// backendCPU reads, from /proc, the CPU time of the Postgres backends pids
// lists: the connections of the bench's own pool, not the cluster's
// background processes (WAL writer, checkpointer) nor other clients. nil
// when the server is not on this machine.
func backendCPU(ctx context.Context, pids func(context.Context) ([]int, error)) map[int]time.Duration {
	if pids == nil {
		return nil
	}
	list, err := pids(ctx)
	if err != nil {
		return nil
	}
	out := map[int]time.Duration{}
	for _, pid := range list {
		d, ok := procCPU(pid)
		if !ok {
			return nil // another machine's server, or a pid we cannot read
		}
		out[pid] = d
	}
	return out
}

// procCPU reads the CPU time of a postgres process: its time on a CPU in
// nanoseconds from /proc/<pid>/schedstat, or, on a kernel without it,
// utime+stime from /proc/<pid>/stat, which counts in clock ticks (10 ms:
// a short run's backends would read nothing). /proc/<pid>/stat also tells
// that the process is postgres.
func procCPU(pid int) (time.Duration, bool) {
	if runtime.GOOS != "linux" {
		return 0, false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command may contain spaces
	if i < 0 || !strings.Contains(s[:i], "(postgres") {
		return 0, false
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid)); err == nil {
		// run time (ns), run-queue wait (ns), time slices
		if f := strings.Fields(string(b)); len(f) == 3 {
			if ns, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				return time.Duration(ns), true
			}
		}
	}
	return procstat.PIDCPU(pid)
}

// PGFigure is a Postgres CPU figure, or why there is none.
func PGFigure(us float64) string {
	if us < 0 {
		return "not measurable (server not on this machine)"
	}
	return fmt.Sprintf("%.1f µs", us)
}
