// Package outbox relays transactional outboxes to their streams: the
// payments' outcome events, each written in the transaction that records
// its outcome, to the outcomes stream (Outcomes), and the commands
// publishers commit in their own transactions to the payments stream (the
// intake package's source). Every worker runs one Relay over every
// source: a source hands each row to one relay at a time, and marks it
// relayed only after the stream acknowledged it, so a row is published at
// least once; its stable id (Nats-Msg-Id) makes the stream store it once.
package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/paydedup/paydedup/ledger"
)

// Source is one outbox a Relay drains.
type Source interface {
	// Name names the source in the relay's logs.
	Name() string
	// Relay publishes up to limit rows no other relay holds, marks those
	// the stream acknowledged (or that a source settles otherwise, such
	// as a row refused for good) and returns how many it marked.
	Relay(ctx context.Context, limit int) (int, error)
	// Purge deletes up to limit rows relayed more than retention ago.
	Purge(ctx context.Context, retention time.Duration, limit int) (int, error)
}

// Outcomes is the source of the outcome events: store's outbox published
// by pub.
func Outcomes(store Store, pub Publisher) Source { return outcomes{store, pub} }

type outcomes struct {
	store Store
	pub   Publisher
}

func (outcomes) Name() string { return "outcome events" }

func (o outcomes) Relay(ctx context.Context, limit int) (int, error) {
	return o.store.RelayOutcomes(ctx, limit, o.pub.PublishOutcomes)
}

func (o outcomes) Purge(ctx context.Context, retention time.Duration, limit int) (int, error) {
	return o.store.PurgeOutcomes(ctx, retention, limit)
}

// Store is the outbox of outcome events as the relay uses it (dedup.Store).
type Store interface {
	// RelayOutcomes takes up to limit unrelayed events no other relay
	// holds, at most the earliest unrelayed one of each payment, oldest
	// first, calls publish with them while it holds them, and marks
	// relayed those publish reports done. It returns how many it marked.
	RelayOutcomes(ctx context.Context, limit int, publish func(context.Context, []ledger.OutcomeEvent) ([]bool, error)) (int, error)
	// PurgeOutcomes deletes up to limit events relayed more than
	// retention ago.
	PurgeOutcomes(ctx context.Context, retention time.Duration, limit int) (int, error)
}

// Publisher sends events to the outcomes stream in order and reports
// which the stream acknowledged (stream.OutcomePublisher).
type Publisher interface {
	PublishOutcomes(ctx context.Context, events []ledger.OutcomeEvent) ([]bool, error)
}

// Defaults of Config.
const (
	DefaultInterval  = time.Second
	DefaultBatchSize = 256
	DefaultRetention = 24 * time.Hour
	// DefaultPurgeEvery is how often a relay purges relayed events.
	DefaultPurgeEvery = time.Minute
)

// Config configures a Relay. Zero values take the defaults.
type Config struct {
	// Interval is the wait between passes that found the outbox empty;
	// a full batch is followed by the next at once.
	Interval  time.Duration
	BatchSize int
	// Retention is how long a relayed event stays in the outbox.
	Retention  time.Duration
	PurgeEvery time.Duration
	Logger     *slog.Logger
}

// Relay publishes its sources' rows. Start runs it; RunOnce is one pass.
type Relay struct {
	sources []Source
	cfg     Config
	log     *slog.Logger
	// lastPurge is when each source (by index) last purged in full.
	lastPurge []time.Time

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// New returns a relay of sources, one batch of each per pass.
func New(cfg Config, sources ...Source) (*Relay, error) {
	if len(sources) == 0 || slices.Contains(sources, nil) {
		return nil, errors.New("outbox relay: needs a source")
	}
	for _, s := range sources {
		if o, ok := s.(outcomes); ok && (o.store == nil || o.pub == nil) {
			return nil, errors.New("outbox relay: outcome events need a store and a publisher")
		}
	}
	if cfg.Interval < 0 || cfg.BatchSize < 0 || cfg.Retention < 0 || cfg.PurgeEvery < 0 {
		return nil, errors.New("outbox relay: interval, batch size, retention and purge period must not be negative")
	}
	cfg.Interval = cmp.Or(cfg.Interval, DefaultInterval)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, DefaultBatchSize)
	cfg.Retention = cmp.Or(cfg.Retention, DefaultRetention)
	cfg.PurgeEvery = cmp.Or(cfg.PurgeEvery, DefaultPurgeEvery)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Relay{sources: sources, cfg: cfg, log: log, lastPurge: make([]time.Time, len(sources))}, nil
}

// Result is what one pass did.
type Result struct {
	Relayed int  // rows marked, every source's
	Purged  int  // relayed rows purged
	Full    bool // a source filled its batch: more may be waiting
}

// RunOnce relays one batch of each source, and purges each source's
// relayed rows when its purge is due. A source that fails, to relay or to
// purge, keeps no other from its batch or its purge, nor itself from its
// purge: one whose relay fails every pass (a row it cannot publish)
// still purges what it relayed. A failed purge is retried on the next
// pass. The error joins every source's.
func (r *Relay) RunOnce(ctx context.Context) (Result, error) {
	var (
		res  Result
		errs []error
	)
	for _, s := range r.sources {
		n, err := s.Relay(ctx, r.cfg.BatchSize)
		res.Relayed += n
		res.Full = res.Full || n >= r.cfg.BatchSize
		if err != nil {
			errs = append(errs, fmt.Errorf("relay %s: %w", s.Name(), err))
		}
	}
	now := time.Now()
	for i, s := range r.sources {
		if now.Sub(r.lastPurge[i]) < r.cfg.PurgeEvery {
			continue
		}
		p, err := s.Purge(ctx, r.cfg.Retention, 10*r.cfg.BatchSize)
		res.Purged += p
		if err != nil {
			errs = append(errs, fmt.Errorf("purge %s: %w", s.Name(), err))
			continue
		}
		r.lastPurge[i] = now
	}
	return res, errors.Join(errs...)
}

// Start runs passes until ctx ends or Stop is called.
func (r *Relay) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done != nil {
		return errors.New("start outbox relay: already started")
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

// Stop ends the passes and waits for the running one. Rows it held and
// had not marked stay unrelayed for the next relay.
func (r *Relay) Stop() {
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

func (r *Relay) loop(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		res, err := r.RunOnce(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			if !failing {
				r.log.Warn("relaying an outbox failed; retrying", "error", err)
			}
			failing = true
		case err == nil:
			if failing {
				r.log.Info("relaying the outboxes works again")
			}
			failing = false
		}
		if res.Purged > 0 {
			r.log.Debug("purged relayed outbox rows", "purged", res.Purged)
		}
		if res.Full {
			timer.Reset(0)
			continue
		}
		timer.Reset(r.cfg.Interval)
	}
}
