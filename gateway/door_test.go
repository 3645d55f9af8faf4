package gateway_test

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paydedup/paydedup/gateway"
)

// fromAddr is a client whose connections come from the loopback address
// local (127.0.0.2 is another source than 127.0.0.1 to the gateway).
func fromAddr(local string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
}

// status sends method path with the bearer key from c.
func (w *world) status(c *http.Client, method, path, key string) *http.Response {
	w.t.Helper()
	req, err := http.NewRequestWithContext(w.ctx, method, w.base+path, nil)
	if err != nil {
		w.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := c.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp
}

// After AuthFailures failed authentications a source address is answered
// 429 with Retry-After, a valid key included, and no API key is looked up
// (the gateway's stores make no round trip); another address is served.
func TestFailedAuthenticationsAreThrottled(t *testing.T) {
	t.Parallel()
	var trips atomic.Int64
	w := setupWith(t, gateway.Config{AuthFailures: 3, AuthFailureWindow: time.Hour}, options{roundTrips: &trips})
	one, two := fromAddr("127.0.0.1"), fromAddr("127.0.0.2")
	defer one.CloseIdleConnections()
	defer two.CloseIdleConnections()
	wrong := "pdk_" + strings.Repeat("0", 43)
	for i := range 3 {
		if r := w.status(one, http.MethodGet, "/v1/payments/k", wrong); r.StatusCode != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d, want 401", i+1, r.StatusCode)
		}
	}
	before := trips.Load()
	for _, c := range []struct{ method, key string }{
		{http.MethodGet, wrong}, {http.MethodPost, wrong}, {http.MethodGet, w.keyA}, {http.MethodPost, "not-a-key-shape"},
	} {
		r := w.status(one, c.method, "/v1/payments/k", c.key)
		if c.method == http.MethodPost {
			r = w.status(one, c.method, "/v1/payments", c.key)
		}
		if r.StatusCode != http.StatusTooManyRequests || r.Header.Get("Retry-After") == "" {
			t.Fatalf("%s with key %.8s… after 3 failures: %d Retry-After %q, want 429 with Retry-After", c.method, c.key, r.StatusCode, r.Header.Get("Retry-After"))
		}
	}
	if n := trips.Load() - before; n != 0 {
		t.Fatalf("throttled requests made %d round trips to the database, want 0", n)
	}
	if n := w.counter("paydedup_gateway_auth_throttled_total"); n != 4 {
		t.Fatalf("paydedup_gateway_auth_throttled_total %v, want 4", n)
	}
	// Another source is not held back by the first one's failures.
	if r := w.status(two, http.MethodGet, "/v1/payments/k", w.keyA); r.StatusCode != http.StatusNotFound {
		t.Fatalf("another address with a valid key: %d, want 404", r.StatusCode)
	}
}

// counter is an unlabelled counter or gauge of the gateway's registry.
func (w *world) counter(name string) float64 {
	w.t.Helper()
	fams, err := w.reg.Gather()
	if err != nil {
		w.t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			m := f.GetMetric()[0]
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// With MaxConns open, one more connection reads a 503 with Retry-After and
// is closed; once one closes, a new one is served.
func TestConnectionsAreCapped(t *testing.T) {
	t.Parallel()
	w := setup(t, gateway.Config{MaxConns: 2})
	addr := strings.TrimPrefix(w.base, "http://")
	// exchange sends a request on conn and reads the answer's status.
	exchange := func(conn net.Conn, rd *bufio.Reader) int {
		t.Helper()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write([]byte("GET /v1/payments/k HTTP/1.1\r\nHost: gw\r\n\r\n")); err != nil {
			return -1
		}
		resp, err := http.ReadResponse(rd, nil)
		if err != nil {
			return -1
		}
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
			t.Errorf("503 without Retry-After")
		}
		return resp.StatusCode
	}
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if code := exchange(c, bufio.NewReader(c)); code != http.StatusUnauthorized {
			t.Fatalf("a connection within the cap: %d, want 401", code)
		}
		held = append(held, c)
	}
	extra, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	_ = extra.SetDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(extra), nil)
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a third connection: %v %v, want 503 with Retry-After", resp, err)
	}
	if n := w.counter("paydedup_gateway_connections_refused_total"); n != 1 {
		t.Fatalf("paydedup_gateway_connections_refused_total %v, want 1", n)
	}
	if n := w.counter("paydedup_gateway_connections_open"); n != 2 {
		t.Fatalf("paydedup_gateway_connections_open %v, want 2", n)
	}
	_ = held[0].Close()
	w.eventually("a place is given back", func() bool { return w.counter("paydedup_gateway_connections_open") == 1 })
	again, err := (&net.Dialer{}).DialContext(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if code := exchange(again, bufio.NewReader(again)); code != http.StatusUnauthorized {
		t.Fatalf("a connection after one closed: %d, want 401", code)
	}
}
