package gateway

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// pauseCacheFor is how long one read of the workers' pauses answers GETs:
// a GET of a waiting payment costs no query of its own under load, and a
// pause is seen within this of the worker's note.
const pauseCacheFor = time.Second

// pauseCache holds the last read of the workers' pauses.
type pauseCache struct {
	mu    sync.Mutex
	read  time.Time
	delay *Delay
}

// get returns the workers' pause as a client sees it (nil: none), read
// from store at most once per pauseCacheFor. A failed read answers nil:
// the note only explains a wait, and the payment's state stands without
// it.
func (c *pauseCache) get(ctx context.Context, store Store, log *slog.Logger) *Delay {
	c.mu.Lock()
	if time.Since(c.read) < pauseCacheFor {
		defer c.mu.Unlock()
		return c.delay
	}
	c.mu.Unlock()
	p, ok, err := store.WorkerPauses(ctx)
	if err != nil {
		log.Warn("read worker pauses", "error", err)
		return nil
	}
	var d *Delay
	if ok {
		d = &Delay{Cause: p.Cause, Since: p.Since, WorkersPaused: p.Workers}
		if !p.RetryAt.IsZero() {
			d.RetryAt = &p.RetryAt
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.read, c.delay = time.Now(), d
	return d
}
