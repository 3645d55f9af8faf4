package gateway_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/payment"
)

// A request that declares a body larger than the route reads is answered
// 413 at once, without reading it, and its connection closed: a client (or
// an attacker) that declares 10 GB and sends nothing does not hold a
// connection for the read timeout before a 400.
func TestDeclaredBodyTooLarge413AtOnce(t *testing.T) {
	t.Parallel()
	// The limit PAYDEDUP_MAX_BODY_BYTES sets (--max-body-bytes).
	const limit = 2048
	w := setupWith(t, gateway.Config{Limits: payment.Limits{MaxBodyBytes: limit}}, options{webhookSecret: webhookSecret})
	host := strings.TrimPrefix(w.base, "http://")
	post := "POST /v1/payments HTTP/1.1\r\nHost: " + host + "\r\nAuthorization: Bearer " + w.keyA +
		"\r\nIdempotency-Key: huge-1\r\nContent-Type: application/json\r\n"
	for _, c := range []struct {
		name, head string
		length     int64
	}{
		{"payment of 10 GB", post, 10_000_000_000},
		{"payment a byte over the limit", post, limit + 1},
		{"webhook of 10 GB", "POST " + gateway.PathStripeWebhooks + " HTTP/1.1\r\nHost: " + host +
			"\r\nStripe-Signature: t=1,v1=00\r\nContent-Type: application/json\r\n", 10_000_000_000},
	} {
		conn, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		// Well under the read timeout (gateway.DefaultReadTimeout, 15 s):
		// without the check the answer comes only when it expires.
		bound := 2 * time.Second
		start := time.Now()
		if err := conn.SetDeadline(start.Add(bound)); err != nil {
			t.Fatal(err)
		}
		if _, err := fmt.Fprintf(conn, "%sContent-Length: %d\r\n\r\n", c.head, c.length); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: no answer within %v of the headers: %v", c.name, bound, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		elapsed := time.Since(start)
		if err != nil {
			t.Fatalf("%s: reading the answer: %v", c.name, err)
		}
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("%s: %d %s after %v, want 413", c.name, resp.StatusCode, body, elapsed)
		}
		// (ReadResponse reads Connection: close into Close.)
		if !resp.Close {
			t.Errorf("%s: the 413 does not say Connection: close (%v)", c.name, resp.Header)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("%s: Content-Type %q", c.name, ct)
		}
		var p gateway.Problem
		if err := json.Unmarshal(body, &p); err != nil || p.Type != gateway.ProblemTooLarge || p.Status != http.StatusRequestEntityTooLarge ||
			p.Reason != string(payment.ReasonBodyTooLarge) || !strings.Contains(p.Detail, "bytes") {
			t.Errorf("%s: problem %s (%v)", c.name, body, err)
		}
		// Then the server closes its end without waiting for the body.
		// (net/http discards up to 256 KiB of a declared body first, so
		// that a client sending it reads the 413 rather than a reset: the
		// client a byte over the limit sends its body.)
		if c.length <= 256<<10 {
			if _, err := conn.Write(make([]byte, c.length)); err != nil {
				t.Fatalf("%s: sending the body: %v", c.name, err)
			}
		}
		if n, err := br.ReadByte(); !errors.Is(err, io.EOF) {
			t.Errorf("%s: after the 413 the connection read %v, %v; want EOF", c.name, n, err)
		}
		t.Logf("%s: 413 after %v", c.name, elapsed.Round(time.Microsecond))
	}
	if n := requestsWith(w, "post_payment", "413"); n != 2 {
		t.Errorf("paydedup_gateway_requests_total{route=post_payment,code=413} = %v, want 2", n)
	}
}

// requestsWith is paydedup_gateway_requests_total{route, code}.
func requestsWith(w *world, route, code string) float64 {
	w.t.Helper()
	fams, err := w.reg.Gather()
	if err != nil {
		w.t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "paydedup_gateway_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["route"] == route && labels["code"] == code {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
