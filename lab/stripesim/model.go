package stripesim

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/paydedup/paydedup/provider"
)

// The provider as it really is: Stripe answers in hundreds of milliseconds
// with a tail past a second, and limits each account's requests per second
// and in flight, answering what is over with 429 rate_limit. Model says how
// the simulator does the same; its zero value answers at once, without
// limits, as the simulator always did.

// Stripe's documented global rate limits, in requests per second per
// account, for Model.RateLimit.
const (
	StripeLiveRateLimit    = 100
	StripeSandboxRateLimit = 25
)

// HeaderRateLimitedReason is the header with which Stripe says which of its
// limiters answered a request 429.
const HeaderRateLimitedReason = "Stripe-Rate-Limited-Reason"

// The Stripe-Rate-Limited-Reason values the simulator sends (Stripe also
// has endpoint-rate, endpoint-concurrency and resource-specific).
const (
	// ReasonGlobalRate: the account's requests per second are over
	// Model.RateLimit.
	ReasonGlobalRate = "global-rate"
	// ReasonGlobalConcurrency: the account has Model.ConcurrencyLimit
	// requests in flight already.
	ReasonGlobalConcurrency = "global-concurrency"
	// ReasonInjected is the key under which Stats counts the 429s of
	// Faults.Rate429, which carry no Stripe-Rate-Limited-Reason.
	ReasonInjected = "injected"
)

// The endpoint kinds Stats counts requests by.
const (
	KindCreate   = "create"   // POST /v1/payment_intents (create and confirm)
	KindRetrieve = "retrieve" // GET /v1/payment_intents/{id}
	KindSearch   = "search"   // GET /v1/payment_intents/search
	KindList     = "list"     // GET /v1/payment_intents
	KindCancel   = "cancel"   // POST /v1/payment_intents/{id}/cancel
	// KindCapture is POST /v1/payment_intents/{id}/capture.
	KindCapture = "capture"
	// KindRefund is POST /v1/refunds; KindRefundList GET /v1/refunds.
	KindRefund     = "refund"
	KindRefundList = "refund_list"
)

// z99 is the standard normal's 99th percentile: a log-normal latency with
// median m and 99th percentile p has sigma ln(p/m)/z99.
const z99 = 2.3263478740408408

// Model is how the simulated provider behaves when nothing fails: its
// latency and the limits of an account (a Bearer key). It applies to the
// HTTP API, every endpoint alike (creates, retrieves, searches, lists,
// cancels); the latency applies to a Client's calls too, the limits and
// Stats do not (a Client has no connection to hold). Faults come on top.
type Model struct {
	// LatencyMedian and LatencyP99 give each request a delay drawn from
	// the log-normal distribution of that median and 99th percentile
	// (sigma = ln(p99/median)/2.326), seeded by Config.Seed, before it
	// is processed. 0 answers at once; LatencyP99 0 (or equal to the
	// median) makes every delay the median.
	LatencyMedian time.Duration `json:"latency_median"`
	LatencyP99    time.Duration `json:"latency_p99"`
	// RateLimit is an account's requests per second across every
	// endpoint, a token bucket holding one second of them: a request
	// past it is answered 429 rate_limit with Stripe-Rate-Limited-Reason
	// global-rate at once, and is not processed (nothing charged, nothing
	// stored under its key). 0: no limit. Stripe: StripeLiveRateLimit,
	// StripeSandboxRateLimit.
	RateLimit float64 `json:"rate_limit"`
	// ConcurrencyLimit is how many of an account's requests may be in
	// flight (past the rate limit, not yet answered) at once; one more is
	// answered 429 with global-concurrency, unprocessed. 0: no limit.
	ConcurrencyLimit int `json:"concurrency_limit"`
}

// Validate reports the first invalid field by name.
func (m Model) Validate() error {
	switch {
	case m.LatencyMedian < 0:
		return fmt.Errorf("%w: Model.LatencyMedian %s is negative", provider.ErrInvalidConfig, m.LatencyMedian)
	case m.LatencyP99 < 0:
		return fmt.Errorf("%w: Model.LatencyP99 %s is negative", provider.ErrInvalidConfig, m.LatencyP99)
	case m.LatencyP99 > 0 && m.LatencyMedian == 0:
		return fmt.Errorf("%w: Model.LatencyP99 %s needs a Model.LatencyMedian", provider.ErrInvalidConfig, m.LatencyP99)
	case m.LatencyP99 > 0 && m.LatencyP99 < m.LatencyMedian:
		return fmt.Errorf("%w: Model.LatencyP99 %s is below Model.LatencyMedian %s", provider.ErrInvalidConfig, m.LatencyP99, m.LatencyMedian)
	case math.IsNaN(m.RateLimit) || math.IsInf(m.RateLimit, 0) || m.RateLimit < 0:
		return fmt.Errorf("%w: Model.RateLimit %v is not a non-negative number of requests per second", provider.ErrInvalidConfig, m.RateLimit)
	case m.ConcurrencyLimit < 0:
		return fmt.Errorf("%w: Model.ConcurrencyLimit %d is negative", provider.ErrInvalidConfig, m.ConcurrencyLimit)
	}
	return nil
}

// sigma is the log-normal's shape parameter.
func (m Model) sigma() float64 {
	if m.LatencyP99 <= m.LatencyMedian {
		return 0
	}
	return math.Log(float64(m.LatencyP99)/float64(m.LatencyMedian)) / z99
}

// Latency is the delay of a request whose standard normal draw is z: the
// median times e^(sigma·z). Exported for tests of the distribution, which
// feed it draws instead of sleeping.
func (m Model) Latency(z float64) time.Duration {
	if m.LatencyMedian <= 0 {
		return 0
	}
	return time.Duration(float64(m.LatencyMedian) * math.Exp(m.sigma()*z))
}

// limiter holds an account's limits and every request's counts.
type limiter struct {
	model Model

	mu       sync.Mutex
	accounts map[string]*accountLimit
	requests map[string]int64
	limited  map[string]int64
	inFlight int
	peak     int
	busy     time.Duration
	latency  latencyHist
}

// accountLimit is one account's token bucket and requests in flight.
type accountLimit struct {
	bucket   *rate.Limiter // nil without a rate limit
	inFlight int
}

func newLimiter(m Model) *limiter {
	return &limiter{model: m, accounts: map[string]*accountLimit{}, requests: map[string]int64{}, limited: map[string]int64{}}
}

// enter counts a request of kind for account ("" without an API key,
// which no limit applies to) arriving at now, on the simulator's clock.
// It returns the reason it is refused (ReasonGlobalRate,
// ReasonGlobalConcurrency), or "" and the release to call once it is
// answered, with how long it was in flight.
func (l *limiter) enter(kind, account string, now time.Time) (reason string, release func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.requests[kind]++
	var a *accountLimit
	if account != "" && (l.model.RateLimit > 0 || l.model.ConcurrencyLimit > 0) {
		a = l.accounts[account]
		if a == nil {
			a = &accountLimit{}
			if l.model.RateLimit > 0 {
				// A bucket of one second's requests: a client sending at
				// the limit is never refused, one sending above it is
				// refused what is above it.
				a.bucket = rate.NewLimiter(rate.Limit(l.model.RateLimit), max(1, int(math.Ceil(l.model.RateLimit))))
			}
			l.accounts[account] = a
		}
		if a.bucket != nil && !a.bucket.AllowN(now, 1) {
			l.limited[ReasonGlobalRate]++
			return ReasonGlobalRate, nil
		}
		if l.model.ConcurrencyLimit > 0 && a.inFlight >= l.model.ConcurrencyLimit {
			l.limited[ReasonGlobalConcurrency]++
			return ReasonGlobalConcurrency, nil
		}
		a.inFlight++
	}
	l.inFlight++
	l.peak = max(l.peak, l.inFlight)
	start := time.Now()
	return "", func() {
		d := time.Since(start)
		l.mu.Lock()
		defer l.mu.Unlock()
		l.inFlight--
		l.busy += d
		if a != nil {
			a.inFlight--
		}
	}
}

// injected counts a 429 of Faults.Rate429.
func (l *limiter) injected() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.limited[ReasonInjected]++
}

// slept records the latency a request was given.
func (l *limiter) slept(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.latency.add(d)
}

// Stats are the simulator's counters of its HTTP requests since it
// started, served as JSON at GET /_sim/stats.
type Stats struct {
	// Requests counts every API request by endpoint kind (KindCreate,
	// KindRetrieve, KindSearch, KindList, KindCancel, KindCapture,
	// KindRefund, KindRefundList), refused or not;
	// RequestsTotal is their sum.
	Requests      map[string]int64 `json:"requests"`
	RequestsTotal int64            `json:"requests_total"`
	// RateLimited counts the requests answered 429 rate_limit, by reason
	// (ReasonGlobalRate, ReasonGlobalConcurrency, ReasonInjected);
	// RateLimitedTotal is their sum.
	RateLimited      map[string]int64 `json:"rate_limited"`
	RateLimitedTotal int64            `json:"rate_limited_total"`
	// InFlight is how many requests let through the limits are being
	// handled now; PeakInFlight the most at once.
	InFlight     int `json:"in_flight"`
	PeakInFlight int `json:"peak_in_flight"`
	// InFlightSeconds is the sum, over the requests let through and
	// answered, of the seconds each was in flight: its growth over a span
	// divided by the span is the mean number in flight.
	InFlightSeconds float64 `json:"in_flight_seconds"`
	// LatencyCount requests let through were given a latency (Model's and
	// Faults'), whose median and 99th percentile, in milliseconds, are
	// LatencyP50MS and LatencyP99MS (within 1 %).
	LatencyCount int64   `json:"latency_count"`
	LatencyP50MS float64 `json:"latency_p50_ms"`
	LatencyP99MS float64 `json:"latency_p99_ms"`
	// Model is the model in force.
	Model Model `json:"model"`
}

// Stats returns the counters at once, consistently.
func (s *Simulator) Stats() Stats {
	l := s.lim
	l.mu.Lock()
	defer l.mu.Unlock()
	st := Stats{Requests: make(map[string]int64, len(l.requests)), RateLimited: make(map[string]int64, len(l.limited)),
		InFlight: l.inFlight, PeakInFlight: l.peak, InFlightSeconds: l.busy.Seconds(),
		LatencyCount: l.latency.n, Model: l.model}
	for k, n := range l.requests {
		st.Requests[k] = n
		st.RequestsTotal += n
	}
	for k, n := range l.limited {
		st.RateLimited[k] = n
		st.RateLimitedTotal += n
	}
	st.LatencyP50MS = ms(l.latency.quantile(0.5))
	st.LatencyP99MS = ms(l.latency.quantile(0.99))
	return st
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (s *Simulator) serveStats(w http.ResponseWriter, _ *http.Request) {
	body, err := json.Marshal(s.Stats())
	if err != nil {
		// Only numbers and maps of strings are marshalled.
		panic("stripesim: encode stats: " + err.Error())
	}
	writeSimRaw(w, http.StatusOK, body)
}

// The rate limiters' answers: Stripe's 429 body, and the header naming the
// limiter. Stripe documents no Retry-After and no Stripe-Should-Retry on
// them (its libraries do not retry a rate limit, only a lock_timeout), so
// the simulator sends neither: a client learns to back off from the 429
// itself. Faults.Rate429 keeps its "Retry-After: 1".
var (
	simReplyGlobalRate        = rateLimitedReply(ReasonGlobalRate)
	simReplyGlobalConcurrency = rateLimitedReply(ReasonGlobalConcurrency)
)

func rateLimitedReply(reason string) *simReply {
	return &simReply{status: http.StatusTooManyRequests, reason: reason, err: &simError{Type: "invalid_request_error", Code: "rate_limit",
		Message: "Too many requests hit the API too quickly. We recommend an exponential backoff of your requests."}}
}

// latencyHist is a histogram of durations in buckets 2 % wide from 1 µs
// up (the last one open), so that its quantiles are within 1 %.
type latencyHist struct {
	zero    int64 // under 1 µs
	buckets [latencyBuckets]int64
	n       int64
}

const (
	latencyRatio   = 1.02
	latencyBuckets = 1000 // 1 µs × 1.02^1000 is past 100 hours
)

var logLatencyRatio = math.Log(latencyRatio)

func (h *latencyHist) add(d time.Duration) {
	h.n++
	if d < time.Microsecond {
		h.zero++
		return
	}
	i := int(math.Log(float64(d)/float64(time.Microsecond)) / logLatencyRatio)
	h.buckets[min(max(i, 0), latencyBuckets-1)]++
}

// quantile is the q-th quantile (0 < q ≤ 1): the geometric middle of the
// bucket that holds it; 0 when empty.
func (h *latencyHist) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(h.n)))
	seen := h.zero
	if seen >= rank {
		return 0
	}
	for i, c := range h.buckets {
		if seen += c; seen >= rank {
			return time.Duration(float64(time.Microsecond) * math.Pow(latencyRatio, float64(i)+0.5))
		}
	}
	return time.Duration(float64(time.Microsecond) * math.Pow(latencyRatio, latencyBuckets))
}
