// Package consumer is paydedup's worker: it fetches payment commands from
// the durable consumer (the topology is stream's), claims each batch in one
// round trip, calls the provider, group-commits the outcomes, and acks,
// naks with a delay, or dead-letters each message. It files the dead
// letters (authenticated, within max_payload), runs the durable
// max-deliveries net for messages whose worker died on every delivery,
// continues the publisher's trace, and drains on shutdown.
//
// The business step, claim → provider → complete, lives in Processor and
// never sees a jetstream.Msg; Worker is the adapter around it. One function,
// decide, maps every result to the message's fate.
//
// The rules it keeps, per message:
//   - a message is acked only after its outcome is committed in Postgres;
//   - every message ends acked, dead-lettered with a reason (the dead letter's
//     PubAck awaited before Term), or nakked to be redelivered; never dropped;
//   - timeouts nest: the provider's retry budget < the lease < AckWait, so a
//     lease cannot expire while its holder may still be calling the provider,
//     and JetStream cannot redeliver while the lease is held (Validate
//     refuses a configuration that breaks this).
//
// It works with nats-server 2.9: Term (never TermWithReason), one filter
// subject, no 2.10 features.
package consumer

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"time"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/stream"
)

// Defaults of the worker's settings; the topology's are stream's.
const (
	DefaultLease        = 45 * time.Second
	DefaultConcurrency  = 1000 // the ceiling of the adaptive call limit
	DefaultFetchBatch   = 200
	DefaultDrainTimeout = 20 * time.Second
	DefaultKeyRetention = 48 * time.Hour
	DefaultRetryBase    = time.Second
	DefaultRetryMax     = time.Minute
	DefaultCommitBatch  = 200
	DefaultCommitWait   = 10 * time.Millisecond

	// DefaultMaxWaitUnderLease bounds how long a payment waits under one
	// claim for a call slot and the provider's rate limit.
	DefaultMaxWaitUnderLease = 15 * time.Minute
)

// DefaultPoolSize is the PostgreSQL pool "paydedup worker" opens unless
// DATABASE_URL sets pool_max_conns: two connections per processor the
// worker may use (GOMAXPROCS), and at least 4. Every statement of the worker
// holds one connection and never waits for a second (a claim, a group
// commit, a release, a heartbeat, a reconciler scan), so a small pool only
// queues statements; what it bounds is how many backends the server runs
// for this worker, and fewer backends cost the server less CPU per payment
// (docs/performance.md).
func DefaultPoolSize() int { return max(4, 2*runtime.GOMAXPROCS(0)) }

// The bounds of Config.Lanes (see lane.go).
const (
	// DefaultLanes is the command's default Config.Lanes.
	DefaultLanes = 16
	// MaxLanes bounds Config.Lanes: each lane is a consumer on the
	// server and a fetch per worker every lanePoll.
	MaxLanes = 256
)

// Config configures the worker, and holds the topology it works on. Zero
// values take the defaults; Validate reports contradictions by the
// setting's name.
type Config struct {
	// Stream is the topology: streams, subjects, the durable consumer, the
	// DLQ key and the payment limits. EnsureStreams sets it up.
	Stream stream.Config

	// Lease is how long a claim lets this worker call the provider before
	// another may take over. It must exceed the provider retry budget and be
	// shorter than AckWait (and every BackOff step).
	Lease       time.Duration
	ProviderTry provider.RetryPolicy

	// MaxWaitUnderLease bounds the time a payment waits under one claim
	// (for a call slot and for the provider's rate limit) before it calls:
	// past it the row is released and the message retried, so that the
	// next claim checks the provider key window again. The key window plus
	// it plus the lease must stay under provider.KeyLifetime, or a call
	// made after a long wait can meet a provider that forgot the key.
	MaxWaitUnderLease time.Duration

	// CommitBatch and CommitWait shape the group commit of completions: a
	// transaction is flushed at CommitBatch rows or CommitWait after its
	// first row, whichever comes first. CommitBatch 1 commits each alone.
	CommitBatch int
	CommitWait  time.Duration

	// Concurrency is the ceiling of the provider calls in flight per
	// process. The number in flight adapts between MinConcurrency (or
	// Concurrency, if lower) and it, by the provider's latency and answers
	// (see callLimit); the ceiling bounds the memory they take.
	Concurrency  int
	FetchBatch   int // messages per fetch; claimed in one round trip
	DrainTimeout time.Duration

	// KeyRetention is the store's retention of finished keys. It must
	// outlive the redelivery schedule of a claimed message
	// (RedeliverySchedule), or a late redelivery could find its key purged
	// and charge again. The stream has no max age: a message never fetched
	// has no key, and a fetched one is redelivered within the schedule
	// while workers fetch.
	KeyRetention time.Duration

	// RetryBase and RetryMax shape the nak delay after a failure that is
	// safe to retry: RetryBase doubling per delivery, capped at RetryMax.
	RetryBase time.Duration
	RetryMax  time.Duration

	// PauseFirst and PauseLongest space the probes of a paused worker:
	// PauseFirst after the provider or PostgreSQL is found unavailable (or
	// the API key refused), doubling on each failed probe up to
	// PauseLongest.
	PauseFirst   time.Duration
	PauseLongest time.Duration

	// NetRequeues is how many times a message whose deliveries ran out
	// without an outcome is published again, as a new message with
	// deliveries of its own, before it is filed max_deliveries: by the
	// max-deliveries net when no worker settled its last delivery (the
	// workers that held it were killed or stopped), by the worker when its
	// last delivery ended without an outcome (a 429, a 5xx, a held lease:
	// the deliveries before may have been spent by kills). It bounds the
	// deliveries of a message that kills every worker, or fails alone every
	// time, to (NetRequeues+1) × MaxDeliver. Zero (not defaulted) files at
	// once.
	NetRequeues int

	// Lanes is how many lanes (per-merchant consumers beside the shared
	// one, see lane.go) the workers open while the shared consumer has a
	// backlog, so that the merchants behind another's backlog are served
	// meanwhile. Zero (not defaulted) opens none; the command's default
	// is DefaultLanes.
	Lanes int

	// TrimInterval is how often the worker purges the commands the workers
	// settled from the payments stream (it has no max age).
	TrimInterval time.Duration

	Holder string // lease holder id; default host name + random suffix

	// Clock is the worker's clock: the time a dead letter records as its
	// Dlq-Failed-At, the pause gate's pauses and probes and the waits for
	// them (the fetch loop's, a held message's: clock.NewTimer), the
	// longest wait under one claim (MaxWaitUnderLease) and the lanes' idle
	// times; clock.System when nil. Durations the worker measures
	// (latencies, the call limit's windows) and the deadlines of its
	// contexts and timers tied to the server or the database (AckWait and
	// the in-progress beat that restarts it, settling) use the monotonic
	// clock, and lease times are the database's.
	Clock clock.Clock
}

// DefaultNetRequeues is the command's default NetRequeues: with the
// default MaxDeliver, 60 deliveries before a message whose workers all
// die holding it is filed.
const DefaultNetRequeues = 2

// WithDefaults returns c with every zero value replaced by its default.
func (c Config) WithDefaults() Config {
	c.Stream = c.Stream.WithDefaults()
	c.Lease = cmp.Or(c.Lease, DefaultLease)
	c.MaxWaitUnderLease = cmp.Or(c.MaxWaitUnderLease, DefaultMaxWaitUnderLease)
	c.ProviderTry = c.ProviderTry.WithDefaults()
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.FetchBatch = cmp.Or(c.FetchBatch, DefaultFetchBatch)
	c.CommitBatch = cmp.Or(c.CommitBatch, DefaultCommitBatch)
	c.CommitWait = cmp.Or(c.CommitWait, DefaultCommitWait)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, DefaultDrainTimeout)
	c.KeyRetention = cmp.Or(c.KeyRetention, DefaultKeyRetention)
	c.RetryBase = cmp.Or(c.RetryBase, DefaultRetryBase)
	c.RetryMax = cmp.Or(c.RetryMax, DefaultRetryMax)
	c.TrimInterval = cmp.Or(c.TrimInterval, DefaultTrimInterval)
	c.PauseFirst = cmp.Or(c.PauseFirst, AuthPauseFirst)
	c.PauseLongest = cmp.Or(c.PauseLongest, AuthPauseLongest)
	if c.Holder == "" {
		host, _ := os.Hostname()
		c.Holder = fmt.Sprintf("%s-%d-%x", cmp.Or(host, "worker"), os.Getpid(), rand.Uint32()&0xffffff)
	}
	if c.Clock == nil {
		c.Clock = clock.System{}
	}
	return c
}

// Validate checks that the configuration is coherent: the topology's own
// rules (stream.Config.Validate), the timeouts nest and keys outlive their
// messages. Errors name the setting to fix.
func (c Config) Validate() error {
	errs := []error{c.Stream.Validate()}
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	s := c.Stream
	for name, d := range map[string]time.Duration{
		"lease": c.Lease, "drain timeout": c.DrainTimeout, "key retention": c.KeyRetention,
		"retry base": c.RetryBase, "retry max": c.RetryMax, "pause first": c.PauseFirst, "pause longest": c.PauseLongest,
		"trim interval": c.TrimInterval, "max wait under lease": c.MaxWaitUnderLease,
	} {
		if d <= 0 {
			bad("%s must be positive, got %v", name, d)
		}
	}
	if c.Concurrency < 1 || c.FetchBatch < 1 || s.MaxAckPending < 1 {
		bad("concurrency, fetch batch and max ack pending must be at least 1 (got %d, %d, %d)", c.Concurrency, c.FetchBatch, s.MaxAckPending)
	}
	if c.Lanes < 0 || c.Lanes > MaxLanes {
		bad("lanes must be within 0..%d (0 opens none), got %d: set PAYDEDUP_LANES within it", MaxLanes, c.Lanes)
	}
	if c.NetRequeues < 0 {
		bad("net requeues must not be negative, got %d", c.NetRequeues)
	}
	if c.PauseFirst > c.PauseLongest {
		bad("the first pause %v must not exceed the longest %v", c.PauseFirst, c.PauseLongest)
	}
	if c.CommitBatch < 1 || c.CommitWait < 0 || c.CommitWait > time.Second {
		bad("commit batch must be at least 1 and commit wait within 0..1s (got %d, %v)", c.CommitBatch, c.CommitWait)
	}
	if s.MaxAckPending < c.Concurrency {
		bad("max ack pending (%d) must be at least the concurrency (%d), or workers starve", s.MaxAckPending, c.Concurrency)
	}
	if budget := c.ProviderTry.Budget(); budget >= c.Lease {
		bad("lease %v must exceed the provider retry budget %v (attempt timeout × tries + backoff): raise the lease or lower the provider timeout/tries", c.Lease, budget)
	}
	if c.Lease >= s.AckWait {
		bad("ack wait %v must exceed the lease %v, or JetStream redelivers while the lease is held", s.AckWait, c.Lease)
	}
	for i, b := range s.BackOff {
		if b <= c.Lease {
			bad("backoff step %d (%v) must exceed the lease %v", i, b, c.Lease)
		}
	}
	if sched := RedeliverySchedule(c); c.KeyRetention <= sched {
		bad("key retention %v must exceed the redelivery schedule %v ((net requeues+1) × max deliver × the longest of ack wait, retry max and the backoff steps), or a late redelivery could find its key purged and charge again", c.KeyRetention, sched)
	}
	if need := DuplicateWindowNeed(c); s.DuplicateWindow <= need {
		bad("duplicate window %v must exceed %v (ack wait + retry base + the max-deliveries net's retry and fetch), or a requeue whose PubAck was lost can be stored twice", s.DuplicateWindow, need)
	}
	return errors.Join(errs...)
}

// RedeliverySchedule bounds how long after a key's claim its message can
// still be redelivered while the workers fetch: each of MaxDeliver
// deliveries waits at most the longest of AckWait, RetryMax and the
// BackOff steps, and the message may be published again NetRequeues
// times with deliveries of its own. A key must outlive it.
func RedeliverySchedule(c Config) time.Duration {
	s := c.Stream
	step := max(s.AckWait, c.RetryMax, c.Lease)
	for _, b := range s.BackOff {
		step = max(step, b)
	}
	return time.Duration(c.NetRequeues+1) * time.Duration(s.MaxDeliver) * step
}

// DuplicateWindowNeed is the shortest duplicate window that keeps a
// requeue stored once: a requeue whose PubAck was lost is published again,
// under the same Nats-Msg-Id, by the max-deliveries net once the server
// gives up on the original (its nak delay, RetryBase, or AckWait when the
// term was lost) and the net has fetched the advisory and waited its
// retry.
func DuplicateWindowNeed(c Config) time.Duration {
	return max(c.Stream.AckWait, c.RetryBase) + fetchWait + maxDeliverRetry
}
