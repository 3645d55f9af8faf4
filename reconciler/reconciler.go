// Package reconciler owns the resolution of payments stuck in `pending`: rows
// whose holder crashed, or lost track of a provider call, so that nobody knows
// whether the provider charged. It also purges expired finished rows.
//
// A pass leases a batch of stuck rows ([dedup.Store.AcquireStuck]: FOR UPDATE
// SKIP LOCKED and a fenced lease, so any number of reconcilers in any number
// of pods never work on one row at once) and asks the provider, without
// charging, what happened under each row's key ([Looker]):
//
//   - the provider has a charge: the row is completed with it, and its ledger
//     row written, by the store call the worker uses ([dedup.Store.Complete]);
//   - the provider has a declined intent: the row is completed as declined;
//   - the provider has nothing: the row becomes `failed` (known not charged),
//     so that the next delivery may charge;
//   - the lookup could not tell: the row is released, still pending, with
//     its next lookup backed off, for a later pass or a redelivery.
//
// A write that finds its lease lost changes nothing and is not an error: a
// worker's redelivery or another reconciler got there first.
//
// # When "not found" proves that nothing was charged
//
// A not-found answer proves nothing while a charge under the row's key may
// still appear. One may appear after the last lease on the row ended: a
// worker's provider call is bounded by its lease, but only on our side. A
// request whose client timed out, or whose connection dropped, may still be
// executing at the provider, and charge when it finishes; and the charge
// then reaches the provider's search only after its index lag (Stripe's
// search is eventually consistent: "under normal operating conditions, data
// is searchable in less than a minute"). So SearchLag must cover both: the
// longest the provider may still execute a request after its caller gave
// up, plus its index lag. Stripe publishes no bound on the first; its own
// client libraries wait 80 s for an answer, so a request may run that long
// (StripeExecution). StripeMinSearchLag is their sum and DefaultSearchLag
// adds a margin; a shorter SearchLag is refused at start-up when the
// provider is Stripe (Config.MinSearchLag). A not-found that was premature
// anyway (an index outage longer than the lag) makes the row `failed`, and
// the next delivery re-calls under the same provider key, which the provider
// answers by replaying the charge while its key window lasts.
//
// The store overwrites a row's locked_until when it leases it, and a release
// sets it to the release time, so a reconciler cannot learn afterwards how long
// ago the previous lease ended: it knows only the bound it asked for. It
// therefore acquires only rows whose lease expired more than max(Grace,
// SearchLag) ago (on the database's clock, like every lease time). Every row
// it examines is then old enough for a not-found answer to be final, and a
// younger row is not touched at all (its redelivery, which re-calls the
// provider with the same key, usually settles it first). Grace is our own
// delay (leave recent rows to their redelivery); SearchLag is the
// provider's; the larger one applies.
//
// The alternative, leasing rows after Grace and releasing those not found yet,
// never ends for a row the provider has nothing under: each release restarts
// the row's lease clock, so the row is leased again after every Grace and
// never ages to SearchLag.
//
// # When lookups fail
//
// A failed lookup leaves the row pending and backs its lookups off
// ([dedup.Store.DeferLookup]): LookupBackoff, doubling on each consecutive
// failure up to LookupBackoffMax, so a provider outage does not become a
// lookup storm. The row's pending_since is kept, so operators see its stuck
// age grow; RunResult.LookupErrors counts the failures.
package reconciler

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
)

// Defaults for Config.
const (
	// DefaultInterval is the pause between the end of a pass and the next.
	DefaultInterval = 10 * time.Second
	// DefaultGrace is how long ago a row's lease must have expired before
	// the reconciler takes it from its redelivery.
	DefaultGrace = 30 * time.Second
	// StripeExecution is how long Stripe may still execute a request after
	// its caller gave up on it: Stripe publishes no bound, and its own client
	// libraries wait 80 s for an answer.
	StripeExecution = 80 * time.Second
	// StripeIndexLag is Stripe's search lag ("under normal operating
	// conditions, data is searchable in less than a minute").
	StripeIndexLag = time.Minute
	// StripeMinSearchLag is the shortest SearchLag that is sound with Stripe:
	// a charge that lands after our call gave up, then the index lag.
	StripeMinSearchLag = StripeExecution + StripeIndexLag
	// DefaultSearchLag is StripeMinSearchLag with a margin.
	DefaultSearchLag = 3 * time.Minute
	// DefaultLookupBackoff is the pause before a row's next lookup after
	// its first failed one; it doubles with each further failure.
	DefaultLookupBackoff = time.Minute
	// DefaultLookupBackoffMax caps the pause between a row's lookups.
	DefaultLookupBackoffMax = 30 * time.Minute
	// DefaultLease is the lease the reconciler takes on each row it works on.
	DefaultLease = 30 * time.Second
	// DefaultBatchSize is how many rows one pass leases.
	DefaultBatchSize = 100
	// DefaultPurgeBatch is how many rows one purge statement deletes at most.
	DefaultPurgeBatch = 500
	// DefaultMaxPurgeBatches bounds the purge statements of one pass.
	DefaultMaxPurgeBatches = 20
	// DefaultLookupTimeout bounds one provider lookup.
	DefaultLookupTimeout = 10 * time.Second
)

// releaseTimeout bounds giving rows back when a pass is cut short: the
// caller's context may already be done, and Stop waits for it.
const releaseTimeout = 5 * time.Second

// ErrInvalidConfig is wrapped by every configuration error of New.
var ErrInvalidConfig = errors.New("invalid reconciler config")

// Looker is the provider capability the reconciler needs: a lookup that
// never charges. *stripe.Client is one.
type Looker interface {
	// Lookup reports what the provider has under the key, or an error when
	// it cannot tell.
	Lookup(ctx context.Context, req provider.LookupRequest) (provider.LookupResult, error)
}

// Store is what the reconciler needs of the idempotency store;
// *dedup.Store implements it.
type Store interface {
	AcquireStuck(ctx context.Context, holder string, grace, lease time.Duration, limit int) ([]ledger.Stuck, error)
	Heartbeat(ctx context.Context, l ledger.Lease, d time.Duration) (ledger.Lease, error)
	ResolveNotCharged(ctx context.Context, l ledger.Lease, reason string) error
	Complete(ctx context.Context, l ledger.Lease, c ledger.Completion) error
	DeferLookup(ctx context.Context, l ledger.Lease, reason string, b ledger.Backoff) (int, time.Time, error)
	Release(ctx context.Context, l ledger.Lease, reason string) error
	Purge(ctx context.Context, limit int) (int, error)
	ProcessingPayments(ctx context.Context, cur ledger.ProcessingCursor, limit int) ([]ledger.Payment, ledger.ProcessingCursor, error)
	SettlePayment(ctx context.Context, p ledger.Payment, status string, responseStatus int, response json.RawMessage) error
}

// Metrics observes every pass; the ops layer implements it (e.g. with
// Prometheus counters).
type Metrics interface {
	// ObserveRun is called once at the end of every pass, with the error
	// RunOnce returns.
	ObserveRun(res RunResult, err error)
}

// Config configures a Reconciler. Zero values take the defaults; negative
// values are refused.
type Config struct {
	// Interval is the pause between passes started by Start.
	Interval time.Duration
	// Grace is how long ago a row's lease must have expired before the
	// reconciler takes it.
	Grace time.Duration
	// SearchLag is how long ago a row's lease must have expired before a
	// not-found lookup proves that nothing was charged: the longest the
	// provider may still execute a request after its caller gave up, plus
	// its search's index lag. Rows are taken only after max(Grace,
	// SearchLag); see the package documentation.
	SearchLag time.Duration
	// MinSearchLag is the shortest SearchLag the provider allows
	// (StripeMinSearchLag for Stripe); New refuses a shorter SearchLag.
	// Zero sets no floor: for a provider whose charges finish before it
	// answers and whose lookups are strongly consistent.
	MinSearchLag time.Duration
	// LookupBackoff is the pause before a row's next lookup after a failed
	// one, doubled on each consecutive failure up to LookupBackoffMax.
	LookupBackoff    time.Duration
	LookupBackoffMax time.Duration
	// Lease is the lease taken on each row worked on; it must exceed
	// LookupTimeout.
	Lease time.Duration
	// BatchSize is how many rows one pass leases.
	BatchSize int
	// PurgeBatch is how many rows one purge statement deletes at most.
	PurgeBatch int
	// MaxPurgeBatches bounds the purge statements of one pass.
	MaxPurgeBatches int
	// LookupTimeout bounds one provider lookup.
	LookupTimeout time.Duration
	// Holder is the lease holder id; "reconciler-<hostname>-<random>" when
	// empty.
	Holder string
	// Clock measures the time since a lease was taken; the system clock
	// when nil. It is used only for that (the store sets lease times from
	// the database's clock), so a host clock that is off changes nothing.
	// Tests pass the store's fake clock.
	Clock clock.Clock
	// Logger receives JSON-friendly records; discarded when nil.
	Logger *slog.Logger
	// Metrics, when set, observes every pass.
	Metrics Metrics
}

// withDefaults fills zero values and validates the result.
func (c Config) withDefaults() (Config, error) {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"Interval", c.Interval}, {"Grace", c.Grace}, {"SearchLag", c.SearchLag}, {"MinSearchLag", c.MinSearchLag},
		{"Lease", c.Lease}, {"LookupTimeout", c.LookupTimeout},
		{"LookupBackoff", c.LookupBackoff}, {"LookupBackoffMax", c.LookupBackoffMax},
	} {
		if d.v < 0 {
			return c, fmt.Errorf("%w: %s %s is negative", ErrInvalidConfig, d.name, d.v)
		}
	}
	for _, n := range []struct {
		name string
		v    int
	}{
		{"BatchSize", c.BatchSize}, {"PurgeBatch", c.PurgeBatch}, {"MaxPurgeBatches", c.MaxPurgeBatches},
	} {
		if n.v < 0 {
			return c, fmt.Errorf("%w: %s %d is negative", ErrInvalidConfig, n.name, n.v)
		}
	}
	c.Interval = cmp.Or(c.Interval, DefaultInterval)
	c.Grace = cmp.Or(c.Grace, DefaultGrace)
	c.SearchLag = cmp.Or(c.SearchLag, DefaultSearchLag)
	c.Lease = cmp.Or(c.Lease, DefaultLease)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.PurgeBatch = cmp.Or(c.PurgeBatch, DefaultPurgeBatch)
	c.MaxPurgeBatches = cmp.Or(c.MaxPurgeBatches, DefaultMaxPurgeBatches)
	c.LookupTimeout = cmp.Or(c.LookupTimeout, DefaultLookupTimeout)
	c.LookupBackoff = cmp.Or(c.LookupBackoff, DefaultLookupBackoff)
	c.LookupBackoffMax = cmp.Or(c.LookupBackoffMax, max(DefaultLookupBackoffMax, c.LookupBackoff))
	if c.SearchLag < c.MinSearchLag {
		// A charge the provider finishes after our call gave up, or that its
		// search shows late, would be declared not charged.
		return c, fmt.Errorf("%w: SearchLag %s is shorter than the provider's MinSearchLag %s (its execution after a caller gave up, plus its search lag)",
			ErrInvalidConfig, c.SearchLag, c.MinSearchLag)
	}
	if c.LookupBackoffMax < c.LookupBackoff {
		return c, fmt.Errorf("%w: LookupBackoffMax %s is shorter than LookupBackoff %s", ErrInvalidConfig, c.LookupBackoffMax, c.LookupBackoff)
	}
	if c.Lease <= c.LookupTimeout {
		// Otherwise the lease would lapse during every slow lookup and a
		// redelivery could take the row from under us.
		return c, fmt.Errorf("%w: Lease %s must exceed LookupTimeout %s", ErrInvalidConfig, c.Lease, c.LookupTimeout)
	}
	if c.Holder == "" {
		c.Holder = defaultHolder()
	}
	if c.Clock == nil {
		c.Clock = clock.System{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

func defaultHolder() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "reconciler-" + host + "-" + hex.EncodeToString(b[:])
}

// Reconciler resolves stuck pending rows and purges expired ones. It is safe
// to run many at once, in one process or many.
type Reconciler struct {
	store  Store
	looker Looker
	cfg    Config
	log    *slog.Logger
	// acquireAfter is max(Grace, SearchLag): see the package documentation.
	acquireAfter time.Duration
	// backoff paces the lookups of a row whose lookup failed.
	backoff ledger.Backoff
	// renewBelow is the lease time left under which a row's lease is renewed
	// before its lookup: the lookup plus half the rest of a fresh lease for
	// the write.
	renewBelow time.Duration

	mu     sync.Mutex
	cancel context.CancelFunc
	// processingCursor is where the next pass resumes its scan of
	// processing payments.
	processingCursor ledger.ProcessingCursor
	// refundCursor is where the next pass resumes its scan of refunds
	// the provider holds pending.
	refundCursor ledger.ProcessingCursor
	// saidNoRefundLooker: the error that the looker cannot look refunds
	// up is logged once.
	saidNoRefundLooker bool
	done               chan struct{}
}

// New validates cfg and returns a Reconciler working on store with looker.
func New(store Store, looker Looker, cfg Config) (*Reconciler, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidConfig)
	}
	if looker == nil {
		return nil, fmt.Errorf("%w: nil looker", ErrInvalidConfig)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Reconciler{
		store:        store,
		looker:       looker,
		cfg:          cfg,
		log:          cfg.Logger.With("holder", cfg.Holder),
		acquireAfter: max(cfg.Grace, cfg.SearchLag),
		backoff:      ledger.Backoff{Base: cfg.LookupBackoff, Max: cfg.LookupBackoffMax},
		renewBelow:   cfg.LookupTimeout + (cfg.Lease-cfg.LookupTimeout)/2,
	}, nil
}

// Holder returns the lease holder id the reconciler writes on rows it works on.
func (r *Reconciler) Holder() string { return r.cfg.Holder }

// Start runs a pass at once and then one every Interval after the previous
// ended, in a goroutine, until Stop is called or ctx ends. It fails if the
// reconciler is already started and not stopped.
func (r *Reconciler) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done != nil {
		return errors.New("start reconciler: already started")
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	r.cancel, r.done = cancel, done
	go func() {
		defer close(done)
		r.loop(ctx)
	}()
	return nil
}

// Stop ends the passes started by Start and waits for the running pass to
// end; rows it had not resolved yet are released. It is a no-op when the
// reconciler is not started.
func (r *Reconciler) Stop() {
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.cancel, r.done = nil, nil
	r.mu.Unlock()
	if done == nil {
		return
	}
	cancel()
	<-done
}

func (r *Reconciler) loop(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		if _, err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
			r.log.Error("reconciler pass failed", "error", err)
		}
		timer.Reset(r.cfg.Interval)
	}
}
