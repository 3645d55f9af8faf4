package gateway

import (
	"fmt"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/clock"
)

// The throttle keys IPv4 addresses whole and IPv6 ones by their /64, earns
// failures back over the window, and never holds more sources than its
// bound: full buckets are dropped first, then any.
func TestAuthThrottleKeysAndBound(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		"192.0.2.7:443": "192.0.2.7/32", "[2001:db8:1:2:aaaa::1]:80": "2001:db8:1:2::/64", "[::ffff:192.0.2.7]:1": "192.0.2.7/32",
	} {
		if p, ok := source(addr); !ok || p.String() != want {
			t.Errorf("source(%q) = %v %v, want %s", addr, p, ok, want)
		}
	}
	if _, ok := source("@unix"); ok {
		t.Error("a non-IP address has a source")
	}
	fake := clock.NewFake(time.Unix(1e9, 0))
	th := newAuthThrottle(2, time.Minute, fake)
	th.max = 100
	a, _ := source("192.0.2.1:1")
	th.fail(a)
	th.fail(a)
	wait, blocked := th.blocked(a)
	if !blocked || wait <= 0 || wait > 30*time.Second {
		t.Fatalf("after 2 failures: blocked %v, wait %v; want blocked for up to 30s", blocked, wait)
	}
	fake.Advance(30 * time.Second)
	if _, blocked := th.blocked(a); blocked {
		t.Fatal("still blocked after a failure was earned back")
	}
	for i := range 1000 {
		s, _ := source(fmt.Sprintf("10.0.%d.%d:1", i/256, i%256))
		th.fail(s)
		th.fail(s)
		if len(th.sources) > th.max {
			t.Fatalf("%d sources held, bound %d", len(th.sources), th.max)
		}
	}
	if newAuthThrottle(-1, time.Minute, fake) != nil {
		t.Fatal("a negative AuthFailures does not turn the throttle off")
	}
}
