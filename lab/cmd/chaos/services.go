package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/paydedup/paydedup/lab/localpg"
)

// waitFor polls cond every 100 ms until it holds, ctx ends or d passes.
func waitFor(ctx context.Context, d time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s", d, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

func tcpUp(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// initPostgres creates and starts the run's own Postgres cluster in the
// work directory.
func (h *harness) initPostgres(ctx context.Context) error {
	if h.cfg.pgFailover > 0 {
		return h.initFailover(ctx)
	}
	c, err := localpg.InitCluster(ctx, localpg.ClusterConfig{
		Bin: h.cfg.pgBin, Dir: filepath.Join(h.work, "pg"), Log: filepath.Join(h.logs, "postgres.log"),
		Settings: localpg.FastSettings,
	})
	if err != nil {
		return err
	}
	h.pg = c
	return h.pg.Start(ctx)
}

// initNATS prepares the NATS server process with its own store directory.
func (h *harness) initNATS(ctx context.Context) error {
	if h.cfg.natsCluster > 0 {
		return h.initNATSCluster(ctx, h.cfg.natsCluster)
	}
	port, err := localpg.FreePort()
	if err != nil {
		return err
	}
	store := filepath.Join(h.work, "nats")
	if err := os.Mkdir(store, 0o755); err != nil {
		return err
	}
	h.natsAddr = fmt.Sprintf("127.0.0.1:%d", port)
	h.nats = h.procs.add(&proc{
		name: "nats-server", path: h.cfg.natsServer, env: []string{"PATH=/usr/bin:/bin"},
		log:  filepath.Join(h.logs, "nats-server.log"),
		args: []string{"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", store},
	})
	return h.startNATS(ctx)
}

func (h *harness) startNATS(ctx context.Context) error {
	if err := h.nats.start(); err != nil {
		return err
	}
	return waitFor(ctx, 30*time.Second, "nats-server to listen", func() bool {
		select {
		case <-h.nats.exited():
			return true // reported below
		default:
		}
		return tcpUp(h.natsAddr)
	})
}

// startSim starts the provider simulator process with the faults of the
// run and waits for its ledger to answer.
func (h *harness) startSim(ctx context.Context) error {
	port, err := localpg.FreePort()
	if err != nil {
		return err
	}
	h.simAddr = fmt.Sprintf("127.0.0.1:%d", port)
	f := h.cfg
	h.sim = h.procs.add(&proc{
		name: "provider-sim", path: h.bin, env: []string{"PAYDEDUP_LOG_LEVEL=warn"},
		log: filepath.Join(h.logs, "provider-sim.log"),
		args: []string{"provider-sim", "--addr", h.simAddr,
			"--rate-5xx", fmt.Sprint(f.rate5xx), "--rate-429", fmt.Sprint(f.rate429),
			"--drop-after-charge", fmt.Sprint(f.dropAfterCharge), "--latency", f.latency.String(),
			"--jitter", f.jitter.String(), "--seed", strconv.FormatUint(f.seed, 10)},
	})
	h.sim.args = append(h.sim.args, f.simModelArgs()...)
	return h.startSimProc(ctx)
}

// startSimProc starts (or starts again, with an empty ledger) the
// simulator process and waits for its ledger to answer.
func (h *harness) startSimProc(ctx context.Context) error {
	if err := h.sim.start(); err != nil {
		return err
	}
	return waitFor(ctx, 30*time.Second, "the simulator's ledger", func() bool {
		resp, err := http.Get("http://" + h.simAddr + "/_sim/ledger")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// workerEnv is the environment of every worker (and of the reconcile and
// dlq commands the harness runs): short timeouts that still nest,
// provider-timeout × tries + backoff < lease < ack wait.
func (h *harness) workerEnv() []string {
	return append([]string{
		"PATH=/usr/bin:/bin",
		"DATABASE_URL=" + h.viaProxy(h.dbURL("paydedup_worker", "paydedup")),
		"NATS_URL=" + h.viaProxy(h.natsURL()),
		"PAYDEDUP_STREAM_REPLICAS=" + strconv.Itoa(h.replicas()),
		"PAYDEDUP_PROVIDER=stripe",
		"STRIPE_SECRET_KEY=sk_test_x",
		"STRIPE_API_BASE=" + h.viaProxy("http://"+h.providerAddr()),
		"PAYDEDUP_LEASE=" + h.cfg.lease.String(),
		"PAYDEDUP_ACK_WAIT=" + h.cfg.ackWait.String(),
		"PAYDEDUP_PROVIDER_TIMEOUT=" + h.cfg.providerTimeout.String(),
		"PAYDEDUP_PROVIDER_TRIES=2",
		"PAYDEDUP_MAX_DELIVER=" + strconv.Itoa(h.cfg.maxDeliver),
		"PAYDEDUP_CONCURRENCY=32",
		"PAYDEDUP_FETCH_BATCH=50",
		"PAYDEDUP_DRAIN_TIMEOUT=2s",
		"PAYDEDUP_LOG_LEVEL=warn",
		"PAYDEDUP_DLQ_KEY=" + h.dlqKey,
		// A stuck row whose lookup failed (the simulator's 429s and 5xx,
		// a network fault) is looked up again within seconds, not the
		// production minute, so a run settles before its deadline.
		"PAYDEDUP_LOOKUP_BACKOFF=1s",
		"PAYDEDUP_LOOKUP_BACKOFF_MAX=5s",
	}, h.cfg.providerRateEnv()...)
}

// slot is one worker position: a supervisor keeps a worker process running
// in it, and the killer SIGKILLs whatever process it holds.
type slot struct {
	proc     *proc
	restarts int
	paused   atomic.Bool // SIGSTOPped by the pause mode: not killed meanwhile
}

// superviseWorker keeps slot i running until ctx ends: a worker that dies
// (killed, or failing to start while NATS or Postgres is down) is started
// again after a short pause.
func (h *harness) superviseWorker(ctx context.Context, s *slot) {
	for ctx.Err() == nil {
		if err := s.proc.start(); err != nil {
			h.logf("worker %s: %v", s.proc.name, err)
		} else {
			select {
			case <-ctx.Done():
				return
			case <-s.proc.exited():
			}
			s.restarts++
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(300 * time.Millisecond):
		}
	}
}
