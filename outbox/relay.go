// Package outbox relays the payments' outcome events from the store, where
// each is written in the transaction that records its outcome (a
// transactional outbox), to the outcomes stream. Every worker runs a
// Relay: the store hands each event to one relay at a time, and a relay
// marks an event relayed only after the stream acknowledged it, so an
// event is published at least once; its stable id (Nats-Msg-Id) makes the
// stream store it once.
package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/paydedup/paydedup/ledger"
)

// Store is the outbox as the relay uses it (dedup.Store).
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

// Relay publishes the outbox's events. Start runs it; RunOnce is one pass.
type Relay struct {
	store     Store
	pub       Publisher
	cfg       Config
	log       *slog.Logger
	lastPurge time.Time

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// New returns a relay of store's events to pub.
func New(store Store, pub Publisher, cfg Config) (*Relay, error) {
	if store == nil || pub == nil {
		return nil, errors.New("outbox relay: needs a store and a publisher")
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
	return &Relay{store: store, pub: pub, cfg: cfg, log: log}, nil
}

// Result is what one pass did.
type Result struct {
	Relayed int // events marked relayed
	Purged  int // relayed events purged
}

// RunOnce relays one batch, and purges relayed events when the purge is
// due.
func (r *Relay) RunOnce(ctx context.Context) (Result, error) {
	var res Result
	n, err := r.store.RelayOutcomes(ctx, r.cfg.BatchSize, r.pub.PublishOutcomes)
	res.Relayed = n
	if err != nil {
		return res, fmt.Errorf("relay outcome events: %w", err)
	}
	if now := time.Now(); now.Sub(r.lastPurge) >= r.cfg.PurgeEvery {
		p, err := r.store.PurgeOutcomes(ctx, r.cfg.Retention, 10*r.cfg.BatchSize)
		res.Purged = p
		if err != nil {
			return res, fmt.Errorf("purge outcome events: %w", err)
		}
		r.lastPurge = now
	}
	return res, nil
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

// Stop ends the passes and waits for the running one. Events it held and
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
				r.log.Warn("relaying outcome events failed; retrying", "error", err)
			}
			failing = true
		case err == nil:
			if failing {
				r.log.Info("relaying outcome events works again")
			}
			failing = false
		}
		if res.Purged > 0 {
			r.log.Debug("purged relayed outcome events", "purged", res.Purged)
		}
		if err == nil && res.Relayed >= r.cfg.BatchSize {
			timer.Reset(0)
			continue
		}
		timer.Reset(r.cfg.Interval)
	}
}
