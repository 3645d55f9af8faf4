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
//   - the lookup could not tell: the row is released, still pending, for a
//     later pass or a redelivery.
//
// A write that finds its lease lost changes nothing and is not an error: a
// worker's redelivery or another reconciler got there first.
//
// # When "not found" proves that nothing was charged
//
// Stripe's search is eventually consistent: a charge made at time T may only
// be found from T+lag. A charge under a row's key can only be made while a
// worker holds the row's lease (the worker's provider timeouts nest inside its
// lease, and the reconciler never charges), so a not-found answer proves that
// nothing was charged only once the row's last lease ended at least SearchLag
// ago.
//
// The store overwrites a row's locked_until when it leases it, and a release
// sets it to the release time, so a reconciler cannot learn afterwards how long
// ago the previous lease ended: it knows only the bound it asked for. It
// therefore acquires only rows whose lease expired more than max(Grace,
// SearchLag) ago. Every row it examines is then old enough for a not-found
// answer to be final, and a younger row is not touched at all (its redelivery,
// which re-calls the provider with the same key, usually settles it first).
// Grace is our own delay (leave recent rows to their redelivery); SearchLag is
// the provider's (set it to at least the provider's search lag); the larger
// one applies. With a provider whose lookup is strongly consistent, set
// SearchLag to at most Grace.
//
// The alternative, leasing rows after Grace and releasing those not found yet,
// never ends for a row the provider has nothing under: each release restarts
// the row's lease clock, so the row is leased again after every Grace and
// never ages to SearchLag.
package reconciler

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/provider"
)

// Defaults for Config.
const (
	// DefaultInterval is the pause between the end of a pass and the next.
	DefaultInterval = 10 * time.Second
	// DefaultGrace is how long ago a row's lease must have expired before
	// the reconciler takes it from its redelivery.
	DefaultGrace = 30 * time.Second
	// DefaultSearchLag covers Stripe's search lag ("usually under a minute").
	DefaultSearchLag = 60 * time.Second
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
// never charges. *provider.Stripe is one.
type Looker interface {
	// Lookup reports what the provider has under the key, or an error when
	// it cannot tell.
	Lookup(ctx context.Context, req provider.LookupRequest) (provider.LookupResult, error)
}

// Clock tells the time. The reconciler uses it only to measure how long it
// has held a lease (the store sets lease times from the database's clock),
// so a host clock that is off changes nothing. Tests pass the store's fake
// clock.
type Clock interface {
	Now() time.Time
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
	// not-found lookup proves that nothing was charged. Rows are taken only
	// after max(Grace, SearchLag); see the package documentation.
	SearchLag time.Duration
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
	// when nil.
	Clock Clock
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
		{"Interval", c.Interval}, {"Grace", c.Grace}, {"SearchLag", c.SearchLag},
		{"Lease", c.Lease}, {"LookupTimeout", c.LookupTimeout},
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
	if c.Lease <= c.LookupTimeout {
		// Otherwise the lease would lapse during every slow lookup and a
		// redelivery could take the row from under us.
		return c, fmt.Errorf("%w: Lease %s must exceed LookupTimeout %s", ErrInvalidConfig, c.Lease, c.LookupTimeout)
	}
	if c.Holder == "" {
		c.Holder = defaultHolder()
	}
	if c.Clock == nil {
		c.Clock = systemClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

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
	store  *dedup.Store
	looker Looker
	cfg    Config
	log    *slog.Logger
	// acquireAfter is max(Grace, SearchLag): see the package documentation.
	acquireAfter time.Duration
	// renewBelow is the lease time left under which a row's lease is renewed
	// before its lookup: the lookup plus half the rest of a fresh lease for
	// the write.
	renewBelow time.Duration

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// New validates cfg and returns a Reconciler working on store with looker.
func New(store *dedup.Store, looker Looker, cfg Config) (*Reconciler, error) {
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
