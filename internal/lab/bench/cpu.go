package bench

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

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/internal/lab/procstat"
	"github.com/paydedup/paydedup/provider"
)

// How the bench splits its own process's CPU time between the worker and
// the lab parts that share the process: the embedded NATS server and the
// simulator run under pprof labels (their goroutines inherit the label of
// the goroutine that started them; a simulator call runs in the worker's
// goroutine, inside pprof.Do), and a CPU profile of the consumption phase
// gives each label's share of the samples. The process's own CPU time
// (getrusage) times those shares is each part's CPU. Samples without a
// label are the worker's, including the runtime's background GC, part of
// which the simulator's allocations cause: so the worker's figure is an
// upper bound.
const (
	labelKey  = "paydedup_bench"
	labelSim  = "simulator"
	labelNATS = "nats_server"
)

// The label sets, made once: a provider call is labelled per payment.
var labelSets = map[string]pprof.LabelSet{
	labelSim: pprof.Labels(labelKey, labelSim), labelNATS: pprof.Labels(labelKey, labelNATS),
}

// labelled runs f with the goroutines it starts labelled as part.
func labelled(ctx context.Context, part string, f func(context.Context)) {
	pprof.Do(ctx, labelSets[part], f)
}

// simCharger runs every provider call under the simulator's label.
type simCharger struct{ consumer.Charger }

func (s simCharger) Charge(ctx context.Context, req provider.ChargeRequest) (out *provider.Outcome, err error) {
	labelled(ctx, labelSim, func(ctx context.Context) { out, err = s.Charger.Charge(ctx, req) })
	return out, err
}

// cpuMeter measures one phase: the process's CPU time, its profile, and
// the CPU time of the Postgres backends serving the bench's pool.
type cpuMeter struct {
	pids    func(context.Context) ([]int, error) // the backends serving the bench's pool
	prof    bytes.Buffer
	file    *os.File // --cpuprofile, or nil
	rusage  time.Duration
	mallocs uint64
	started time.Time
	pgStart map[int]time.Duration
}

// CPU is one phase's CPU time by part, in microseconds per payment.
type CPU struct {
	ProcessUS  float64 // the whole bench process
	Allocs     float64 // heap allocations of the whole process
	WorkerUS   float64 // the process minus the simulator and the NATS server
	SimUS      float64
	NATSUS     float64
	PGUS       float64 // the Postgres backends of the bench's connections; -1 when not measurable
	PGBackends int
}

func startCPU(ctx context.Context, pids func(context.Context) ([]int, error), profilePath string) (*cpuMeter, error) {
	m := &cpuMeter{pids: pids}
	w := &m.prof
	if profilePath != "" {
		f, err := os.Create(profilePath)
		if err != nil {
			return nil, fmt.Errorf("bench: --cpuprofile: %w", err)
		}
		m.file = f
	}
	if err := pprof.StartCPUProfile(w); err != nil {
		if m.file != nil {
			m.file.Close()
		}
		return nil, fmt.Errorf("bench: CPU profile: %w", err)
	}
	m.pgStart = backendCPU(ctx, pids)
	m.rusage, m.mallocs = procstat.CPU(), mallocs()
	m.started = time.Now()
	return m, nil
}

// stop ends the phase and splits its CPU time over payments.
func (m *cpuMeter) stop(ctx context.Context, payments int) (CPU, error) {
	total, allocs := procstat.CPU()-m.rusage, mallocs()-m.mallocs
	pgEnd := backendCPU(ctx, m.pids)
	pprof.StopCPUProfile()
	if m.file != nil {
		_, err := m.file.Write(m.prof.Bytes())
		if cerr := m.file.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return CPU{}, fmt.Errorf("bench: --cpuprofile: %w", err)
		}
	}
	shares, err := labelShares(m.prof.Bytes())
	if err != nil {
		return CPU{}, fmt.Errorf("bench: read the CPU profile: %w", err)
	}
	per := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(payments) }
	c := CPU{ProcessUS: per(total), PGUS: -1, Allocs: float64(allocs) / float64(payments)}
	c.SimUS = c.ProcessUS * shares[labelSim]
	c.NATSUS = c.ProcessUS * shares[labelNATS]
	c.WorkerUS = c.ProcessUS - c.SimUS - c.NATSUS
	if pgEnd != nil {
		var pg time.Duration
		for pid, end := range pgEnd {
			pg += end - m.pgStart[pid] // a backend that started during the phase counts from zero
		}
		c.PGUS, c.PGBackends = per(pg), len(pgEnd)
	}
	return c, nil
}

// labelShares returns each part's share of a CPU profile's samples: by
// the frames of its stack when they are the simulator's or the NATS
// server's packages (a goroutine the server starts from a timer carries no
// label), else by its label.
func labelShares(raw []byte) (map[string]float64, error) {
	p, err := profile.Parse(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	vi := len(p.SampleType) - 1 // cpu nanoseconds
	var total int64
	by := map[string]int64{}
	for _, s := range p.Sample {
		v := s.Value[vi]
		total += v
		if part := stackOwner(s); part != "" {
			by[part] += v
		} else if l := s.Label[labelKey]; len(l) > 0 {
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

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// procCPU reads utime+stime of a postgres process from /proc/<pid>/stat.
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
	f := strings.Fields(s[i+1:])
	if len(f) < 13 { // state is f[0]; utime and stime are fields 14 and 15
		return 0, false
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(ut+st) * time.Second / clockTicks, true
}

// Heap is the live heap at the end of a run by part, in MiB, from a heap
// profile taken after a GC: an allocation is the simulator's or the NATS
// server's when a frame of its stack is in their packages, else the
// worker's (the bench's own bookkeeping included).
type Heap struct {
	WorkerMB, SimMB, NATSMB float64
}

func heapSplit() (Heap, error) {
	runtime.GC()
	var buf bytes.Buffer
	if err := pprof.Lookup("heap").WriteTo(&buf, 0); err != nil {
		return Heap{}, err
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		return Heap{}, err
	}
	vi := -1
	for i, t := range p.SampleType {
		if t.Type == "inuse_space" {
			vi = i
		}
	}
	if vi < 0 {
		return Heap{}, fmt.Errorf("heap profile without inuse_space")
	}
	var h Heap
	for _, s := range p.Sample {
		mb := float64(s.Value[vi]) / (1 << 20)
		switch stackOwner(s) {
		case labelSim:
			h.SimMB += mb
		case labelNATS:
			h.NATSMB += mb
		default:
			h.WorkerMB += mb
		}
	}
	return h, nil
}

// stackOwner names the part whose package has a frame in the sample's
// stack: the worker never calls into the NATS server (its client is
// nats.go) and reaches the simulator only through its client.
func stackOwner(s *profile.Sample) string {
	for _, loc := range s.Location {
		for _, l := range loc.Line {
			if l.Function == nil {
				continue
			}
			switch name := l.Function.Name; {
			case strings.HasPrefix(name, "github.com/paydedup/paydedup/provider/stripesim."):
				return labelSim
			case strings.HasPrefix(name, "github.com/nats-io/nats-server/"):
				return labelNATS
			}
		}
	}
	return ""
}
