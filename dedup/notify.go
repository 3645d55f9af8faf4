package dedup

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// CompletedChannel is the LISTEN/NOTIFY channel on which migration 00003's
// trigger announces every idempotency_keys row that became completed and
// has a gateway intake row (only the gateway's keys can have waiters). Its
// payload is JSON: {"s": schema, "m": merchant_id, "k": idempotency_key}.
const CompletedChannel = "paydedup_key_completed"

// Defaults for CompletionsConfig.
const (
	DefaultReconnectMin = 100 * time.Millisecond
	DefaultReconnectMax = 5 * time.Second
)

// CompletionsConfig configures a Completions listener.
type CompletionsConfig struct {
	// ReconnectMin and ReconnectMax bound the pause between attempts to
	// re-establish the listening connection.
	ReconnectMin time.Duration
	ReconnectMax time.Duration
	Logger       *slog.Logger
}

// Completions wakes waiters when an idempotency key becomes completed. It
// holds one dedicated connection (not one of the pool's) that LISTENs on
// CompletedChannel, and fans notifications out to subscribers of the
// (merchant, key). Whenever that connection is (re)established it wakes
// every subscriber, since notifications sent while it was down are lost:
// a subscriber re-reads the row when woken, so a spurious wake costs one
// read and a missed one cannot happen.
type Completions struct {
	connCfg *pgx.ConnConfig
	cfg     CompletionsConfig
	logger  *slog.Logger

	listening atomic.Bool
	mu        sync.Mutex
	subs      map[rowKey]map[*Subscription]struct{}
}

// Subscription receives a value on C (buffered, coalescing) each time its
// key may have completed. Close it when done.
type Subscription struct {
	C <-chan struct{}

	c    chan struct{}
	k    rowKey
	comp *Completions
	once sync.Once
}

// Close unsubscribes. It is safe to call more than once.
func (s *Subscription) Close() {
	s.once.Do(func() {
		s.comp.mu.Lock()
		defer s.comp.mu.Unlock()
		if m := s.comp.subs[s.k]; m != nil {
			delete(m, s)
			if len(m) == 0 {
				delete(s.comp.subs, s.k)
			}
		}
	})
}

func (s *Subscription) wake() {
	select {
	case s.c <- struct{}{}:
	default: // a wake is already pending
	}
}

// NewCompletions returns a listener that connects like pool does (same
// server, user and search_path). Call Run to start listening.
func NewCompletions(pool *pgxpool.Pool, cfg CompletionsConfig) (*Completions, error) {
	if pool == nil {
		return nil, errors.New("dedup: nil pool")
	}
	cfg.ReconnectMin = cmp.Or(cfg.ReconnectMin, DefaultReconnectMin)
	cfg.ReconnectMax = cmp.Or(cfg.ReconnectMax, DefaultReconnectMax)
	if cfg.ReconnectMin < 0 || cfg.ReconnectMax < cfg.ReconnectMin {
		return nil, fmt.Errorf("dedup: completions: reconnect bounds %v..%v are not a range", cfg.ReconnectMin, cfg.ReconnectMax)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Completions{
		connCfg: pool.Config().ConnConfig.Copy(),
		cfg:     cfg,
		logger:  logger,
		subs:    map[rowKey]map[*Subscription]struct{}{},
	}, nil
}

// Subscribe registers interest in (merchant, key). Subscribe before reading
// the row: a completion committed after the read then always wakes C,
// provided the key has an intake row (AcquireIntake) by the time the worker
// completes it.
func (c *Completions) Subscribe(merchantID, key string) *Subscription {
	ch := make(chan struct{}, 1)
	s := &Subscription{C: ch, c: ch, k: rowKey{merchantID, key}, comp: c}
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.subs[s.k]
	if m == nil {
		m = map[*Subscription]struct{}{}
		c.subs[s.k] = m
	}
	m[s] = struct{}{}
	return s
}

// Listening reports whether the listening connection is up. While it is
// not, waiters are not woken until it comes back (then all are).
func (c *Completions) Listening() bool { return c.listening.Load() }

// Ready returns nil when listening; it suits a readiness check.
func (c *Completions) Ready(context.Context) error {
	if !c.Listening() {
		return errors.New("not listening for completions")
	}
	return nil
}

// Run listens until ctx ends, reconnecting with capped exponential backoff
// when the connection fails. It returns nil when ctx ends.
func (c *Completions) Run(ctx context.Context) error {
	delay := c.cfg.ReconnectMin
	for ctx.Err() == nil {
		err := c.listen(ctx)
		c.listening.Store(false)
		if ctx.Err() != nil {
			break
		}
		c.logger.Warn("completion listener disconnected; reconnecting", "error", err, "delay", delay.String())
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		delay = min(2*delay, c.cfg.ReconnectMax)
	}
	return nil
}

// listen runs one connection's lifetime.
func (c *Completions) listen(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := pgx.ConnectConfig(cctx, c.connCfg)
	if err != nil {
		cancel()
		return interpretError("connect completion listener", err)
	}
	defer func() {
		closeCtx, cancelClose := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancelClose()
		_ = conn.Close(closeCtx)
	}()
	var schema string
	if err := conn.QueryRow(cctx, `SELECT coalesce(current_schema(), '')`).Scan(&schema); err != nil {
		cancel()
		return interpretError("read current schema", err)
	}
	if _, err := conn.Exec(cctx, `LISTEN `+CompletedChannel); err != nil {
		cancel()
		return interpretError("listen for completions", err)
	}
	cancel()
	c.listening.Store(true)
	c.logger.Debug("listening for completions", "channel", CompletedChannel, "schema", schema)
	c.wakeAll() // anything may have completed while we were not listening
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return interpretError("wait for notification", err)
		}
		var p struct {
			Schema   string `json:"s"`
			Merchant string `json:"m"`
			Key      string `json:"k"`
		}
		if err := json.Unmarshal([]byte(n.Payload), &p); err != nil {
			c.logger.Warn("unreadable completion notification", "error", err)
			continue
		}
		if p.Schema == schema {
			c.wake(rowKey{p.Merchant, p.Key})
		}
	}
}

func (c *Completions) wake(k rowKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for s := range c.subs[k] {
		s.wake()
	}
}

func (c *Completions) wakeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.subs {
		for s := range m {
			s.wake()
		}
	}
}
