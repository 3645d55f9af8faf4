package shipbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/lab/localpg"
	"github.com/paydedup/paydedup/lab/procstat"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// The provider bench: the shipped worker against the provider as it really
// is (latency with a tail, an account rate limit, a concurrency limit),
// the simulator's Model served by `paydedup provider-sim` in its own
// process, the worker calling it through the Stripe adapter. It reports
// what production sees: payments/s, calls in flight, publish→charged
// beside the provider's own latency, each worker's peak RSS, the share of
// requests answered 429, the workers' pauses and dead letters.

// Provider bench defaults: Stripe's few hundred milliseconds (issue 53).
const (
	DefaultProviderPayments      = 3000
	DefaultProviderLatencyMedian = 300 * time.Millisecond
	DefaultProviderLatencyP99    = 900 * time.Millisecond
	DefaultMerchantBPayments     = 100
	DefaultMerchantBAfter        = 2 * time.Second
)

// The fairness scenario's merchants.
const (
	MerchantA = "m_a"
	MerchantB = "m_b"
)

// pausedLine is what the worker logs when it stops fetching
// (consumer/worker.go): the bench counts its lines.
const pausedLine = "worker paused"

// ProviderConfig is one run of bench provider.
type ProviderConfig struct {
	Setup
	// Payments distinct payments are published, spread over Merchants
	// merchants (m_bench_0 …), at PublishRate payments/s (0: all at once,
	// a backlog), once the workers are ready.
	Payments    int
	Merchants   int
	PublishRate float64
	// Workers `paydedup worker` processes drain them, each with its
	// defaults and WorkerEnv.
	Workers   int
	WorkerEnv []string
	// Model is provider-sim's latency and limits.
	Model stripesim.Model
	// The fairness scenario, when BacklogA > 0 (Payments and Merchants
	// are then unused): merchant A's BacklogA payments are published at
	// once, then, BAfter later, merchant B's PaymentsB (at PublishRate,
	// 0: at once).
	BacklogA  int
	PaymentsB int
	BAfter    time.Duration
	// Warmup, when positive, also reports publish→charged over the
	// payments published Warmup or more after the first: a worker's call
	// limit starts low and grows (slow start), which the first seconds of
	// a run pay for once per process start.
	Warmup time.Duration
}

// fairness reports whether the run is the A/B scenario.
func (c ProviderConfig) fairness() bool { return c.BacklogA > 0 }

// Validate names the first bad setting.
func (c ProviderConfig) Validate() error {
	switch {
	case c.fairness() && c.PaymentsB < 1:
		return fmt.Errorf("--merchant-b-payments must be at least 1, got %d", c.PaymentsB)
	case c.fairness() && c.BAfter < 0:
		return fmt.Errorf("--merchant-b-after must not be negative, got %s", c.BAfter)
	case c.BacklogA < 0:
		return fmt.Errorf("--merchant-a-backlog must not be negative, got %d", c.BacklogA)
	case !c.fairness() && c.Payments < 1:
		return fmt.Errorf("--payments must be at least 1, got %d", c.Payments)
	case !c.fairness() && c.Merchants < 1:
		return fmt.Errorf("--merchants must be at least 1, got %d", c.Merchants)
	case c.Workers < 1:
		return fmt.Errorf("--workers must be at least 1, got %d", c.Workers)
	case math.IsNaN(c.PublishRate) || math.IsInf(c.PublishRate, 0) || c.PublishRate < 0:
		return fmt.Errorf("--publish-rate must be a non-negative number of payments per second, got %v", c.PublishRate)
	case c.Provider != ProviderStripe && c.Provider != ProviderStripeTLS:
		return fmt.Errorf("--provider must be %s or %s (the adapter calling provider-sim in its own process), got %q", ProviderStripe, ProviderStripeTLS, c.Provider)
	case c.Timeout <= 0:
		return fmt.Errorf("--timeout must be positive, got %s", c.Timeout)
	case c.Warmup < 0:
		return fmt.Errorf("--warmup must not be negative, got %s", c.Warmup)
	}
	if err := c.Model.Validate(); err != nil {
		return fmt.Errorf("the provider model: %w", err)
	}
	return validWorkerEnv(c.WorkerEnv)
}

// ProviderResult is one run's figures.
type ProviderResult struct {
	Mode      string          `json:"mode"`
	Provider  string          `json:"provider"`
	Workers   int             `json:"workers"`
	WorkerEnv []string        `json:"worker_env,omitempty"`
	Model     stripesim.Model `json:"model"`
	Payments  int             `json:"payments"`
	Merchants int             `json:"merchants"`
	// PublishRate is the publishing pace asked for (0: all at once).
	PublishRate float64 `json:"publish_rate"`
	// Seconds is from the first publish to the last completion.
	Seconds        float64 `json:"seconds"`
	PaymentsPerSec float64 `json:"payments_per_sec"`
	// Calls in flight at provider-sim (let through its limits) over the
	// run: mean (its in-flight seconds over Seconds) and peak.
	InFlightMean float64 `json:"in_flight_mean"`
	InFlightPeak int     `json:"in_flight_peak"`
	// Publish→charged: from the publish of a payment (its batch's send) to
	// its key's completion in PostgreSQL.
	PublishToChargedP50MS float64 `json:"publish_to_charged_p50_ms"`
	PublishToChargedP99MS float64 `json:"publish_to_charged_p99_ms"`
	PublishToChargedMaxMS float64 `json:"publish_to_charged_max_ms"`
	// The provider's own latency (what provider-sim slept, requests let
	// through), and the p99 overhead above it: publish→charged p99 less
	// the provider's p99.
	ProviderP50MS float64 `json:"provider_p50_ms"`
	ProviderP99MS float64 `json:"provider_p99_ms"`
	OverheadP99MS float64 `json:"overhead_p99_ms"`
	// After the warm-up (Warmup > 0, nil otherwise): the same over the
	// payments published WarmupMS or more after the first.
	Steady *SteadyResult `json:"steady,omitempty"`
	// WorkerRSSMB is each worker's peak RSS (VmHWM), MiB.
	WorkerRSSMB []float64 `json:"worker_rss_mb"`
	// Requests provider-sim received over the run, by endpoint kind, and
	// those answered 429, by reason; Share429 is Answered429 / Requests.
	Requests       int64            `json:"requests"`
	RequestsByKind map[string]int64 `json:"requests_by_kind"`
	Answered429    int64            `json:"answered_429"`
	RateLimited    map[string]int64 `json:"rate_limited"`
	Share429       float64          `json:"share_429"`
	// Pauses counts the workers' "worker paused" log lines (all, and
	// per worker).
	Pauses          int   `json:"pauses"`
	PausesPerWorker []int `json:"pauses_per_worker"`
	// DeadLetters is how many messages the dead-letter stream holds.
	DeadLetters int `json:"dead_letters"`
	// Against provider-sim's ledger: payments charged once, more than
	// once, never, and charges of keys the run did not publish.
	ChargedOnce   int `json:"charged_once"`
	DoubleCharges int `json:"double_charges"`
	Lost          int `json:"lost"`
	Unexpected    int `json:"unexpected"`
	// The fairness scenario (nil otherwise): merchant B's payments,
	// published BAfterMS after the first of A's.
	B *MerchantBResult `json:"merchant_b,omitempty"`
}

// SteadyResult is publish→charged after the warm-up.
type SteadyResult struct {
	WarmupMS              float64 `json:"warmup_ms"`
	Payments              int     `json:"payments"`
	PublishToChargedP50MS float64 `json:"publish_to_charged_p50_ms"`
	PublishToChargedP99MS float64 `json:"publish_to_charged_p99_ms"`
	OverheadP99MS         float64 `json:"overhead_p99_ms"`
}

// MerchantBResult is merchant B's lot in the fairness scenario.
type MerchantBResult struct {
	BacklogA              int     `json:"backlog_a"`
	Payments              int     `json:"payments"`
	AfterMS               float64 `json:"after_ms"`
	PublishToChargedP99MS float64 `json:"publish_to_charged_p99_ms"`
	PublishToChargedMaxMS float64 `json:"publish_to_charged_max_ms"`
	// ADrainedMS is when A's last payment was completed, from the first
	// publish: B waited behind A when B's max is close to it.
	ADrainedMS float64 `json:"a_drained_ms"`
}

// RunProvider runs one measurement and prints it.
func RunProvider(ctx context.Context, cfg ProviderConfig) (ProviderResult, error) {
	if err := cfg.Validate(); err != nil {
		return ProviderResult{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	r := &run{cfg: Config{Setup: cfg.Setup}, say: func(format string, args ...any) {
		fmt.Fprintf(cfg.ErrOut, "bench provider: "+format+"\n", args...)
	}}
	defer r.cleanup()
	p := &provBench{run: r, cfg: cfg}
	res, err := p.measure(ctx)
	if err != nil {
		return res, fmt.Errorf("bench provider: %w", err)
	}
	p.report(res)
	if res.DoubleCharges > 0 || res.Lost > 0 || res.Unexpected > 0 {
		return res, fmt.Errorf("bench provider: %d double charges, %d lost payments, %d unexpected charges", res.DoubleCharges, res.Lost, res.Unexpected)
	}
	return res, nil
}

type provBench struct {
	*run
	cfg ProviderConfig
}

// published is one payment and when its batch was sent.
type published struct {
	rowKey string // merchant_id:idempotency_key
	at     time.Time
}

// simArgs are provider-sim's flags for the model.
func simArgs(m stripesim.Model) []string {
	return []string{"--latency-median", m.LatencyMedian.String(), "--latency-p99", m.LatencyP99.String(),
		"--rate-limit", fmt.Sprint(m.RateLimit), "--concurrency-limit", fmt.Sprint(m.ConcurrencyLimit)}
}

func (p *provBench) measure(ctx context.Context) (ProviderResult, error) {
	cfg := p.cfg
	res := ProviderResult{Mode: "provider", Provider: cfg.Provider, Workers: cfg.Workers, WorkerEnv: cfg.WorkerEnv,
		Model: cfg.Model, Payments: cfg.Payments, Merchants: cfg.Merchants, PublishRate: cfg.PublishRate}
	if cfg.fairness() {
		res.Payments, res.Merchants = cfg.BacklogA+cfg.PaymentsB, 2
	}
	w, err := p.setUp(ctx, "paydedup-provbench-")
	if err != nil {
		return res, err
	}
	suffix, natsURL, dbURL, observer, scfg, env := w.suffix, w.natsURL, w.dbURL, w.observer, w.scfg, w.env
	simURL, _, provEnv, err := p.provider(ctx, simArgs(cfg.Model))
	if err != nil {
		return res, err
	}
	env = append(append(env, provEnv...), "DATABASE_URL="+dbURL)

	nc, err := nats.Connect(natsURL, nats.Name("paydedup-provbench"))
	if err != nil {
		return res, fmt.Errorf("connect to NATS at %s: %w", natsURL, err)
	}
	p.defer_(nc.Close)
	pub, err := stream.NewCommandPublisher(nc, scfg, 30*time.Second)
	if err != nil {
		return res, err
	}

	workers, logs, err := p.workers(ctx, env)
	if err != nil {
		return res, err
	}
	before, err := p.simStats(ctx, simURL)
	if err != nil {
		return res, err
	}

	p.say("publishing %d payments; %d worker(s) draining them through provider-sim (%s)", res.Payments, cfg.Workers, modelNote(cfg.Model))
	var pubs []published
	var bFrom int // pubs[bFrom:] are merchant B's
	suffixKey := "pv-" + suffix + "-"
	if cfg.fairness() {
		pubs, err = p.publish(ctx, pub, commands([]string{MerchantA}, suffixKey+"a-", cfg.BacklogA), 0)
		if err != nil {
			return res, err
		}
		select {
		case <-time.After(time.Until(pubs[0].at.Add(cfg.BAfter))):
		case <-ctx.Done():
			return res, ctx.Err()
		}
		bFrom = len(pubs)
		b, err := p.publish(ctx, pub, commands([]string{MerchantB}, suffixKey+"b-", cfg.PaymentsB), cfg.PublishRate)
		if err != nil {
			return res, err
		}
		pubs = append(pubs, b...)
	} else {
		merchants := make([]string, cfg.Merchants)
		for i := range merchants {
			merchants[i] = fmt.Sprintf("m_bench_%d", i)
		}
		pubs, err = p.publish(ctx, pub, commands(merchants, suffixKey, cfg.Payments), cfg.PublishRate)
		if err != nil {
			return res, err
		}
	}

	settled, waitErr := p.waitAll(ctx, observer, len(pubs), workers)
	for _, w := range workers {
		res.WorkerRSSMB = append(res.WorkerRSSMB, procstat.PIDPeakRSSMB(w.Process.Pid))
	}
	if waitErr != nil {
		return res, fmt.Errorf("%w (%d of %d settled; the first worker's log ends:\n%s)", waitErr, settled, len(pubs), logTail(logs[0]))
	}
	after, err := p.simStats(ctx, simURL)
	if err != nil {
		return res, err
	}
	done, err := observer.CompletedAt(ctx)
	if err != nil {
		return res, err
	}

	// Publish→charged, and the run's span, from the database's clock (the
	// same machine's).
	first, last := pubs[0].at, pubs[0].at
	lat := make([]float64, 0, len(pubs))
	var bLat, steady []float64
	var aDrained time.Time
	for i, pb := range pubs {
		at, ok := done[pb.rowKey]
		if !ok {
			return res, fmt.Errorf("payment %s settled but its key is not completed", pb.rowKey)
		}
		last = laterOf(last, at)
		d := float64(at.Sub(pb.at)) / float64(time.Millisecond)
		lat = append(lat, d)
		if cfg.Warmup > 0 && !pb.at.Before(first.Add(cfg.Warmup)) {
			steady = append(steady, d)
		}
		if cfg.fairness() && i >= bFrom {
			bLat = append(bLat, d)
		} else if cfg.fairness() {
			aDrained = laterOf(aDrained, at)
		}
	}
	res.Seconds = last.Sub(first).Seconds()
	res.PaymentsPerSec = float64(len(pubs)) / res.Seconds
	res.PublishToChargedP50MS, res.PublishToChargedP99MS, res.PublishToChargedMaxMS = quantile(lat, 0.5), quantile(lat, 0.99), quantile(lat, 1)
	if cfg.fairness() {
		res.B = &MerchantBResult{BacklogA: cfg.BacklogA, Payments: cfg.PaymentsB, AfterMS: ms(pubs[bFrom].at.Sub(first)),
			PublishToChargedP99MS: quantile(bLat, 0.99), PublishToChargedMaxMS: quantile(bLat, 1), ADrainedMS: ms(aDrained.Sub(first))}
	}

	// provider-sim's counters over the run.
	res.InFlightMean = (after.InFlightSeconds - before.InFlightSeconds) / res.Seconds
	res.InFlightPeak = after.PeakInFlight
	res.ProviderP50MS, res.ProviderP99MS = after.LatencyP50MS, after.LatencyP99MS
	res.OverheadP99MS = res.PublishToChargedP99MS - res.ProviderP99MS
	if cfg.Warmup > 0 {
		if len(steady) == 0 {
			return res, fmt.Errorf("--warmup %s left no payment to measure: every one was published before it ended", cfg.Warmup)
		}
		res.Steady = &SteadyResult{WarmupMS: ms(cfg.Warmup), Payments: len(steady), PublishToChargedP50MS: quantile(steady, 0.5),
			PublishToChargedP99MS: quantile(steady, 0.99)}
		res.Steady.OverheadP99MS = res.Steady.PublishToChargedP99MS - res.ProviderP99MS
	}
	res.RequestsByKind, res.RateLimited = diff(after.Requests, before.Requests), diff(after.RateLimited, before.RateLimited)
	res.Requests = after.RequestsTotal - before.RequestsTotal
	res.Answered429 = after.RateLimitedTotal - before.RateLimitedTotal
	if res.Requests > 0 {
		res.Share429 = float64(res.Answered429) / float64(res.Requests)
	}

	for _, l := range logs {
		n, err := countLines(l, pausedLine)
		if err != nil {
			return res, err
		}
		res.PausesPerWorker = append(res.PausesPerWorker, n)
		res.Pauses += n
	}
	if res.DeadLetters, err = deadLetters(ctx, nc, scfg.DLQStream); err != nil {
		return res, err
	}
	charges, err := p.ledger(ctx, simURL)
	if err != nil {
		return res, err
	}
	want := make(map[string]bool, len(pubs))
	for _, pb := range pubs {
		want[pb.rowKey] = true
		switch n := charges[pb.rowKey]; {
		case n == 1:
			res.ChargedOnce++
		case n > 1:
			res.DoubleCharges++
		default:
			res.Lost++
		}
	}
	for k := range charges {
		if !want[k] {
			res.Unexpected++
		}
	}
	return res, nil
}

// commands are n payments under the keys prefix+i, spread round robin
// over merchants.
func commands(merchants []string, prefix string, n int) []payment.Command {
	out := make([]payment.Command, n)
	for i := range out {
		out[i] = payment.Command{MerchantID: merchants[i%len(merchants)], IdempotencyKey: fmt.Sprintf("%s%d", prefix, i), Amount: int64(100 + i%1000),
			Currency: "usd", PaymentMethod: "pm_card_visa", Description: "bench provider"}
	}
	return out
}

// publishBatch is how many commands one PublishBatch sends.
const publishBatch = 500

// publish publishes cmds, at rate payments/s (0: as fast as the stream
// takes them), and returns when each was sent. Every command must be
// stored: the bench counts on it.
func (p *provBench) publish(ctx context.Context, pub *stream.CommandPublisher, cmds []payment.Command, rate float64) ([]published, error) {
	out := make([]published, 0, len(cmds))
	start := time.Now()
	for sent := 0; sent < len(cmds); {
		n := min(publishBatch, len(cmds)-sent)
		if rate > 0 {
			due := int(rate*time.Since(start).Seconds()) + 1
			if n = min(n, due-sent); n <= 0 {
				select {
				case <-time.After(5 * time.Millisecond):
				case <-ctx.Done():
					return out, ctx.Err()
				}
				continue
			}
		}
		batch := make([]stream.BatchCommand, n)
		for i := range batch {
			batch[i] = stream.BatchCommand{Cmd: &cmds[sent+i]}
		}
		at := time.Now()
		for i, br := range pub.PublishBatch(ctx, batch) {
			if br.Err != nil {
				return out, fmt.Errorf("publish %s: %w", stream.MsgID(cmds[sent+i].MerchantID, cmds[sent+i].IdempotencyKey), br.Err)
			}
			out = append(out, published{rowKey: cmds[sent+i].MerchantID + ":" + cmds[sent+i].IdempotencyKey, at: at})
		}
		sent += n
	}
	return out, nil
}

// workers starts cfg.Workers `paydedup worker` processes, each with its
// own admin listener, and waits until every one is ready. It returns them
// and their log files.
func (p *provBench) workers(ctx context.Context, env []string) ([]*exec.Cmd, []string, error) {
	var cmds []*exec.Cmd
	var logs []string
	var admins []string
	for i := range p.cfg.Workers {
		port, err := freePort()
		if err != nil {
			return nil, nil, err
		}
		admin := fmt.Sprintf("127.0.0.1:%d", port)
		wenv := append(append(slices.Clone(env), "PAYDEDUP_ADMIN_ADDR="+admin), p.cfg.WorkerEnv...)
		name := fmt.Sprintf("worker-%d", i)
		w, err := p.start(ctx, name, wenv, "worker")
		if err != nil {
			return nil, nil, err
		}
		cmds, logs = append(cmds, w), append(logs, filepath.Join(p.tmp, name+".log"))
		admins = append(admins, adminAddrOf(wenv))
	}
	client := &http.Client{Timeout: 2 * time.Second}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(60 * time.Second)
	for i, admin := range admins {
		for {
			if ready(ctx, client, admin) {
				break
			}
			if !alive(cmds[i].Process.Pid) {
				return nil, nil, fmt.Errorf("worker %d exited before it was ready; its log ends:\n%s", i, logTail(logs[i]))
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return nil, nil, fmt.Errorf("worker %d not ready at %s/readyz within 60s; its log ends:\n%s", i, admin, logTail(logs[i]))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return cmds, logs, nil
}

func ready(ctx context.Context, client *http.Client, admin string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/readyz", nil)
	if err != nil {
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitAll polls the ledger until n payments are settled, a worker exits
// or ctx ends, and returns how many settled.
func (p *provBench) waitAll(ctx context.Context, obs *localpg.Observer, n int, workers []*exec.Cmd) (int, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	got := 0
	for i := 0; ; i++ {
		// As waitCount: the sequence bounds the count, which scans.
		ids, err := obs.LedgerIDs(ctx)
		if err == nil && (ids >= int64(n) || i%20 == 0) {
			got, err = obs.Settled(ctx)
		}
		if err != nil && ctx.Err() == nil {
			return got, fmt.Errorf("count settled payments: %w", err)
		}
		if got >= n {
			return got, nil
		}
		for j, w := range workers {
			if !alive(w.Process.Pid) {
				return got, fmt.Errorf("worker %d exited before the payments were charged", j)
			}
		}
		select {
		case <-ctx.Done():
			return got, fmt.Errorf("payments not charged: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// simStats reads provider-sim's GET /_sim/stats.
func (p *provBench) simStats(ctx context.Context, simURL string) (stripesim.Stats, error) {
	var st stripesim.Stats
	err := p.simGet(ctx, simURL+"/_sim/stats", &st)
	return st, err
}

// ledger reads provider-sim's charges per "merchant_id:idempotency_key".
func (p *provBench) ledger(ctx context.Context, simURL string) (map[string]int, error) {
	var l stripesim.Ledger
	err := p.simGet(ctx, simURL+"/_sim/ledger", &l)
	return l.ChargesByKey, err
}

func (p *provBench) simGet(ctx context.Context, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := p.simHTTP.Do(req)
	if err != nil {
		return fmt.Errorf("read provider-sim: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	return nil
}

// deadLetters is how many messages the dead-letter stream holds.
func deadLetters(ctx context.Context, nc *nats.Conn, name string) (int, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the dead-letter stream %s: %w", name, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("read the dead-letter stream %s: %w", name, err)
	}
	return int(info.State.Msgs), nil
}

// logTail is the end of a worker's log (removed with the run's directory).
func logTail(file string) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	return tail(b)
}

// countLines counts the lines of file that contain s.
func countLines(file, s string) (int, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	n := 0
	for sc.Scan() {
		if bytes.Contains(sc.Bytes(), []byte(s)) {
			n++
		}
	}
	return n, sc.Err()
}

func diff(after, before map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// quantile is the q-th quantile of xs (nearest rank), 0 when empty; it
// sorts xs.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	i := max(int(math.Ceil(q*float64(len(xs))))-1, 0)
	return xs[min(i, len(xs)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func modelNote(m stripesim.Model) string {
	note := "latency none"
	if m.LatencyMedian > 0 {
		note = fmt.Sprintf("latency median %s p99 %s", m.LatencyMedian, max(m.LatencyP99, m.LatencyMedian))
	}
	limit := func(v float64, unit string) string {
		if v == 0 {
			return "none"
		}
		return fmt.Sprintf("%g%s", v, unit)
	}
	return fmt.Sprintf("%s, rate limit %s, concurrency limit %s", note, limit(m.RateLimit, "/s"), limit(float64(m.ConcurrencyLimit), ""))
}

func counts(m map[string]int64) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func (p *provBench) report(res ProviderResult) {
	out := p.cfg.Out
	fmt.Fprintf(out, "paydedup worker ×%d (own processes, defaults%s), provider-sim over %s: %s\n",
		res.Workers, envNote(res.WorkerEnv), res.Provider, modelNote(res.Model))
	pace := "published at once"
	if res.PublishRate > 0 {
		pace = fmt.Sprintf("published at %g/s", res.PublishRate)
	}
	fmt.Fprintf(out, "  %d payments (%d merchants, %s) charged in %.2fs: %.0f payments/s\n", res.Payments, res.Merchants, pace, res.Seconds, res.PaymentsPerSec)
	fmt.Fprintf(out, "  calls in flight at the provider: mean %.1f, peak %d\n", res.InFlightMean, res.InFlightPeak)
	fmt.Fprintf(out, "  publish→charged: p50 %.0f ms, p99 %.0f ms, max %.0f ms; provider's own latency p50 %.0f ms, p99 %.0f ms; overhead above it (p99) %.0f ms\n",
		res.PublishToChargedP50MS, res.PublishToChargedP99MS, res.PublishToChargedMaxMS, res.ProviderP50MS, res.ProviderP99MS, res.OverheadP99MS)
	if st := res.Steady; st != nil {
		fmt.Fprintf(out, "  after the first %.0f ms (the call limit's slow start), %d payments: publish→charged p50 %.0f ms, p99 %.0f ms; overhead above the provider's p99 %.0f ms\n",
			st.WarmupMS, st.Payments, st.PublishToChargedP50MS, st.PublishToChargedP99MS, st.OverheadP99MS)
	}
	fmt.Fprintf(out, "  requests %d (%s); answered 429: %d (%.1f %%: %s)\n", res.Requests, counts(res.RequestsByKind), res.Answered429, 100*res.Share429, counts(res.RateLimited))
	rss := make([]string, len(res.WorkerRSSMB))
	for i, v := range res.WorkerRSSMB {
		rss[i] = fmt.Sprintf("%.0f", v)
	}
	fmt.Fprintf(out, "  worker peak RSS (MiB): %s; worker pauses: %d %v; dead letters: %d\n", strings.Join(rss, ", "), res.Pauses, res.PausesPerWorker, res.DeadLetters)
	fmt.Fprintf(out, "  provider-sim's ledger: %d charged once, %d double charges, %d lost, %d unexpected\n", res.ChargedOnce, res.DoubleCharges, res.Lost, res.Unexpected)
	if b := res.B; b != nil {
		fmt.Fprintf(out, "  merchant B: %d payments published %.0f ms after A's %d: publish→charged p99 %.0f ms, max %.0f ms (A drained at %.0f ms)\n",
			b.Payments, b.AfterMS, b.BacklogA, b.PublishToChargedP99MS, b.PublishToChargedMaxMS, b.ADrainedMS)
	}
	if p.cfg.JSON {
		b, _ := json.Marshal(res)
		fmt.Fprintln(out, string(b))
	}
}
