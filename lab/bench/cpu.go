package bench

import (
	"context"
	"fmt"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/lab/cpusplit"
	"github.com/paydedup/paydedup/provider"
)

// How the bench splits its own process's CPU time between the worker and
// the lab parts that share the process (see lab/cpusplit): the
// embedded NATS server and the simulator run under pprof labels (a
// simulator call runs in the worker's goroutine, inside pprof.Do), or are
// told by their packages' frames. What is neither is the worker's, the
// runtime's background GC included: an upper bound.
const (
	labelSim  = "simulator"
	labelNATS = "nats_server"
)

var parts = cpusplit.New(
	cpusplit.Part{Name: labelSim, Packages: []string{"github.com/paydedup/paydedup/lab/stripesim."}},
	cpusplit.Part{Name: labelNATS, Packages: []string{"github.com/nats-io/nats-server/"}},
)

// labelled runs f with the goroutines it starts labelled as part.
func labelled(ctx context.Context, part string, f func(context.Context)) {
	parts.Do(ctx, part, f)
}

// simCharger runs every provider call under the simulator's label.
type simCharger struct{ consumer.Charger }

func (s simCharger) Charge(ctx context.Context, req provider.ChargeRequest) (out *provider.Outcome, err error) {
	labelled(ctx, labelSim, func(ctx context.Context) { out, err = s.Charger.Charge(ctx, req) })
	return out, err
}

// cpuMeter measures one phase (cpusplit.Meter).
type cpuMeter struct{ m *cpusplit.Meter }

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
	m, err := parts.Start(ctx, pids, profilePath)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	return &cpuMeter{m}, nil
}

// stop ends the phase and splits its CPU time over payments.
func (m *cpuMeter) stop(ctx context.Context, payments int) (CPU, error) {
	p, err := m.m.Stop(ctx, payments)
	if err != nil {
		return CPU{}, fmt.Errorf("bench: %w", err)
	}
	return CPU{ProcessUS: p.ProcessUS, Allocs: p.Allocs, WorkerUS: p.RestUS, SimUS: p.Parts[labelSim],
		NATSUS: p.Parts[labelNATS], PGUS: p.PGUS, PGBackends: p.PGBackends}, nil
}

// Heap is the live heap at the end of a run by part, in MiB: an
// allocation is the simulator's or the NATS server's when a frame of its
// stack is in their packages, else the worker's (the bench's own
// bookkeeping included).
type Heap struct {
	WorkerMB, SimMB, NATSMB float64
}

func heapSplit() (Heap, error) {
	h, err := parts.Heap()
	if err != nil {
		return Heap{}, err
	}
	return Heap{WorkerMB: h[""], SimMB: h[labelSim], NATSMB: h[labelNATS]}, nil
}

// pgFigure is a Postgres CPU figure, or why there is none.
func pgFigure(us float64) string { return cpusplit.PGFigure(us) }
