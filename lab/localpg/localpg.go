// Package localpg finds the lab a PostgreSQL server and makes its room on
// it. Find tries the machine's local server, then a private throwaway
// cluster from the machine's PostgreSQL binaries (Cluster, which the chaos
// harness also crashes and restarts), then a container; Database makes the
// demo's and the bench's own database, created when missing, and
// FreshSchema a schema for a bench run or a test, dropped afterwards. It is
// the lab's one place for CREATE DATABASE and CREATE SCHEMA; the
// migrations themselves stay in dedup.
package localpg

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/lab/procstat"
	"github.com/paydedup/paydedup/migrations/migrate"
)

// AdminURL is the local server demo and bench try first when DATABASE_URL
// is not set.
const AdminURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Server is a PostgreSQL server the lab may use as superuser.
type Server struct {
	AdminURL string // the superuser's URL of database postgres
	Where    string // what it is, for the user: "the local server at ..."
	Close    func() // stops and removes what Find started; a no-op for the local server
}

// Find returns a server for the lab, trying in order: localURL (AdminURL
// when ""), the local server; a private cluster from the machine's
// PostgreSQL binaries, in a temporary directory; a container, when a Docker
// engine answers. When none is there, the error gives the exact commands
// that make one.
func Find(ctx context.Context, localURL string) (*Server, error) {
	if localURL == "" {
		localURL = AdminURL
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	pool, localErr := pg.Connect(pctx, localURL)
	cancel()
	if localErr == nil {
		pool.Close()
		return &Server{AdminURL: localURL, Where: "the local server at " + redact.URLs(localURL), Close: func() {}}, nil
	}
	c, stop, clusterErr := Throwaway(ctx)
	if clusterErr == nil {
		return &Server{AdminURL: c.URL("postgres", "postgres"), Where: "a private PostgreSQL cluster in " + c.Dir() + " (removed at exit)", Close: stop}, nil
	}
	u, stopC, containerErr := Container(ctx, "postgres")
	if containerErr == nil {
		return &Server{AdminURL: u, Where: "a PostgreSQL container (removed at exit)", Close: stopC}, nil
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, fmt.Errorf(`no DATABASE_URL, and no PostgreSQL to use:
  - no server answers at %s (%v);
  - no private cluster: %v;
  - no container: %v.
Either install PostgreSQL's server binaries (nothing needs to run: a private cluster is started and removed):
  sudo apt-get install postgresql        # Debian, Ubuntu
or start the compose stack's database and point paydedup at it:
  docker compose -f deploy/compose.yaml up -d postgres
  DATABASE_URL='%s' go run ./cmd/paydedup demo`,
		redact.URLs(localURL), localErr, clusterErr, containerErr, ComposeURL)
}

// ComposeURL is the database of deploy/compose.yaml as its superuser, from
// the host (the port and password that file sets).
const ComposeURL = "postgres://postgres:postgres@127.0.0.1:15432/paydedup?sslmode=disable"

// Database returns the URL of database name on the server at adminURL
// (a superuser's), creating the database if missing, with the pool size given.
func Database(ctx context.Context, adminURL, name string, poolSize int) (u string, created bool, err error) {
	admin, err := pg.Connect(ctx, adminURL)
	if err != nil {
		return "", false, fmt.Errorf("connect to PostgreSQL at %s: %w", redact.URLs(adminURL), err)
	}
	defer admin.Close()
	var exists bool
	check := func() error {
		return admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists)
	}
	if err := check(); err != nil {
		return "", false, fmt.Errorf("look for database %s: %w", name, err)
	}
	if !exists {
		if _, err := admin.Exec(ctx, `CREATE DATABASE `+name); err != nil {
			// Another process may have created it meanwhile.
			if cerr := check(); cerr != nil || !exists {
				return "", false, fmt.Errorf("create database %s: %w (or set DATABASE_URL to a database you may use)", name, err)
			}
		} else {
			created = true
		}
	}
	p, err := url.Parse(adminURL)
	if err != nil {
		return "", false, err
	}
	p.Path = "/" + name
	q := p.Query()
	q.Set("pool_max_conns", fmt.Sprint(poolSize))
	p.RawQuery = q.Encode()
	return p.String(), created, nil
}

// FreshSchema creates schema name in the database at dbURL and returns a
// URL whose search_path selects it, and a func that drops it.
func FreshSchema(ctx context.Context, dbURL, name string) (string, func() error, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", nil, err
	}
	ident := pgx.Identifier{name}.Sanitize()
	exec := func(ctx context.Context, sql string) error {
		pool, err := pg.Connect(ctx, dbURL)
		if err != nil {
			return err
		}
		defer pool.Close()
		_, err = pool.Exec(ctx, sql)
		return err
	}
	if err := exec(ctx, "CREATE SCHEMA "+ident); err != nil {
		return "", nil, fmt.Errorf("create schema %s: %w", name, err)
	}
	drop := func() error {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := exec(cctx, "DROP SCHEMA "+ident+" CASCADE"); err != nil {
			return fmt.Errorf("drop schema %s: %w", name, err)
		}
		return nil
	}
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	return u.String(), drop, nil
}

// Migrate applies the schema migrations.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	m, err := migrate.NewMigrator(ctx, pool, logger)
	if err != nil {
		return err
	}
	defer m.Close()
	_, err = m.Up(ctx)
	return err
}

// BackendPIDs returns the process ids of the server's backends whose
// application_name is app: the bench reads their CPU time from /proc.
func BackendPIDs(ctx context.Context, pool *pgxpool.Pool, app string) ([]int, error) {
	rows, err := pool.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", app)
	if err != nil {
		return nil, fmt.Errorf("read the backends of %s: %w", app, err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("read the backends of %s: %w", app, err)
	}
	return pids, nil
}

// Postmaster returns the process id of the postmaster of the server at
// dbURL, when that server runs on this machine and /proc shows it (the
// parent of a backend of ours): procstat.TreeCPU of it is the server's
// whole CPU time. An error naming why otherwise (a server elsewhere, or
// another kernel).
func Postmaster(ctx context.Context, dbURL string) (int, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return 0, fmt.Errorf("find the postmaster: connect to PostgreSQL at %s: %w", redact.URLs(dbURL), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var backend int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return 0, fmt.Errorf("find the postmaster: %w", err)
	}
	// A server in a container reports its own namespace's pid, which on
	// this machine's /proc may be another process: both must be
	// PostgreSQL's.
	pm, comm, err := procstat.PPID(backend)
	if err != nil {
		return 0, fmt.Errorf("find the postmaster: the server's backend %d is not on this machine's /proc: %w", backend, err)
	}
	pmComm, err := procstat.Comm(pm)
	if err != nil || !isPostgres(comm) || !isPostgres(pmComm) {
		return 0, fmt.Errorf("find the postmaster: process %d on this machine (%q, parent %d %q) is not the server's backend %d: the server runs elsewhere or in another pid namespace", backend, comm, pm, pmComm, backend)
	}
	return pm, nil
}

// ServerMeter reads the CPU time of a PostgreSQL server on this machine:
// its postmaster and every child (procstat.TreeCPU).
type ServerMeter struct{ Postmaster int }

// MeterServer finds the postmaster of the server at dbURL (Postmaster).
func MeterServer(ctx context.Context, dbURL string) (ServerMeter, error) {
	pm, err := Postmaster(ctx, dbURL)
	return ServerMeter{pm}, err
}

// CPU is the server's whole CPU time so far.
func (m ServerMeter) CPU() (time.Duration, error) { return procstat.TreeCPU(m.Postmaster) }

// isPostgres reports whether a process's command name is a PostgreSQL
// server's (the postmaster and the backends are "postgres"; older
// packagings named the postmaster "postmaster").
func isPostgres(comm string) bool { return comm == "postgres" || comm == "postmaster" }

// WithAppName returns a connection URL with its application_name set.
func WithAppName(dbURL, name string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// Observer watches a database from outside the process under test: how
// many payments its ledger has settled, and which backends serve a client.
type Observer struct{ pool *pgxpool.Pool }

// Observe connects one connection to dbURL.
func Observe(ctx context.Context, dbURL string) (*Observer, error) {
	pool, err := pg.Connect(ctx, dbURL, pg.WithMaxConns(1))
	if err != nil {
		return nil, err
	}
	return &Observer{pool}, nil
}

// Settled counts the ledger's settled payments (succeeded or declined).
func (o *Observer) Settled(ctx context.Context) (int, error) {
	var n int
	err := o.pool.QueryRow(ctx, `SELECT count(*) FROM payments WHERE status IN ('succeeded', 'declined')`).Scan(&n)
	return n, err
}

// LedgerIDs is how many ids the ledger's identity has handed out: an upper
// bound on its rows (an insert that rolled back used one too), so on how
// many payments it has settled and how many keys are completed (a
// completion writes its ledger row in the same transaction). Reading it
// costs a page of the sequence, where Settled and Completed scan their
// tables: a poller counts only once the bound allows its target.
func (o *Observer) LedgerIDs(ctx context.Context) (int64, error) {
	var n int64
	err := o.pool.QueryRow(ctx, `SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('payments', 'id')::regclass), 0)`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("read the ledger's ids: %w", err)
	}
	return n, nil
}

// Completed counts the completed idempotency keys.
func (o *Observer) Completed(ctx context.Context) (int, error) {
	var n int
	err := o.pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`).Scan(&n)
	return n, err
}

// Published counts the gateway's intakes of merchant whose key starts with
// prefix and whose command was published (a POST the gateway took in,
// answered or not).
func (o *Observer) Published(ctx context.Context, merchant, prefix string) (int, error) {
	var n int
	err := o.pool.QueryRow(ctx, `SELECT count(*) FROM gateway_intake
		WHERE merchant_id = $1 AND idempotency_key LIKE $2 AND published_at IS NOT NULL`, merchant, likePrefix(prefix)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count published intakes: %w", err)
	}
	return n, nil
}

// Uncompleted counts those published intakes whose payment is not
// completed.
func (o *Observer) Uncompleted(ctx context.Context, merchant, prefix string) (int, error) {
	var n int
	err := o.pool.QueryRow(ctx, `SELECT count(*) FROM gateway_intake g
		WHERE g.merchant_id = $1 AND g.idempotency_key LIKE $2 AND g.published_at IS NOT NULL
		  AND NOT EXISTS (SELECT 1 FROM idempotency_keys k
		    WHERE k.merchant_id = g.merchant_id AND k.idempotency_key = g.idempotency_key AND k.status = 'completed')`,
		merchant, likePrefix(prefix)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count uncompleted intakes: %w", err)
	}
	return n, nil
}

// POSTToCharged reads, for the completed payments of merchant whose key
// starts with prefix, how many there are, the seconds from the first
// intake to the last completion, and the median and 99th percentile of
// each one's intake-to-completion time in seconds (the database's clock).
func (o *Observer) POSTToCharged(ctx context.Context, merchant, prefix string) (n int, seconds, p50, p99 float64, err error) {
	err = o.pool.QueryRow(ctx, `SELECT count(*),
		coalesce(extract(epoch FROM max(k.completed_at) - min(g.created_at)), 0),
		coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM k.completed_at - g.created_at)), 0),
		coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM k.completed_at - g.created_at)), 0)
	FROM gateway_intake g JOIN idempotency_keys k USING (merchant_id, idempotency_key)
	WHERE g.merchant_id = $1 AND g.idempotency_key LIKE $2 AND k.status = 'completed'`,
		merchant, likePrefix(prefix)).Scan(&n, &seconds, &p50, &p99)
	if err != nil {
		err = fmt.Errorf("read POST to charged times: %w", err)
	}
	return n, seconds, p50, p99, err
}

// CompletedAt returns when each completed key was completed (the
// database's clock), by "merchant_id:idempotency_key".
func (o *Observer) CompletedAt(ctx context.Context) (map[string]time.Time, error) {
	rows, err := o.pool.Query(ctx, `SELECT merchant_id, idempotency_key, completed_at FROM idempotency_keys WHERE status = 'completed'`)
	if err != nil {
		return nil, fmt.Errorf("read completion times: %w", err)
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var merchant, key string
		var at time.Time
		if err := rows.Scan(&merchant, &key, &at); err != nil {
			return nil, fmt.Errorf("read completion times: %w", err)
		}
		out[merchant+":"+key] = at
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read completion times: %w", err)
	}
	return out, nil
}

// likePrefix is a LIKE pattern for keys that start with prefix.
func likePrefix(prefix string) string {
	return strings.NewReplacer(`\`, `\\`, "%", `\%`, "_", `\_`).Replace(prefix) + "%"
}

// BackendPIDs is BackendPIDs on the observer's connection.
func (o *Observer) BackendPIDs(ctx context.Context, app string) ([]int, error) {
	return BackendPIDs(ctx, o.pool, app)
}

// Close closes the connection.
func (o *Observer) Close() { o.pool.Close() }
