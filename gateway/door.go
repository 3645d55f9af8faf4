package gateway

import (
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/paydedup/paydedup/internal/clock"
)

// Defaults of the door limits (Config).
const (
	// DefaultAuthFailures is how many failed authentications a source
	// address may make at once; DefaultAuthFailureWindow is how long it
	// takes to earn as many back. Beyond them its requests are 429 before
	// any API key is looked up.
	DefaultAuthFailures      = 20
	DefaultAuthFailureWindow = time.Minute
	// DefaultMaxConns bounds the gateway's open connections.
	DefaultMaxConns = 1024
	// authSources bounds the source addresses the throttle remembers.
	authSources = 10000
)

// ProblemAuthThrottled is a request from a source address that failed to
// authenticate too often (429 with Retry-After).
const ProblemAuthThrottled = problemTypePrefix + "authentication-throttled"

const problemDetailAuthThrottled = "Too many requests from your address failed to authenticate; retry after Retry-After with a valid API key."

// authThrottle counts failed authentications per source address: a token
// bucket each (rate.Limiter), of Config.AuthFailures spent one per failure
// and earned back over Config.AuthFailureWindow. A source with an empty
// bucket is refused before its key is looked up, so guessing keys costs
// the database nothing beyond the burst. The map is bounded: when full,
// sources whose buckets have filled again (they carry no state) are
// dropped, and failing that one at random, so a flood from many addresses
// weakens the throttle for some of them but never grows memory.
type authThrottle struct {
	limit rate.Limit
	burst int
	clock clock.Clock
	max   int

	mu      sync.Mutex
	sources map[netip.Prefix]*rate.Limiter
}

func newAuthThrottle(failures int, window time.Duration, c clock.Clock) *authThrottle {
	if failures <= 0 {
		return nil // off
	}
	return &authThrottle{limit: rate.Limit(float64(failures) / window.Seconds()), burst: failures, clock: c,
		max: authSources, sources: map[netip.Prefix]*rate.Limiter{}}
}

// source is the throttle's key for a remote address: the address, or its
// /64 for IPv6 (one host usually holds a whole /64). ok is false for an
// address that is not IP (a Unix socket): such a request is not throttled.
func source(remoteAddr string) (netip.Prefix, bool) {
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return netip.Prefix{}, false
	}
	a := ap.Addr().Unmap()
	bits := 32
	if a.Is6() {
		bits = 64
	}
	p, err := a.Prefix(bits)
	return p, err == nil
}

// blocked reports whether src may not try another authentication now, and
// when it may.
func (t *authThrottle) blocked(src netip.Prefix) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.sources[src]
	if !ok {
		return 0, false
	}
	now := t.clock.Now()
	if tokens := l.TokensAt(now); tokens < 1 {
		return time.Duration((1 - tokens) / float64(t.limit) * float64(time.Second)), true
	}
	return 0, false
}

// fail spends one of src's failures.
func (t *authThrottle) fail(src netip.Prefix) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock.Now()
	l, ok := t.sources[src]
	if !ok {
		if len(t.sources) >= t.max {
			t.evict(now)
		}
		l = rate.NewLimiter(t.limit, t.burst)
		t.sources[src] = l
	}
	l.AllowN(now, 1)
}

// evict drops the sources whose buckets are full again, or one at random.
func (t *authThrottle) evict(now time.Time) {
	for k, l := range t.sources {
		if l.TokensAt(now) >= float64(t.burst) {
			delete(t.sources, k)
		}
	}
	for k := range t.sources {
		if len(t.sources) < t.max {
			return
		}
		delete(t.sources, k)
	}
}

// connLimitListener accepts at most max connections at once. One beyond
// it is answered 503 with Retry-After and closed at once, and counted,
// rather than left waiting in the kernel's queue as
// golang.org/x/net/netutil.LimitListener leaves it: an idle keep-alive
// holds its place for up to IdleTimeout, and a client waiting that long
// without an answer cannot tell a full gateway from a dead one.
type connLimitListener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	refused prometheus.Counter
	gauge   prometheus.Gauge
}

// connRefusal is what a connection beyond the cap reads before it is
// closed.
var connRefusal = func() []byte {
	body := `{"type":"` + ProblemUnavailable + `","title":"Service Unavailable","status":503,"detail":"The gateway has too many open connections; retry with the same Idempotency-Key."}` + "\n"
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: " + problemContentType +
		"\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

func (l *connLimitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= l.max {
			l.gauge.Inc()
			return &limitedConn{Conn: c, l: l}, nil
		}
		l.open.Add(-1)
		l.refused.Inc()
		go func() {
			// The send buffer of a new connection is empty: the write
			// does not wait unless the peer is gone.
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = c.Write(connRefusal)
			_ = c.Close()
		}()
	}
}

// limitedConn gives its place back once, when closed.
type limitedConn struct {
	net.Conn
	l    *connLimitListener
	once sync.Once
}

func (c *limitedConn) Close() error {
	c.once.Do(func() {
		c.l.open.Add(-1)
		c.l.gauge.Dec()
	})
	return c.Conn.Close()
}
