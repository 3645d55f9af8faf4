package pgstore

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

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/ledger"
)

// Defaults for ListenerConfig.
const (
	DefaultReconnectMin   = 100 * time.Millisecond
	DefaultReconnectMax   = 5 * time.Second
	DefaultPingInterval   = 5 * time.Second
	DefaultPingTimeout    = 2 * time.Second
	DefaultConnectTimeout = 10 * time.Second
	DefaultPollInterval   = 2 * time.Second
)

// ListenerConfig configures a Listener.
type ListenerConfig struct {
	// ReconnectMin and ReconnectMax bound the pause between attempts to
	// re-establish the listening connection.
	ReconnectMin time.Duration
	ReconnectMax time.Duration
	// PingInterval is how long the listening connection may stay silent
	// before it is pinged; a ping that takes longer than PingTimeout (a
	// half-open connection: the server or the path to it is gone without a
	// reset) declares it dead, and it is replaced.
	PingInterval time.Duration
	PingTimeout  time.Duration
	// ConnectTimeout bounds establishing the listening connection.
	ConnectTimeout time.Duration
	// PollInterval is how often subscribers are woken while the listener is
	// down, so that waiters fall back to re-reading their row.
	PollInterval time.Duration
	Logger       *slog.Logger
}

// Listener wakes waiters when an idempotency key becomes completed. It
// holds one dedicated connection (not one of the pool's) that LISTENs on
// dedup.CompletedChannel, and fans notifications out to subscribers of the
// (merchant, key). Whenever that connection is (re)established it wakes
// every subscriber, since notifications sent while it was down are lost:
// a subscriber re-reads the row when woken, so a spurious wake costs one
// read and a missed one cannot happen. The connection is pinged whenever it
// has been silent for PingInterval, so a half-open one (which would
// otherwise wait forever, silently) is found dead and replaced; while it is
// down, Ready fails and every subscriber is woken each PollInterval, so
// waiters still see their row complete, by re-reading it.
type Listener struct {
	connCfg *pgx.ConnConfig
	cfg     ListenerConfig
	logger  *slog.Logger

	listening atomic.Bool
	mu        sync.Mutex
	subs      map[rowKey]map[*ledger.Subscription]struct{}
}

// NewListener returns a listener that connects like pool does (same
// server, user and search_path). Call Run to start listening.
func NewListener(pool *pgxpool.Pool, cfg ListenerConfig) (*Listener, error) {
	if pool == nil {
		return nil, errors.New("gateway store: nil pool")
	}
	cfg.ReconnectMin = cmp.Or(cfg.ReconnectMin, DefaultReconnectMin)
	cfg.ReconnectMax = cmp.Or(cfg.ReconnectMax, DefaultReconnectMax)
	cfg.PingInterval = cmp.Or(cfg.PingInterval, DefaultPingInterval)
	cfg.PingTimeout = cmp.Or(cfg.PingTimeout, DefaultPingTimeout)
	cfg.ConnectTimeout = cmp.Or(cfg.ConnectTimeout, DefaultConnectTimeout)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, DefaultPollInterval)
	if cfg.ReconnectMin < 0 || cfg.ReconnectMax < cfg.ReconnectMin {
		return nil, fmt.Errorf("gateway store: listener: reconnect bounds %v..%v are not a range", cfg.ReconnectMin, cfg.ReconnectMax)
	}
	if cfg.PingInterval < 0 || cfg.PingTimeout < 0 || cfg.ConnectTimeout < 0 || cfg.PollInterval < 0 {
		return nil, errors.New("gateway store: listener: ping, connect and poll durations must not be negative")
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Listener{
		connCfg: pool.Config().ConnConfig.Copy(),
		cfg:     cfg,
		logger:  logger,
		subs:    map[rowKey]map[*ledger.Subscription]struct{}{},
	}, nil
}

// Subscribe registers interest in (merchant, key). Subscribe before reading
// the row: a completion committed after the read then always wakes C,
// provided the key has an intake row (AcquireIntakes) by the time the worker
// completes it.
func (c *Listener) Subscribe(merchantID, key string) *ledger.Subscription {
	k := rowKey{merchantID, key}
	s := ledger.NewSubscription(func(s *ledger.Subscription) { c.unsubscribe(k, s) })
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.subs[k]
	if m == nil {
		m = map[*ledger.Subscription]struct{}{}
		c.subs[k] = m
	}
	m[s] = struct{}{}
	return s
}

// unsubscribe is a Subscription's Close.
func (c *Listener) unsubscribe(k rowKey, s *ledger.Subscription) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.subs[k]; m != nil {
		delete(m, s)
		if len(m) == 0 {
			delete(c.subs, k)
		}
	}
}

// Listening reports whether the listening connection is up (it answered
// its last ping). While it is not, waiters are woken every PollInterval to
// re-read their rows, and all of them once it comes back.
func (c *Listener) Listening() bool { return c.listening.Load() }

// Ready returns nil when listening; it suits a readiness check.
func (c *Listener) Ready(context.Context) error {
	if !c.Listening() {
		return errors.New("not listening for completions (waiters fall back to re-reading their rows)")
	}
	return nil
}

// Run listens until ctx ends, reconnecting with capped exponential backoff
// when the connection fails or stops answering its pings. It returns nil
// when ctx ends.
func (c *Listener) Run(ctx context.Context) error {
	pollDone := make(chan struct{})
	defer func() { <-pollDone }()
	go func() {
		defer close(pollDone)
		c.pollWhileDown(ctx)
	}()
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

// pollWhileDown wakes every subscriber each PollInterval while the listener
// is down, until ctx ends.
func (c *Listener) pollWhileDown(ctx context.Context) {
	t := time.NewTicker(c.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !c.Listening() {
				c.wakeAll()
			}
		}
	}
}

// listen runs one connection's lifetime.
func (c *Listener) listen(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, c.cfg.ConnectTimeout)
	conn, err := pgx.ConnectConfig(cctx, c.connCfg)
	if err != nil {
		cancel()
		return interpretError("connect completion listener", err)
	}
	defer func() {
		// Not listening from here on, even while a dead connection takes
		// its time to close.
		c.listening.Store(false)
		closeCtx, cancelClose := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancelClose()
		_ = conn.Close(closeCtx)
	}()
	var schema string
	if err := conn.QueryRow(cctx, `SELECT coalesce(current_schema(), '')`).Scan(&schema); err != nil {
		cancel()
		return interpretError("read current schema", err)
	}
	if _, err := conn.Exec(cctx, `LISTEN `+dedup.CompletedChannel); err != nil {
		cancel()
		return interpretError("listen for completions", err)
	}
	cancel()
	c.listening.Store(true)
	c.logger.Debug("listening for completions", "channel", dedup.CompletedChannel, "schema", schema)
	c.wakeAll() // anything may have completed while we were not listening
	for {
		wctx, cancelWait := context.WithTimeout(ctx, c.cfg.PingInterval)
		n, err := conn.WaitForNotification(wctx)
		cancelWait()
		if err != nil && ctx.Err() == nil && wctx.Err() != nil && !conn.IsClosed() {
			// Silent for PingInterval: a half-open connection looks just
			// like an idle one until it is asked something.
			pctx, cancelPing := context.WithTimeout(ctx, c.cfg.PingTimeout)
			err = conn.Ping(pctx)
			cancelPing()
			if err != nil {
				return interpretError("ping completion listener", err)
			}
			continue
		}
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

func (c *Listener) wake(k rowKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for s := range c.subs[k] {
		s.Wake()
	}
}

func (c *Listener) wakeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.subs {
		for s := range m {
			s.Wake()
		}
	}
}
