package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/paydedup/paydedup/dedup"
)

// outboxLag samples the outbox's backlog while the timed payments run.
type outboxLag struct {
	mu        sync.Mutex
	maxAge    time.Duration
	maxCount  int64
	drainedIn time.Duration
	stop      context.CancelFunc
	done      chan struct{}
}

func watchOutbox(ctx context.Context, store *dedup.Store) *outboxLag {
	ctx, cancel := context.WithCancel(ctx)
	l := &outboxLag{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			l.sample(ctx, store)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return l
}

func (l *outboxLag) sample(ctx context.Context, store *dedup.Store) int64 {
	b, err := store.OutcomeBacklog(ctx)
	if err != nil {
		return -1
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.maxCount = max(l.maxCount, b.Unrelayed)
	if !b.Oldest.IsZero() {
		l.maxAge = max(l.maxAge, b.Now.Sub(b.Oldest))
	}
	return b.Unrelayed
}

// drained waits until the outbox is empty, at most a minute, and stops the
// sampling.
func (l *outboxLag) drained(ctx context.Context, store *dedup.Store, settled time.Time) error {
	defer func() { l.stop(); <-l.done }()
	deadline := time.Now().Add(time.Minute)
	for l.sample(ctx, store) != 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: the outbox still holds unrelayed events a minute after the last settle")
		}
		time.Sleep(100 * time.Millisecond)
	}
	l.mu.Lock()
	l.drainedIn = time.Since(settled)
	l.mu.Unlock()
	return nil
}

func (l *outboxLag) result() (lagMS float64, unrelayed int64, drainMS float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return float64(l.maxAge) / float64(time.Millisecond), l.maxCount, float64(l.drainedIn) / float64(time.Millisecond)
}
