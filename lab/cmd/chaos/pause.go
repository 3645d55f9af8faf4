package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/paydedup/paydedup/internal/pg"
)

// The pause mode (-pauses N): a worker is stopped (SIGSTOP, as a GC pause
// or a frozen VM) while it holds claims, for longer than its lease and the
// stream's AckWait, so another worker takes its messages over; then it is
// continued (SIGCONT). Its late completions must be fenced out by the
// lease (the worker logs "lease lost"), and a provider call it resends is
// answered by the provider's idempotent replay: the ledger check at the
// end proves no key was charged twice.
type pauseStats struct {
	pauses atomic.Int64 // workers stopped and continued
	claims atomic.Int64 // pending rows the stopped workers held when stopped
	taken  atomic.Int64 // of those, rows another worker had taken over or settled when it woke
	late   atomic.Int64 // of those, keys the continued worker logged about after waking (late calls, refused writes)
	fenced atomic.Int64 // "lease lost" lines the continued workers logged
}

// pid is the process id of the running process, 0 if none.
func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	select {
	case <-p.done:
		return 0
	default:
	}
	return p.cmd.Process.Pid
}

// pauses stops and continues a worker cfg.pauses times, spread over the
// first 60 % of the fault phase. A pause in progress is finished (the
// worker continued) even when ctx ends.
func (h *harness) pauses(ctx context.Context) {
	if h.cfg.pauses == 0 {
		return
	}
	pool, err := pg.Connect(ctx, h.dbURL("postgres", "paydedup"))
	if err != nil {
		h.logf("pause: %v", err)
		return
	}
	defer pool.Close()
	// heldKeys lists the pending rows locked by the worker with this pid
	// (the default holder id is host-pid-suffix), as merchant:key.
	heldKeys := func(ctx context.Context, pid int) ([]string, error) {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		rows, err := pool.Query(ctx, `SELECT merchant_id || ':' || idempotency_key FROM idempotency_keys
			WHERE status = 'pending' AND locked_by LIKE $1`, fmt.Sprintf("%%-%d-%%", pid))
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var keys []string
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				return nil, err
			}
			keys = append(keys, k)
		}
		return keys, rows.Err()
	}
	start := time.Now()
	for k := range h.cfg.pauses {
		at := h.cfg.duration * 60 / 100 * time.Duration(2*k+1) / time.Duration(2*h.cfg.pauses)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(start.Add(at))):
		}
		h.pauseOne(ctx, heldKeys)
	}
}

// pauseOne stops the worker that holds the most claims (trying again for a
// few seconds while none holds any), waits cfg.pauseFor and continues it.
func (h *harness) pauseOne(ctx context.Context, heldKeys func(context.Context, int) ([]string, error)) {
	for try := 0; try < 20 && ctx.Err() == nil; try++ {
		var best *slot
		bestPid, bestN := 0, 0
		for _, s := range h.slots {
			pid := s.proc.pid()
			if pid == 0 {
				continue
			}
			keys, err := heldKeys(ctx, pid)
			if n := len(keys); err == nil && n > bestN {
				best, bestPid, bestN = s, pid, n
			}
		}
		if best == nil {
			time.Sleep(250 * time.Millisecond)
			continue
		}
		best.paused.Store(true)
		if err := syscall.Kill(bestPid, syscall.SIGSTOP); err != nil {
			best.paused.Store(false)
			continue
		}
		keys, _ := heldKeys(context.WithoutCancel(ctx), bestPid)
		held := len(keys)
		logSize := fileSize(best.proc.log)
		h.logf("pause: SIGSTOP %s (pid %d) holding %d claims, for %v (lease %v, AckWait %v)", best.proc.name, bestPid, held, h.cfg.pauseFor, h.cfg.lease, h.cfg.ackWait)
		time.Sleep(h.cfg.pauseFor) // not cut short: the point is to outlive the lease
		still, _ := heldKeys(context.WithoutCancel(ctx), bestPid)
		taken := 0
		for _, k := range keys {
			if !slices.Contains(still, k) {
				taken++
			}
		}
		h.pauseStats.taken.Add(int64(taken))
		_ = syscall.Kill(bestPid, syscall.SIGCONT)
		h.pauseStats.pauses.Add(1)
		h.pauseStats.claims.Add(int64(held))
		// Its late writes happen within a heartbeat or a provider timeout
		// of waking; the killer leaves it alone meanwhile.
		time.Sleep(h.cfg.lease)
		best.paused.Store(false)
		late := lateKeys(best.proc.log, logSize, keys)
		h.pauseStats.late.Add(int64(late))
		fenced := countSince(best.proc.log, logSize, "lease lost")
		h.pauseStats.fenced.Add(int64(fenced))
		h.logf("pause: SIGCONT %s: %d of its %d claims taken over or settled by others while it slept; on waking it logged about %d of them (a late call or commit given up or refused) and %d lost leases",
			best.proc.name, taken, held, late, fenced)
		return
	}
	h.logf("pause: no worker held a claim; no pause this time")
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// lateKeys counts the keys (merchant:key) that the file's lines after
// offset name.
func lateKeys(path string, offset int64, keys []string) int {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < offset {
		return 0
	}
	tail, n := string(b[offset:]), 0
	for _, k := range keys {
		if _, key, ok := strings.Cut(k, ":"); ok && strings.Contains(tail, `"idempotency_key":"`+key+`"`) {
			n++
		}
	}
	return n
}

// countSince counts the lines of the file after offset that contain s.
func countSince(path string, offset int64, s string) int {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < offset {
		return 0
	}
	return strings.Count(string(b[offset:]), s)
}

func (h *harness) pauseSummary() string {
	if h.cfg.pauses == 0 {
		return ""
	}
	return fmt.Sprintf(" pauses=%d paused_claims=%d taken_over=%d late_keys=%d late_lease_lost=%d", h.pauseStats.pauses.Load(), h.pauseStats.claims.Load(),
		h.pauseStats.taken.Load(), h.pauseStats.late.Load(), h.pauseStats.fenced.Load())
}
