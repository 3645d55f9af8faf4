package ops

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// scrapeTimeout bounds one scrape-time read (a query or a consumer info).
const scrapeTimeout = 2 * time.Second

// pendingCollector exports the pending and stuck row counts from one query
// per scrape: both gauges come from the same answer.
type pendingCollector struct {
	count          func(ctx context.Context) (pending, stuck int64, err error)
	pending, stuck *prometheus.Desc
}

// WatchPending registers gauges of pending and stuck rows, read from count
// once per scrape (count must be cheap: dedup.Store.CountPending is). When
// count fails both read NaN, so an alert on "> 0" neither fires nor clears
// on a database outage; the readiness check reports the outage.
func WatchPending(reg prometheus.Registerer, count func(ctx context.Context) (pending, stuck int64, err error)) {
	reg.MustRegister(&pendingCollector{
		count: count,
		pending: prometheus.NewDesc("paydedup_pending_rows",
			"Idempotency rows claimed and not finished.", nil, nil),
		stuck: prometheus.NewDesc("paydedup_stuck_pending_rows",
			"Rows pending for longer than the reconciler grace (since they became pending; releases and failed lookups do not reset it): unresolved payments; alert when it stays above 0.", nil, nil),
	})
}

func (c *pendingCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.stuck
}

func (c *pendingCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	p, s, err := c.count(ctx)
	pv, sv := float64(p), float64(s)
	if err != nil {
		pv, sv = math.NaN(), math.NaN()
	}
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, pv)
	ch <- prometheus.MustNewConstMetric(c.stuck, prometheus.GaugeValue, sv)
}

// OpKinds are the kinds of operation on a payment WatchOperations labels
// its gauges with.
var OpKinds = []string{"refund", "capture", "cancel"}

// OpCounts are one kind's operations an operator alerts on: Stuck,
// pending past its lease; Unknown, a call's answer lost.
type OpCounts struct{ Stuck, Unknown int64 }

// opsCollector exports OpCounts by kind from one query per scrape.
type opsCollector struct {
	count          func(ctx context.Context) (map[string]OpCounts, error)
	stuck, unknown *prometheus.Desc
}

// WatchOperations registers gauges of the refunds, captures and cancels
// that are stuck (pending past their lease) and unknown (a call's answer
// lost), labelled by kind, read from count once per scrape (count must
// be cheap: dedup.Store.CountUnsettledOps is). As the charges' stuck rows
// (WatchPending), both resolve when the reconciler's lookup answers; when
// count fails every kind reads NaN.
func WatchOperations(reg prometheus.Registerer, count func(ctx context.Context) (map[string]OpCounts, error)) {
	reg.MustRegister(&opsCollector{
		count: count,
		stuck: prometheus.NewDesc("paydedup_stuck_operations",
			"Refunds, captures and cancels pending past their lease (their holder is gone), by kind: the reconciler looks them up; alert when it stays above 0.", []string{"kind"}, nil),
		unknown: prometheus.NewDesc("paydedup_unknown_operations",
			"Refunds, captures and cancels whose call's answer was lost, by kind: looked up before any re-call; alert when it stays above 0.", []string{"kind"}, nil),
	})
}

func (c *opsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.stuck
	ch <- c.unknown
}

func (c *opsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	counts, err := c.count(ctx)
	for _, kind := range OpKinds {
		sv, uv := float64(counts[kind].Stuck), float64(counts[kind].Unknown)
		if err != nil {
			sv, uv = math.NaN(), math.NaN()
		}
		ch <- prometheus.MustNewConstMetric(c.stuck, prometheus.GaugeValue, sv, kind)
		ch <- prometheus.MustNewConstMetric(c.unknown, prometheus.GaugeValue, uv, kind)
	}
}

// ConsumerLag is what the JetStream server reports of the durable consumer
// the workers share (jetstream.ConsumerInfo's counts).
type ConsumerLag struct {
	// Pending: messages in the stream the consumer has not delivered yet,
	// the number KEDA scales the workers on.
	Pending uint64
	// AckPending: delivered and not yet acked (in flight or awaiting redelivery).
	AckPending uint64
	// Redelivered: messages of AckPending delivered more than once.
	Redelivered uint64
	// Waiting: pull requests waiting for messages (idle worker capacity).
	Waiting uint64
	// StreamBytes and StreamMsgs are what the payments stream holds;
	// StreamMaxBytes and StreamMaxMsgs its bounds (-1: none). The stream
	// has no max age: an outage fills it, and when it reaches a bound it
	// refuses publishes.
	StreamBytes, StreamMsgs       uint64
	StreamMaxBytes, StreamMaxMsgs int64
	// OldestUnsettledAge is how long ago the oldest command the workers
	// have not settled was stored (0: none waits).
	OldestUnsettledAge time.Duration
}

// DefaultConsumerLagTTL is how long one consumer info answer serves
// scrapes: Prometheus replicas scraping many pods ask the server once per
// pod and interval, not once each.
const DefaultConsumerLagTTL = 5 * time.Second

// consumerCollector exports ConsumerLag, read at scrape time and kept for
// a short TTL.
type consumerCollector struct {
	info func(ctx context.Context) (ConsumerLag, error)
	ttl  time.Duration
	now  func() time.Time

	pending, ackPending, redelivered, waiting, up *prometheus.Desc
	bytes, msgs, maxBytes, maxMsgs, oldest        *prometheus.Desc

	mu     sync.Mutex
	at     time.Time
	last   ConsumerLag
	lastOK bool
}

// WatchConsumer registers gauges of the consumer's lag, read from info at
// scrape time; an answer serves scrapes for ttl (DefaultConsumerLagTTL when
// 0). Labels name the stream and the consumer, so one query sums the pods'
// identical answers with max, not sum. When info fails the gauges are left
// out and paydedup_consumer_info_up reads 0.
func WatchConsumer(reg prometheus.Registerer, streamName, durable string, ttl time.Duration, info func(ctx context.Context) (ConsumerLag, error)) {
	labels := prometheus.Labels{"stream": streamName, "consumer": durable}
	desc := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, labels) }
	if ttl <= 0 {
		ttl = DefaultConsumerLagTTL
	}
	reg.MustRegister(&consumerCollector{
		info: info, ttl: ttl, now: time.Now,
		pending: desc("paydedup_consumer_pending_messages",
			"Messages in the stream not yet delivered to the workers' consumer (JetStream num_pending): the backlog KEDA scales on."),
		ackPending: desc("paydedup_consumer_ack_pending_messages",
			"Messages delivered and not yet acked (JetStream num_ack_pending); capped by the consumer's MaxAckPending."),
		redelivered: desc("paydedup_consumer_redelivered_messages",
			"Unacked messages delivered more than once (JetStream num_redelivered)."),
		waiting: desc("paydedup_consumer_waiting_pulls",
			"Pull requests waiting for messages (JetStream num_waiting): idle worker capacity."),
		up: desc("paydedup_consumer_info_up",
			"1 when the last read of the consumer's info from JetStream succeeded, else 0."),
		bytes: desc("paydedup_stream_bytes",
			"Bytes the payments stream holds: the commands not yet settled, and the settled ones until the workers trim them."),
		msgs: desc("paydedup_stream_messages", "Messages the payments stream holds."),
		maxBytes: desc("paydedup_stream_max_bytes",
			"The payments stream's bound in bytes (PAYDEDUP_STREAM_MAX_BYTES; -1: none). At the bound it refuses publishes (the gateway answers 503)."),
		maxMsgs: desc("paydedup_stream_max_messages",
			"The payments stream's bound in messages (PAYDEDUP_STREAM_MAX_MSGS; -1: none)."),
		oldest: desc("paydedup_stream_oldest_unsettled_age_seconds",
			"How long ago the oldest command the workers have not settled was stored; 0 when none waits."),
	})
}

func (c *consumerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.pending, c.ackPending, c.redelivered, c.waiting, c.up, c.bytes, c.msgs, c.maxBytes, c.maxMsgs, c.oldest} {
		ch <- d
	}
}

func (c *consumerCollector) read() (ConsumerLag, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := c.now(); c.at.IsZero() || now.Sub(c.at) >= c.ttl {
		ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
		defer cancel()
		lag, err := c.info(ctx)
		c.at, c.last, c.lastOK = now, lag, err == nil
	}
	return c.last, c.lastOK
}

func (c *consumerCollector) Collect(ch chan<- prometheus.Metric) {
	lag, ok := c.read()
	if !ok {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	for d, v := range map[*prometheus.Desc]uint64{
		c.pending: lag.Pending, c.ackPending: lag.AckPending, c.redelivered: lag.Redelivered, c.waiting: lag.Waiting,
		c.bytes: lag.StreamBytes, c.msgs: lag.StreamMsgs,
	} {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	ch <- prometheus.MustNewConstMetric(c.maxBytes, prometheus.GaugeValue, float64(lag.StreamMaxBytes))
	ch <- prometheus.MustNewConstMetric(c.maxMsgs, prometheus.GaugeValue, float64(lag.StreamMaxMsgs))
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, lag.OldestUnsettledAge.Seconds())
}

// PoolStat is what a PostgreSQL connection pool reports of itself: the
// methods of pgxpool.Stat the pool's metrics read. AcquireCount counts
// every acquisition; EmptyAcquireCount those that found no idle connection
// and waited for one (a new one or a released one), and
// EmptyAcquireWaitTime their total wait.
type PoolStat interface {
	MaxConns() int32
	TotalConns() int32
	AcquiredConns() int32
	AcquireCount() int64
	EmptyAcquireCount() int64
	EmptyAcquireWaitTime() time.Duration
}

// poolCollector exports a PoolStat, read at scrape time (no I/O).
type poolCollector struct {
	stat                                          func() PoolStat
	max, total, acquired, acquires, waited, waitS *prometheus.Desc
}

// WatchPool registers the pool's size and its queueing: how many
// connections it may open and has open, how many statements hold one now,
// and how often and how long acquisitions waited for one. A pool too small
// for the work shows as a wait per acquisition that grows with the load
// while the database has cores to spare.
func WatchPool(reg prometheus.Registerer, stat func() PoolStat) {
	reg.MustRegister(&poolCollector{
		stat:     stat,
		max:      prometheus.NewDesc("paydedup_pg_pool_max_connections", "Connections the PostgreSQL pool may open (PAYDEDUP_PG_POOL_SIZE or pool_max_conns).", nil, nil),
		total:    prometheus.NewDesc("paydedup_pg_pool_connections", "Connections the PostgreSQL pool has open.", nil, nil),
		acquired: prometheus.NewDesc("paydedup_pg_pool_acquired_connections", "Connections held by a statement now.", nil, nil),
		acquires: prometheus.NewDesc("paydedup_pg_pool_acquires_total", "Connection acquisitions.", nil, nil),
		waited:   prometheus.NewDesc("paydedup_pg_pool_waited_acquires_total", "Acquisitions that found no idle connection and waited for one.", nil, nil),
		waitS:    prometheus.NewDesc("paydedup_pg_pool_acquire_wait_seconds_total", "Time acquisitions spent waiting for a connection.", nil, nil),
	})
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.max, c.total, c.acquired, c.acquires, c.waited, c.waitS} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stat()
	ch <- prometheus.MustNewConstMetric(c.max, prometheus.GaugeValue, float64(s.MaxConns()))
	ch <- prometheus.MustNewConstMetric(c.total, prometheus.GaugeValue, float64(s.TotalConns()))
	ch <- prometheus.MustNewConstMetric(c.acquired, prometheus.GaugeValue, float64(s.AcquiredConns()))
	ch <- prometheus.MustNewConstMetric(c.acquires, prometheus.CounterValue, float64(s.AcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.waited, prometheus.CounterValue, float64(s.EmptyAcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.waitS, prometheus.CounterValue, s.EmptyAcquireWaitTime().Seconds())
}
