package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/workload"
	"github.com/paydedup/paydedup/stream"
)

// The scale mode (-scale 1,2,4,8): for each count, that many worker
// processes on the one durable consumer drain a backlog of
// -scale-payments payments (no faults, the simulator at -latency, 20 ms by
// default in this mode, no jitter or errors). Each run starts from empty
// streams, tables and ledger and is verified as a chaos run is (no double,
// no lost, no stuck). Throughput is the payments over the time from the
// first claim to the last completion (so process start-up is left out);
// p50/p99 are claim-to-completion times of a payment (the key row's
// created_at to completed_at: the claim, the provider call and the group
// commit); redelivered is the consumer's redelivered count, the sign of a
// lease or nak storm.

// parseScale reads "1,2,4,8".
func parseScale(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 64 {
			return nil, fmt.Errorf("-scale: %q is not a worker count from 1 to 64", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// scaleDefaults: the simulator at 20 ms and without faults, unless the
// flags say otherwise.
func (c *config) scaleDefaults() {
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["latency"] {
		c.latency = 20 * time.Millisecond
	}
	for name, v := range map[string]*float64{"rate-5xx": &c.rate5xx, "rate-429": &c.rate429, "drop-after-charge": &c.dropAfterCharge} {
		if !set[name] {
			*v = 0
		}
	}
	if !set["jitter"] {
		c.jitter = 0
	}
}

// scaleResult is one worker count's figures.
type scaleResult struct {
	workers                    int
	seconds, throughput        float64
	p50, p99                   time.Duration
	redelivered                int
	double, lost, stuck, other int
}

// runScale is the whole scale mode; it returns the exit status.
func (h *harness) runScale(ctx context.Context) int {
	if err := h.setupServices(ctx); err != nil {
		h.logf("aborted: %v", err)
		return 2
	}
	var results []scaleResult
	failed := false
	for i, n := range h.cfg.scale {
		r, err := h.scaleRun(ctx, i, n)
		if err != nil {
			h.logf("aborted: %v", err)
			return 2
		}
		results = append(results, r)
		if r.double+r.lost+r.stuck+r.other > 0 {
			failed = true
		}
		fmt.Fprintf(h.out, "chaos: scale workers=%d payments=%d seconds=%.1f throughput=%.0f/s p50=%dms p99=%dms redelivered=%d double=%d lost=%d stuck=%d\n",
			n, h.cfg.scalePayments, r.seconds, r.throughput, r.p50.Milliseconds(), r.p99.Milliseconds(), r.redelivered, r.double, r.lost, r.stuck)
	}
	var parts []string
	for _, r := range results {
		parts = append(parts, fmt.Sprintf("%d:%.0f/s,p99=%dms", r.workers, r.throughput, r.p99.Milliseconds()))
	}
	fmt.Fprintf(h.out, "chaos: scale latency=%v payments=%d %s ok=%v\n", h.cfg.latency, h.cfg.scalePayments, strings.Join(parts, " "), !failed)
	if failed {
		return 1
	}
	return 0
}

// setupServices builds the binary and starts Postgres, NATS and the
// simulator, as execute does before its workload.
func (h *harness) setupServices(ctx context.Context) error {
	for _, step := range []func(context.Context) error{h.build, h.initPostgres, h.migrate, h.initNATS, h.startSim, h.connectNATS} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// scaleRun resets the streams, tables and ledger, publishes the backlog,
// runs n workers until every payment is settled, and measures.
func (h *harness) scaleRun(ctx context.Context, round, n int) (scaleResult, error) {
	r := scaleResult{workers: n}
	if err := h.resetState(ctx); err != nil {
		return r, err
	}
	w := workload.Generate(workload.MixConfig{Payments: h.cfg.scalePayments, Seed: h.cfg.seed + uint64(round),
		Run: fmt.Sprintf("s%d-%x", n, h.cfg.seed&0xffff), Subject: stream.DefaultSubjectPrefix})
	if err := h.publishFast(ctx, w.Publishes); err != nil {
		return r, err
	}
	var workers []*proc
	for i := range n {
		p := h.procs.add(&proc{name: fmt.Sprintf("scale%d-worker-%d", n, i), path: h.bin, args: []string{"worker"},
			env: h.workerEnv(), log: filepath.Join(h.logs, fmt.Sprintf("scale%d-worker-%d.log", n, i))})
		if err := p.start(); err != nil {
			return r, err
		}
		workers = append(workers, p)
	}
	defer func() {
		for _, p := range workers {
			p.kill()
		}
	}()
	pool, err := pg.Connect(ctx, h.dbURL("postgres", "paydedup"))
	if err != nil {
		return r, err
	}
	defer pool.Close()
	h.logf("scale: %d workers draining %d payments", n, len(w.Payments))
	err = waitFor(ctx, h.cfg.quiesce, "the backlog to drain", func() bool {
		var done int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE status <> 'pending'`).Scan(&done); err != nil {
			return false
		}
		return done >= len(w.Payments)
	})
	if err != nil {
		h.logf("scale: %v", err)
	}
	var span, p50, p99 float64
	if err := pool.QueryRow(ctx, `SELECT extract(epoch FROM max(completed_at) - min(created_at)),
			percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - created_at)),
			percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - created_at))
		FROM idempotency_keys WHERE completed_at IS NOT NULL`).Scan(&span, &p50, &p99); err != nil {
		return r, fmt.Errorf("measure: %w", err)
	}
	r.seconds, r.p50, r.p99 = span, time.Duration(p50*float64(time.Second)), time.Duration(p99*float64(time.Second))
	if span > 0 {
		r.throughput = float64(len(w.Payments)) / span
	}
	// Deliveries beyond one per message: redeliveries after a lost lease,
	// a nak or an AckWait.
	if c, err := h.js.Consumer(ctx, stream.DefaultStream, stream.DefaultDurable); err == nil {
		if info, err := c.Info(ctx); err == nil {
			r.redelivered = int(info.Delivered.Consumer) - len(w.Publishes)
		}
	}
	ev, err := h.collect(ctx)
	if err != nil {
		return r, err
	}
	v := workload.Verify(w, ev)
	for _, d := range v.Double {
		h.logf("scale: VIOLATION double: %s", d)
	}
	for _, l := range v.Lost {
		h.logf("scale: VIOLATION lost: %s", l)
	}
	for _, s := range v.Stuck {
		h.logf("scale: VIOLATION stuck: %s", s)
	}
	for _, s := range v.Inconsistent {
		h.logf("scale: VIOLATION inconsistent: %s", s)
	}
	r.double, r.lost, r.stuck, r.other = len(v.Double), len(v.Lost), len(v.Stuck), len(v.Inconsistent)
	return r, nil
}

// resetState empties the streams (deleted and created again), the tables
// and the simulator's ledger (a fresh process), so each run starts alike.
func (h *harness) resetState(ctx context.Context) error {
	cfg := h.streamConfig().Stream
	for _, name := range []string{cfg.Name, cfg.DLQStream, cfg.AdvisoryStream} {
		if err := h.js.DeleteStream(ctx, name); err != nil && !isNotFound(err) {
			return fmt.Errorf("delete stream %s: %w", name, err)
		}
	}
	if _, _, err := stream.EnsureStreams(ctx, h.js, cfg); err != nil {
		return err
	}
	pool, err := pg.Connect(ctx, h.dbURL("postgres", "paydedup"))
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `TRUNCATE idempotency_keys, payments`)
	pool.Close()
	if err != nil {
		return fmt.Errorf("truncate: %w", err)
	}
	h.sim.kill()
	return h.startSimProc(ctx)
}

func isNotFound(err error) bool {
	return err != nil && (errors.Is(err, nats.ErrStreamNotFound) || strings.Contains(err.Error(), "not found"))
}

// publishFast publishes pubs with the asynchronous publisher (a window of
// PubAcks in flight), every one PubAcked or an error.
func (h *harness) publishFast(ctx context.Context, pubs []workload.Publish) error {
	pub, err := stream.NewPublisher(h.nc, stream.PublisherConfig{})
	if err != nil {
		return err
	}
	for _, p := range pubs {
		m := nats.NewMsg(p.Subject)
		for k, v := range p.Header {
			m.Header.Set(k, v)
		}
		m.Data = p.Body
		if err := pub.Publish(ctx, m); err != nil {
			pub.Close()
			return err
		}
	}
	st := pub.Close()
	h.published.Add(int64(st.Stored))
	if st.Failed > 0 {
		return fmt.Errorf("publish: %d of %d messages got no PubAck", st.Failed, st.Sent)
	}
	return nil
}
