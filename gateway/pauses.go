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

// DelayNoWorker is a Delay's cause when no worker takes commands off the
// queue (Config.Idle): none is running, or none reaches NATS. Since is
// when a worker was last seen; absent when none ever was.
const DelayNoWorker = "no_worker"

// pauseCache holds the last read of the workers' pauses.
type pauseCache struct {
	// idle is Config.Idle: asked when no worker reports a pause.
	idle func(ctx context.Context) (bool, time.Time, error)

	mu    sync.Mutex
	read  time.Time
	delay *Delay
}

// get returns the workers' pause as a client sees it (nil: none), or, with
// none, that no worker consumes (DelayNoWorker), read at most once per
// pauseCacheFor. A failed read answers nil: the note only explains a wait,
// and the payment's state stands without it.
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
	} else if c.idle != nil {
		idle, since, err := c.idle(ctx)
		if err != nil {
			log.Warn("read whether a worker consumes", "error", err)
			return nil
		}
		if idle {
			d = &Delay{Cause: DelayNoWorker, Since: since}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.read, c.delay = time.Now(), d
	return d
}
