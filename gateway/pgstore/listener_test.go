package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/ledger"
)

// pgProxy forwards TCP connections to Postgres and can fail like a network:
// refuse new connections, or freeze (hold every byte, in both directions,
// and leave new connections hanging), which is what a half-open connection
// looks like to its client.
type pgProxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	cond    *sync.Cond
	refuse  bool
	frozen  bool
	closed  bool
	conns   []net.Conn
	copiers sync.WaitGroup
}

func newPGProxy(t *testing.T, target string) *pgProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pgProxy{ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	p.copiers.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *pgProxy) port() uint16 { return uint16(p.ln.Addr().(*net.TCPAddr).Port) }

func (p *pgProxy) set(refuse, frozen bool) {
	p.mu.Lock()
	p.refuse, p.frozen = refuse, frozen
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *pgProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.refuse || p.closed {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns = append(p.conns, c)
		p.mu.Unlock()
		p.copiers.Go(func() {
			if !p.waitThawed() {
				return
			}
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = c.Close()
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, s)
			p.mu.Unlock()
			p.copiers.Go(func() { p.pipe(s, c) })
			p.pipe(c, s)
		})
	}
}

// waitThawed blocks while frozen; false once the proxy is closed.
func (p *pgProxy) waitThawed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.frozen && !p.closed {
		p.cond.Wait()
	}
	return !p.closed
}

// pipe copies src to dst, holding what it read while frozen.
func (p *pgProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.waitThawed() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_ = src.Close()
			}
			return
		}
	}
}

func (p *pgProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	conns := p.conns
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	p.copiers.Wait()
}

// listenerThrough returns a pool whose connections (which NewListener
// copies) go through p and carry application_name name.
func listenerThrough(t *testing.T, b *bundle, p *pgProxy, name string) *pgxpool.Pool {
	t.Helper()
	cfg := b.pool.Config().Copy()
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = "127.0.0.1", p.port(), nil
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	cfg.MinConns = 0
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// waitFor polls cond every 10 ms until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// waiter waits for (m_1, key) to complete the way the gateway's Prefer: wait
// does: subscribe, read the row, and re-read it each time it is woken. It
// returns a channel closed once it saw the row completed.
func waiter(ctx context.Context, b *bundle, comp *pgstore.Listener, key string) <-chan struct{} {
	sub := comp.Subscribe("m_1", key)
	done := make(chan struct{})
	go func() {
		defer sub.Close()
		for {
			if rec, err := b.worker.Get(ctx, "m_1", key); err == nil && rec.Status == ledger.StatusCompleted {
				close(done)
				return
			}
			select {
			case <-sub.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	return done
}

// runListener starts comp.Run and waits until it listens.
func runListener(t *testing.T, ctx context.Context, comp *pgstore.Listener) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- comp.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	if !waitFor(10*time.Second, comp.Listening) {
		t.Fatal("the listener never listened")
	}
}

// completeKey makes (m_1, key) a gateway key and completes it.
func completeKey(t *testing.T, b *bundle, key string) {
	t.Helper()
	if _, err := acquireOne(b.ctx, b.store, req("m_1", key, 100), time.Second, time.Hour); err != nil {
		t.Fatal(err)
	}
	l := b.claim(t, "h", req("m_1", key, 100)).Lease
	if err := b.worker.Complete(b.ctx, *l, charged("ch_"+key)); err != nil {
		t.Fatal(err)
	}
}

// TestListenerKilled: the listener's backend is killed
// (pg_terminate_backend) and the way back to Postgres refuses connections
// for a while. Readiness fails until the listener is back; a waiter whose
// key completes meanwhile (its notification is lost) still gets its answer
// by re-reading the row; once connections are accepted again the listener
// reconnects and readiness passes.
func TestListenerKilled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := newPGProxy(t, b.pool.Config().ConnConfig.Host+":"+strconv.Itoa(int(b.pool.Config().ConnConfig.Port)))
	name := fmt.Sprintf("paydedup-listener-%d", time.Now().UnixNano())
	comp, err := pgstore.NewListener(listenerThrough(t, b, p, name), pgstore.ListenerConfig{
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond,
		PingInterval: 200 * time.Millisecond, PingTimeout: 300 * time.Millisecond,
		ConnectTimeout: 500 * time.Millisecond, PollInterval: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	runListener(t, b.ctx, comp)
	if err := comp.Ready(b.ctx); err != nil {
		t.Fatalf("ready while listening: %v", err)
	}
	got := waiter(b.ctx, b, comp, "killed")

	p.set(true, false) // refuse reconnections
	var killed int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, name).
		Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminate the listener's backend: %d, %v", killed, err)
	}
	if !waitFor(5*time.Second, func() bool { return comp.Ready(b.ctx) != nil }) {
		t.Fatal("readiness still passes with the listener's backend killed")
	}
	completeKey(t, b, "killed")
	select {
	case <-got:
	case <-time.After(3 * time.Second):
		t.Fatal("the waiter did not get its answer while the listener was down")
	}
	if err := comp.Ready(b.ctx); err == nil {
		t.Fatal("readiness passed before the listener could reconnect")
	}

	p.set(false, false)
	if !waitFor(10*time.Second, func() bool { return comp.Ready(b.ctx) == nil }) {
		t.Fatal("the listener did not reconnect")
	}
	woken := waiter(b.ctx, b, comp, "after")
	completeKey(t, b, "after")
	select {
	case <-woken:
	case <-time.After(5 * time.Second):
		t.Fatal("a waiter was not woken after the listener reconnected")
	}
}

// TestListenerHalfOpen: the path to Postgres goes silent without
// a reset (a half-open connection: no error ever reaches the listener). The
// listener's ping finds it dead: readiness fails, a waiter whose key
// completes meanwhile gets its answer by re-reading the row, and once the
// path comes back the listener reconnects and readiness passes.
func TestListenerHalfOpen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := newPGProxy(t, b.pool.Config().ConnConfig.Host+":"+strconv.Itoa(int(b.pool.Config().ConnConfig.Port)))
	comp, err := pgstore.NewListener(listenerThrough(t, b, p, "paydedup-half-open"), pgstore.ListenerConfig{
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond,
		PingInterval: 200 * time.Millisecond, PingTimeout: 300 * time.Millisecond,
		ConnectTimeout: 500 * time.Millisecond, PollInterval: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	runListener(t, b.ctx, comp)
	got := waiter(b.ctx, b, comp, "half-open")

	p.set(false, true)
	if !waitFor(5*time.Second, func() bool { return comp.Ready(b.ctx) != nil }) {
		t.Fatal("readiness still passes over a half-open listening connection")
	}
	completeKey(t, b, "half-open")
	select {
	case <-got:
	case <-time.After(3 * time.Second):
		t.Fatal("the waiter did not get its answer while the listener was half-open")
	}
	p.set(false, false)
	if !waitFor(10*time.Second, func() bool { return comp.Ready(b.ctx) == nil }) {
		t.Fatal("the listener did not reconnect")
	}
}
