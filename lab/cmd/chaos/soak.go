package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/localpg"
	"github.com/paydedup/paydedup/lab/workload"
	"github.com/paydedup/paydedup/stream"
)

// The soak mode (-soak 30m, make soak): a steady load of -soak-rate
// payments a second (10 % duplicates, 5 % declines) for the whole duration,
// with one fault every -soak-fault-every, in turn: a worker SIGKILLed, NATS
// killed -9 and restarted, Postgres stopped in immediate mode and
// restarted. Worker 0 is never killed by the soak: its resident memory,
// goroutines and open file descriptors (from its /metrics), with the
// database's connections and the pending rows, are sampled every
// -soak-sample and must stay flat: the median of the last third of the
// samples at most 1.5 times that of the first third plus a small slack.
// Then the run settles and is verified like a chaos run; the last line
// summarises the figures, first third → last third.

// soakSample is one reading; NaN where a figure could not be read.
type soakSample struct {
	rss, goroutines, fds, pgConns, pending float64
}

// soakGauges name the figures, for the summary and the flatness check,
// with the slack an increase may have without counting as growth.
var soakGauges = []struct {
	name  string
	get   func(soakSample) float64
	slack float64
}{
	{"rss_mb", func(s soakSample) float64 { return s.rss / (1 << 20) }, 16},
	{"goroutines", func(s soakSample) float64 { return s.goroutines }, 50},
	{"open_fds", func(s soakSample) float64 { return s.fds }, 16},
	{"pg_conns", func(s soakSample) float64 { return s.pgConns }, 8},
	{"pending", func(s soakSample) float64 { return s.pending }, 200},
}

// runSoak is the whole soak mode; it returns the exit status.
func (h *harness) runSoak(ctx context.Context) int {
	if err := h.setupServices(ctx); err != nil {
		h.logf("aborted: %v", err)
		return 2
	}
	d := h.cfg.soak
	w := workload.Generate(workload.MixConfig{
		Payments: max(1, int(d.Seconds()*h.cfg.soakRate)), Seed: h.cfg.seed, Run: fmt.Sprintf("k%x", h.cfg.seed&0xffffff),
		Subject: stream.DefaultSubjectPrefix, DuplicateRate: 0.1, DeclineRate: 0.05,
	})
	h.cfg.payments = len(w.Payments) // for the chaos summary line
	h.logf("soak: %v at %.0f payments/s (%d payments, %d publishes), a fault every %v", d, h.cfg.soakRate, len(w.Payments), len(w.Publishes), h.cfg.soakFaultEvery)
	adminAddr := ""
	workCtx, stopWorkers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopWorkers()
	for i := range h.cfg.workers {
		env := h.workerEnv()
		if i == 0 {
			port, err := localpg.FreePort()
			if err != nil {
				h.logf("aborted: %v", err)
				return 2
			}
			adminAddr = fmt.Sprintf("127.0.0.1:%d", port)
			env = append(env, "PAYDEDUP_ADMIN_ADDR="+adminAddr)
		}
		s := &slot{proc: h.procs.add(&proc{name: fmt.Sprintf("worker-%d", i), path: h.bin, args: []string{"worker"}, env: env,
			log: filepath.Join(h.logs, fmt.Sprintf("worker-%d.log", i))})}
		h.slots = append(h.slots, s)
		wg.Add(1)
		go func() { defer wg.Done(); h.superviseWorker(workCtx, s) }()
	}

	pool, err := pg.Connect(ctx, h.dbURL("postgres", "paydedup"))
	if err != nil {
		h.logf("aborted: %v", err)
		return 2
	}
	defer pool.Close()
	phase, stopPhase := context.WithTimeout(ctx, d)
	defer stopPhase()
	pubDone := make(chan error, 1)
	go func() { pubDone <- h.publishAll(ctx, w.Publishes, d) }()
	faultsDone := make(chan struct{})
	go func() { defer close(faultsDone); h.soakFaults(phase) }()

	var samples []soakSample
	tick := time.NewTicker(h.cfg.soakSample)
	for phase.Err() == nil {
		select {
		case <-phase.Done():
		case <-tick.C:
			s := h.soakRead(phase, adminAddr, func(ctx context.Context) (conns, pending float64, err error) {
				err = pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = 'paydedup' AND pid <> pg_backend_pid()),
					(SELECT count(*) FROM idempotency_keys WHERE status = 'pending')`).Scan(&conns, &pending)
				return conns, pending, err
			})
			samples = append(samples, s)
			h.logf("soak: worker-0 rss %.0f MB, %.0f goroutines, %.0f fds; %.0f database connections; %.0f pending rows; %d published",
				s.rss/(1<<20), s.goroutines, s.fds, s.pgConns, s.pending, h.published.Load())
		}
	}
	tick.Stop()
	if err := <-pubDone; err != nil {
		h.logf("aborted: publish: %v", err)
		return 2
	}
	<-faultsDone
	if ctx.Err() != nil {
		return 130
	}
	h.logf("soak over: %d worker kills, %d NATS restarts, %d Postgres restarts", h.kills.Load(), h.natsRestarts.Load(), h.pgRestarts.Load())
	replayed, err := h.settle(ctx)
	if err != nil {
		h.logf("aborted: %v", err)
		return 2
	}
	ev, err := h.collect(ctx)
	if err != nil {
		h.logf("aborted: %v", err)
		return 2
	}
	ev.Replayed = replayed
	v := workload.Verify(w, ev)
	findings, err := h.audit(ctx)
	if err != nil {
		h.logf("aborted: %v", err)
		return 2
	}
	for _, f := range findings {
		v.Inconsistent = append(v.Inconsistent, fmt.Sprintf("audit %s %s:%s: %s", f.Kind, f.MerchantID, f.IdempotencyKey, f.Detail))
	}
	code := h.report(v)
	line, flat := soakSummary(samples)
	fmt.Fprintf(h.out, "chaos: soak minutes=%.1f samples=%d worker0_restarts=%d %s flat=%v\n", d.Minutes(), len(samples), h.slots[0].restarts, line, flat)
	if code == 0 && !flat {
		code = 1
	}
	return code
}

// soakFaults runs one fault every soakFaultEvery, in turn a worker kill
// (never worker 0), a NATS restart and a Postgres restart.
func (h *harness) soakFaults(ctx context.Context) {
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(h.cfg.soakFaultEvery):
		}
		var err error
		switch i % 3 {
		case 0:
			if len(h.slots) > 1 {
				s := h.slots[1+i/3%(len(h.slots)-1)]
				h.logf("soak: SIGKILL %s", s.proc.name)
				s.proc.kill()
				h.kills.Add(1)
			}
		case 1:
			err = h.restartNATS(context.WithoutCancel(ctx))
		case 2:
			err = h.restartPostgres(context.WithoutCancel(ctx))
		}
		if err != nil {
			h.logf("soak: fault: %v", err)
		}
	}
}

// soakRead takes one sample; a figure that cannot be read (worker 0
// restarting, Postgres down) is NaN, which the medians leave out.
// count reads the database's connections (the querying one left out)
// and the pending rows.
func (h *harness) soakRead(ctx context.Context, adminAddr string, count func(context.Context) (conns, pending float64, err error)) soakSample {
	nan := math.NaN()
	s := soakSample{nan, nan, nan, nan, nan}
	if m, err := scrapeMetrics(ctx, "http://"+adminAddr+"/metrics"); err == nil {
		s.rss, s.goroutines, s.fds = m["process_resident_memory_bytes"], m["go_goroutines"], m["process_open_fds"]
	}
	qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if conns, pending, err := count(qctx); err == nil {
		s.pgConns, s.pending = conns, pending
	}
	return s
}

// scrapeMetrics reads the gauges of a Prometheus text page (the first
// sample of each family).
func scrapeMetrics(ctx context.Context, url string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	out := map[string]float64{}
	for name, f := range families {
		if ms := f.GetMetric(); len(ms) > 0 && ms[0].GetGauge() != nil {
			out[name] = ms[0].GetGauge().GetValue()
		}
	}
	return out, nil
}

// soakSummary compares the median of the first third of the samples with
// that of the last third, per figure; NaNs (unreadable) are left out.
func soakSummary(samples []soakSample) (string, bool) {
	third := max(1, len(samples)/3)
	median := func(part []soakSample, get func(soakSample) float64) float64 {
		var vs []float64
		for _, s := range part {
			if v := get(s); !math.IsNaN(v) {
				vs = append(vs, v)
			}
		}
		if len(vs) == 0 {
			return math.NaN()
		}
		slices.Sort(vs)
		return vs[len(vs)/2]
	}
	flat := len(samples) >= 3
	var parts []string
	for _, g := range soakGauges {
		first := median(samples[:min(third, len(samples))], g.get)
		last := median(samples[max(0, len(samples)-third):], g.get)
		if math.IsNaN(first) || math.IsNaN(last) || last > first*1.5+g.slack {
			flat = false
		}
		parts = append(parts, fmt.Sprintf("%s=%.0f->%.0f", g.name, first, last))
	}
	return strings.Join(parts, " "), flat
}
