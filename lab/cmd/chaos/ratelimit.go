package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/paydedup/paydedup/lab/stripesim"
)

// The provider as it really is (issue 53): -provider-latency-median and
// -provider-latency-p99 give every request the simulator's log-normal
// latency, -provider-rate-limit caps the account's requests per second and
// -provider-concurrency-limit its requests in flight, each answered 429
// rate_limit with Stripe-Rate-Limited-Reason as Stripe answers (the
// simulator's --latency-median, --latency-p99, --rate-limit and
// --concurrency-limit). The workers, the reconciler and the audit share
// that one account (one API key). At the end the harness reads the
// simulator's GET /_sim/stats and the workers' pause log lines, so a run
// shows whether the fleet hammered the account; -provider-max-429-share
// turns a share of 429s above it into a violation.

// rateLimitMode reports whether any of the provider model's flags is set.
func (c *config) rateLimitMode() bool {
	return c.providerRateLimit > 0 || c.providerConcurrencyLimit > 0 || c.providerLatencyMedian > 0 || c.providerRate > 0
}

// validateProvider checks the provider model's flags, naming the one to
// fix.
func (c *config) validateProvider() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if math.IsNaN(c.providerRateLimit) || math.IsInf(c.providerRateLimit, 0) || c.providerRateLimit < 0 {
		bad("-provider-rate-limit must be a non-negative number of requests per second, got %v", c.providerRateLimit)
	}
	if c.providerConcurrencyLimit < 0 {
		bad("-provider-concurrency-limit must not be negative, got %d", c.providerConcurrencyLimit)
	}
	switch {
	case c.providerLatencyMedian < 0:
		bad("-provider-latency-median must not be negative, got %v", c.providerLatencyMedian)
	case c.providerLatencyP99 < 0:
		bad("-provider-latency-p99 must not be negative, got %v", c.providerLatencyP99)
	case c.providerLatencyP99 > 0 && c.providerLatencyMedian == 0:
		bad("-provider-latency-p99 needs -provider-latency-median")
	case c.providerLatencyP99 > 0 && c.providerLatencyP99 < c.providerLatencyMedian:
		bad("-provider-latency-p99 %v must be at least -provider-latency-median %v", c.providerLatencyP99, c.providerLatencyMedian)
	case c.providerLatencyP99 >= c.providerTimeout && c.providerTimeout > 0:
		// Every call past the timeout is an unanswered one: the run would
		// measure the timeout, not the rate limit.
		bad("-provider-latency-p99 %v must stay under -provider-timeout %v", c.providerLatencyP99, c.providerTimeout)
	case c.providerLatencyP99 == 0 && c.providerLatencyMedian >= c.providerTimeout && c.providerTimeout > 0:
		bad("-provider-latency-median %v must stay under -provider-timeout %v", c.providerLatencyMedian, c.providerTimeout)
	}
	if math.IsNaN(c.providerRate) || math.IsInf(c.providerRate, 0) || c.providerRate < 0 {
		bad("-provider-rate must be a non-negative number of requests per second, got %v", c.providerRate)
	}
	if math.IsNaN(c.providerMax429Share) || c.providerMax429Share < 0 || c.providerMax429Share > 1 {
		bad("-provider-max-429-share must be within 0..1, got %v", c.providerMax429Share)
	}
	if c.rateLimitMode() && (c.scale != nil || c.soak > 0) {
		bad("-provider-rate-limit, -provider-concurrency-limit, -provider-latency-median and -provider-rate are for a chaos run, not -scale or -soak")
	}
	return errs
}

// simModelArgs are the simulator's flags of the provider model, none when
// it is off (the simulator then answers as it always did).
func (c *config) simModelArgs() []string {
	var args []string
	if c.providerLatencyMedian > 0 {
		args = append(args, "--latency-median", c.providerLatencyMedian.String())
	}
	if c.providerLatencyP99 > 0 {
		args = append(args, "--latency-p99", c.providerLatencyP99.String())
	}
	if c.providerRateLimit > 0 {
		args = append(args, "--rate-limit", strconv.FormatFloat(c.providerRateLimit, 'f', -1, 64))
	}
	if c.providerConcurrencyLimit > 0 {
		args = append(args, "--concurrency-limit", strconv.Itoa(c.providerConcurrencyLimit))
	}
	return args
}

// providerRateEnv is the workers' fleet-wide provider budget, set only
// when -provider-rate is: a worker without the setting ignores it.
func (c *config) providerRateEnv() []string {
	if c.providerRate <= 0 {
		return nil
	}
	return []string{"PAYDEDUP_PROVIDER_RATE=" + strconv.FormatFloat(c.providerRate, 'f', -1, 64)}
}

// providerLoad is what the provider saw of the run: the simulator's
// counters and what the workers logged of it.
type providerLoad struct {
	read   bool // the simulator's stats were read
	stats  stripesim.Stats
	logged workerLog
}

// limited is the 429s of the account's limiters (the rate and
// concurrency limits), not the simulator's injected ones (-rate-429).
func (l providerLoad) limited() int64 {
	return l.stats.RateLimited[stripesim.ReasonGlobalRate] + l.stats.RateLimited[stripesim.ReasonGlobalConcurrency]
}

// limitedShare is limited() over every request, 0 without requests.
func (l providerLoad) limitedShare() float64 {
	if l.stats.RequestsTotal == 0 {
		return 0
	}
	return float64(l.limited()) / float64(l.stats.RequestsTotal)
}

func (l providerLoad) pauseTotal() int {
	n := 0
	for _, c := range l.logged.pauses {
		n += c
	}
	return n
}

// readProviderLoad reads the simulator's stats and counts the workers'
// pauses; a failure to read is logged, not fatal: the stats describe the
// run, the promise checks judge it.
func (h *harness) readProviderLoad(ctx context.Context) {
	l := providerLoad{logged: readWorkerLogs(h.logs)}
	st, err := h.simStats(ctx)
	if err != nil {
		h.logf("provider: %v", err)
	} else {
		l.read, l.stats = true, st
	}
	h.load = l
}

// simStats reads the simulator's GET /_sim/stats, directly (not through
// the workers' links, which a fault may hold cut).
func (h *harness) simStats(ctx context.Context) (stripesim.Stats, error) {
	var st stripesim.Stats
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+h.simAddr+"/_sim/stats", nil)
	if err != nil {
		return st, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, fmt.Errorf("read the simulator's stats: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("read the simulator's stats: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("decode the simulator's stats: %w", err)
	}
	return st, nil
}

// workerLog is what the workers' logs say of the provider's answers.
type workerLog struct {
	// pauses counts the "worker paused; not fetching" lines by cause;
	// pausesOn429 those of them whose error is a 429 (a rate limit read
	// as an outage).
	pauses      map[string]int
	pausesOn429 int
	// lastDeliveries counts the lines of a message that reached its last
	// allowed delivery without an outcome (held through a pause, or
	// published again): deliveries spent by the provider's answers.
	lastDeliveries int
}

// The log messages workerLog counts (consumer/worker.go, consumer/hold.go).
const (
	workerPausedMsg    = "worker paused; not fetching"
	lastDeliveryMsg    = "last allowed delivery ended"
	heldLastDeliverMsg = "provider unavailable on a message's last delivery"
)

// readWorkerLogs reads every worker log of dir (JSON lines, the workers'
// log format off a terminal).
func readWorkerLogs(dir string) workerLog {
	out := workerLog{pauses: map[string]int{}}
	paths, _ := filepath.Glob(filepath.Join(dir, "worker-*.log"))
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.Contains(line, workerPausedMsg) && !strings.Contains(line, lastDeliveryMsg) && !strings.Contains(line, heldLastDeliverMsg) {
				continue
			}
			var rec struct {
				Msg   string `json:"msg"`
				Cause string `json:"cause"`
				Error string `json:"error"`
			}
			if json.Unmarshal([]byte(line), &rec) != nil {
				continue
			}
			switch {
			case rec.Msg == workerPausedMsg:
				if rec.Cause == "" {
					rec.Cause = "unknown"
				}
				out.pauses[rec.Cause]++
				if strings.Contains(rec.Error, "status 429") {
					out.pausesOn429++
				}
			case strings.HasPrefix(rec.Msg, lastDeliveryMsg), strings.HasPrefix(rec.Msg, heldLastDeliverMsg):
				out.lastDeliveries++
			}
		}
		f.Close()
	}
	return out
}

// providerLine is the report's line about the provider's load: requests,
// 429s by reason and their share, calls in flight, the workers' pauses.
func (l providerLoad) providerLine() string {
	var b strings.Builder
	if !l.read {
		b.WriteString("provider: stats not read")
	} else {
		st := l.stats
		fmt.Fprintf(&b, "provider: %d requests (", st.RequestsTotal)
		b.WriteString(countsByKey(st.Requests))
		fmt.Fprintf(&b, "), %d answered 429 (", st.RateLimitedTotal)
		b.WriteString(countsByKey(st.RateLimited))
		fmt.Fprintf(&b, "); the account's limits refused %.1f %%; peak in flight %d, latency p50 %.0f ms p99 %.0f ms",
			100*l.limitedShare(), st.PeakInFlight, st.LatencyP50MS, st.LatencyP99MS)
		if m := st.Model; m.RateLimit > 0 || m.ConcurrencyLimit > 0 {
			fmt.Fprintf(&b, " (limits: %v/s, %d in flight)", m.RateLimit, m.ConcurrencyLimit)
		}
	}
	fmt.Fprintf(&b, "; worker pauses %d", l.pauseTotal())
	if len(l.logged.pauses) > 0 {
		fmt.Fprintf(&b, " (%s; %d on a 429)", countsByKey(l.logged.pauses), l.logged.pausesOn429)
	}
	fmt.Fprintf(&b, "; messages at their last delivery without an outcome %d", l.logged.lastDeliveries)
	return b.String()
}

// providerSummary is the rate-limited mode's part of the summary line.
func (h *harness) providerSummary() string {
	if !h.cfg.rateLimitMode() {
		return ""
	}
	l := h.load
	return fmt.Sprintf(" provider_requests=%d provider_429_limits=%d provider_429_share=%.3f provider_peak_in_flight=%d worker_pauses=%d worker_pauses_on_429=%d last_deliveries=%d",
		l.stats.RequestsTotal, l.limited(), l.limitedShare(), l.stats.PeakInFlight, l.pauseTotal(), l.logged.pausesOn429, l.logged.lastDeliveries)
}

// checkProviderLoad is the violation of -provider-max-429-share, if any.
func (h *harness) checkProviderLoad() error {
	limit := h.cfg.providerMax429Share
	if limit <= 0 {
		return nil
	}
	if !h.load.read {
		return errors.New("-provider-max-429-share: the simulator's stats could not be read")
	}
	if s := h.load.limitedShare(); s > limit {
		return fmt.Errorf("the account's limits answered %d of %d requests 429 (%.1f %%), above -provider-max-429-share %.1f %%",
			h.load.limited(), h.load.stats.RequestsTotal, 100*s, 100*limit)
	}
	return nil
}

// countsByKey is "k1=n1 k2=n2", keys sorted, or "none".
func countsByKey[N int | int64](m map[string]N) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return "none"
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}
