package pg_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/internal/testenv"
)

// multiHost rewrites u's host list to hosts, and asks for a read-write
// session as production URLs do behind a failover engine.
func multiHost(t *testing.T, u string, hosts ...string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	p.Host = strings.Join(hosts, ",")
	q := p.Query()
	q.Set("target_session_attrs", "read-write")
	q.Set("connect_timeout", "2")
	p.RawQuery = q.Encode()
	return p.String()
}

// TestConnectMultiHost: a multi-host URL whose first host is dead connects
// to the next one (what a worker does after its primary was killed and the
// standby promoted), and one whose every host is dead fails as unavailable,
// naming every host it tried.
func TestConnectMultiHost(t *testing.T) {
	t.Parallel()
	base := testenv.PostgresEmptyURL(t)
	p, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	live := p.Host
	dead1 := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	dead2 := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	pool, err := pg.Connect(ctx, multiHost(t, base, dead1, live))
	if err != nil {
		t.Fatalf("dead first host, live second: %v", err)
	}
	defer pool.Close()
	var port int
	var readOnly string
	if err := pool.QueryRow(ctx, `SELECT inet_server_port(), current_setting('transaction_read_only')`).Scan(&port, &readOnly); err != nil {
		t.Fatal(err)
	}
	if want := p.Port(); fmt.Sprint(port) != want || readOnly != "off" {
		t.Errorf("connected to port %d (read only %s), want the live host's %s, read-write", port, readOnly, want)
	}

	_, err = pg.Connect(ctx, multiHost(t, base, dead1, dead2))
	if !errors.Is(err, pg.ErrUnavailable) {
		t.Fatalf("every host dead: got %v, want ErrUnavailable", err)
	}
	for _, h := range []string{dead1, dead2} {
		if !strings.Contains(err.Error(), h) {
			t.Errorf("every host dead: %q does not name %s", err, h)
		}
	}
}
