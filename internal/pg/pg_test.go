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

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/testenv"
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

// TestRetryPreparesAStalePlanAgain: a statement prepared on a connection
// before a migration changed its result type fails once there ("cached
// plan must not change result type"); Retry runs it again, prepared anew,
// and returns its rows. Another error of the same SQLSTATE is not retried.
func TestRetryPreparesAStalePlanAgain(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx) // one connection: its plan is the stale one
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `CREATE TABLE stale (k text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO stale VALUES ('a')`); err != nil {
		t.Fatal(err)
	}
	query := func(ctx context.Context) error {
		var k string
		return conn.QueryRow(ctx, `SELECT k FROM stale WHERE k = $1`, "a").Scan(&k)
	}
	if err := query(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ALTER TABLE stale ALTER COLUMN k TYPE text COLLATE "C"`); err != nil {
		t.Fatal(err)
	}
	calls := 0
	err = pg.Retry(ctx, 5*time.Second, func(ctx context.Context) error {
		calls++
		return query(ctx)
	})
	if err != nil || calls != 2 {
		t.Fatalf("Retry over a stale plan: %v after %d calls, want nil after 2", err, calls)
	}

	calls = 0
	err = pg.Retry(ctx, 5*time.Second, func(ctx context.Context) error {
		calls++
		// feature_not_supported too, but not a stale plan
		_, err := conn.Exec(ctx, `SELECT count(*) FROM stale FOR UPDATE`)
		return err
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "0A000" || calls != 1 {
		t.Fatalf("Retry of another error: %v after %d calls, want it returned after 1", err, calls)
	}
}
