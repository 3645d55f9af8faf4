// Package pg holds what paydedup's Postgres stores share (dedup, the
// gateway's store, httpidem's store): connecting, retrying a statement that
// Postgres aborted to break a deadlock or a serialization conflict, and
// reading pgx errors as the stores' own.
//
// The stores and this package are the only users of pgx. cmd is handed the
// *pgxpool.Pool that Connect opens, to wire it into the stores it builds;
// no pgx error leaves a store.
package pg

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/internal/storeerr"
)

// ErrUnavailable means the database could not be reached or the statement
// did not finish; the operation may be retried. It is storeerr's, as is
// ledger.ErrUnavailable: every store returns the one value, and its
// callers test it without linking pgx.
var ErrUnavailable = storeerr.ErrUnavailable

// MaxStatementRetries bounds retries of a statement that failed with a
// deadlock or serialization failure (safe: each statement is atomic).
const MaxStatementRetries = 5

// ConnectOption adjusts the pool Connect opens.
type ConnectOption func(*pgxpool.Config)

// WithTracerProvider makes every statement, batch and connection acquire
// a span from tp (otelpgx), a child of the span in the caller's context; a
// statement run without a span in its context makes none. The statements'
// text is recorded, their arguments (payment data) never are.
func WithTracerProvider(tp trace.TracerProvider) ConnectOption {
	return func(cfg *pgxpool.Config) {
		cfg.ConnConfig.Tracer = otelpgx.NewTracer(otelpgx.WithTracerProvider(tp),
			otelpgx.WithMeterProvider(metricnoop.NewMeterProvider()))
	}
}

// WithMaxConns sizes the pool to n connections unless the URL sets
// pool_max_conns itself.
func WithMaxConns(n int) ConnectOption {
	return func(cfg *pgxpool.Config) {
		if n > 0 && !strings.Contains(cfg.ConnString(), "pool_max_conns") {
			cfg.MaxConns = int32(n)
		}
	}
}

// WithRoundTripCounter counts on n every statement and every pipelined
// batch the pool sends: one round trip each (the benches report them).
// It replaces any other tracer.
func WithRoundTripCounter(n *atomic.Int64) ConnectOption {
	return func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = roundTrips{n} }
}

type roundTrips struct{ n *atomic.Int64 }

func (c roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// Connect opens a pgx pool for a database URL and checks that it answers.
// The URL may name several hosts (postgres://h1:5432,h2:5432/db); with
// target_session_attrs=read-write every new connection goes to the first
// that is a primary, so a pool follows a failover by itself.
func Connect(ctx context.Context, url string, opts ...ConnectOption) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	for _, o := range opts {
		o(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, Interpret("connect to database", err, Errors{})
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, Interpret(fmt.Sprintf("connect to database %s@%s/%s", cfg.ConnConfig.User, hosts(cfg.ConnConfig.Config), cfg.ConnConfig.Database), err, Errors{})
	}
	return pool, nil
}

// hosts lists every host:port a URL names, the first and its fallbacks: a
// multi-host URL (postgres://h1:5432,h2:5432/db) tries them in order, and
// with target_session_attrs=read-write it takes the first that is a primary.
func hosts(c pgconn.Config) string {
	list := []string{net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port)))}
	for _, f := range c.Fallbacks {
		if hp := net.JoinHostPort(f.Host, strconv.Itoa(int(f.Port))); !slices.Contains(list, hp) {
			list = append(list, hp)
		}
	}
	return strings.Join(list, ",")
}

// maxStalePlanRetries bounds the retries of a statement whose prepared
// plan a migration made stale: one per pooled connection that still holds
// the old plan (a pool is sized well below this).
const maxStalePlanRetries = 256

// Retry runs fn under the statement timeout and retries it when Postgres
// broke a deadlock or a serialization conflict, or refused a prepared
// statement whose result type a migration changed: every statement the
// stores run is atomic, so a retry is safe.
//
// The stale plan: pgx prepares each statement once per connection, and
// PostgreSQL refuses to run a prepared statement whose result columns
// changed type or collation since ("cached plan must not change result
// type", a migration such as 00015 run while workers and gateways are up).
// The statement did nothing; pgx drops it from that connection's cache on
// the error, so the next try prepares it again. Each connection of the
// pool fails once per statement, so these retries are bounded apart from
// the deadlock ones.
func Retry(ctx context.Context, timeout time.Duration, fn func(ctx context.Context) error) error {
	var err error
	for conflicts, stale := 0, 0; conflicts < MaxStatementRetries && stale < maxStalePlanRetries; {
		sctx, cancel := context.WithTimeout(ctx, timeout)
		err = fn(sctx)
		cancel()
		var pgErr *pgconn.PgError
		switch {
		case !errors.As(err, &pgErr):
			return err
		case pgErr.Code == "40P01" || pgErr.Code == "40001":
			conflicts++
		case stalePlan(err):
			stale++
		default:
			return err
		}
	}
	return err
}

// stalePlan reports whether err is PostgreSQL refusing a prepared
// statement whose result type changed since it was prepared (SQLSTATE
// 0A000, feature_not_supported, with that message: the code alone names
// many other things).
func stalePlan(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "0A000" &&
		strings.Contains(pgErr.Message, "cached plan must not change result type")
}

// Errors names a store's sentinels that Interpret wraps.
type Errors struct {
	// NotFound is wrapped for pgx.ErrNoRows; nil leaves it uninterpreted.
	NotFound error
	// Unique maps the name of a unique constraint to the error a
	// violation of it wraps (with the constraint and its detail).
	Unique map[string]error
}

// Error is a PostgreSQL error no store sentinel interprets: the server's
// message and SQLSTATE without pgx's type, so that a command can still name
// the fix for, say, a missing privilege (42501) or table (42P01).
type Error struct{ Message, Code string }

func (e *Error) Error() string { return e.Message + " (SQLSTATE " + e.Code + ")" }

// SQLState returns the SQLSTATE of the PostgreSQL error in err's chain,
// whether a store interpreted it or not; "" when there is none.
func SQLState(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Interpret maps err, the error of the operation op, to the store's
// errors; pgx types never leave the stores.
func Interpret(op string, err error, e Errors) error {
	if err == nil {
		return nil
	}
	if e.NotFound != nil && errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%s: %w", op, e.NotFound)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if target, ok := e.Unique[pgErr.ConstraintName]; ok && pgErr.Code == "23505" {
			return fmt.Errorf("%s: %w: %s (%s)", op, target, pgErr.ConstraintName, pgErr.Detail)
		}
		switch {
		case pgErr.Code == "57014": // query_canceled: statement timeout
			return fmt.Errorf("%s: %w: statement timed out", op, ErrUnavailable)
		case pgErr.Code[:2] == "08" || pgErr.Code[:2] == "57" || pgErr.Code == "53300":
			return fmt.Errorf("%s: %w: %s", op, ErrUnavailable, pgErr.Message)
		}
		return fmt.Errorf("%s: %w", op, &Error{Message: pgErr.Message, Code: pgErr.Code})
	}
	var netErr net.Error
	// A connection dropped mid-statement (the server restarted or stopped
	// in immediate mode) surfaces as an unexpected EOF.
	if errors.As(err, &netErr) || pgconn.SafeToRetry(err) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || isConnectError(err) {
		return fmt.Errorf("%s: %w: %v", op, ErrUnavailable, err)
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("%s: %w", op, err)
	}
	return fmt.Errorf("%s: %v", op, err)
}

func isConnectError(err error) bool {
	var ce *pgconn.ConnectError
	return errors.As(err, &ce)
}

// Deref returns *s, or "" for a NULL.
func Deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Finite is a nullable timestamp as a time.Time (zero when NULL); an
// infinite one is an error, as scanning it into a *time.Time is.
func Finite(t pgtype.Timestamptz) (time.Time, error) {
	if t.Valid && t.InfinityModifier != pgtype.Finite {
		return time.Time{}, fmt.Errorf("cannot scan %v into *time.Time", t.InfinityModifier)
	}
	return t.Time, nil
}

// DBNow is the SQL for a statement's time: the test clock's when one is
// passed as @now, else the database's (the transaction's start). Durations
// are added to it as intervals, so no time on a lease comes from a host's
// wall clock.
const DBNow = `coalesce(@now::timestamptz, now())`

// Clock is a store's time: what its statements take as @now, and what it
// stamps where no lease depends on the time.
//
// A test clock moves the store's time: every statement that decides a
// lease, an expiry or a window takes it as @now. Without one, or with a
// process's wall clock (a clock whose Wall method returns true, like
// clock.System), statements use the database's clock (@now is NULL), so
// that pods whose clocks disagree still agree on who holds a lease.
type Clock struct {
	c     clock.Clock
	fixed bool
}

// wallClock is implemented by a process's wall clock.
type wallClock interface{ Wall() bool }

// NewClock returns the store clock for c; nil is the system clock.
func NewClock(c clock.Clock) Clock {
	sc := Clock{c: c, fixed: c != nil}
	if c == nil {
		sc.c = clock.System{}
	}
	if w, ok := c.(wallClock); ok && w.Wall() {
		sc.fixed = false
	}
	return sc
}

// Arg is the @now argument: the test clock's time, or NULL.
func (c Clock) Arg() *time.Time {
	if !c.fixed {
		return nil
	}
	t := c.c.Now()
	return &t
}

// Now returns the clock's time, for stamps no lease depends on.
func (c Clock) Now() time.Time { return c.c.Now() }

// DB is what every store stands on: its pool, the clock its statements take
// as @now, and its statement timeout. A store keeps one in an unexported
// field, so none of it becomes part of the store's API.
type DB struct {
	Pool    *pgxpool.Pool
	Clock   Clock
	Timeout time.Duration
}

// NewDB returns the DB of the store called name (which prefixes its
// errors): it refuses a nil pool and a negative timeout; a zero timeout
// takes def, and a nil clock the database's (see Clock).
func NewDB(name string, pool *pgxpool.Pool, c clock.Clock, timeout, def time.Duration) (DB, error) {
	if pool == nil {
		return DB{}, fmt.Errorf("%s: nil pool", name)
	}
	if timeout < 0 {
		return DB{}, fmt.Errorf("%s: statement timeout must not be negative", name)
	}
	return DB{Pool: pool, Clock: NewClock(c), Timeout: cmp.Or(timeout, def)}, nil
}

// Now is a statement's @now argument: the test clock's time, or NULL for
// the database's.
func (d DB) Now() *time.Time { return d.Clock.Arg() }

// Retry runs fn under the statement timeout, retrying a statement that
// Postgres aborted to break a deadlock or a serialization conflict (see
// Retry): every statement a store runs is atomic, so a retry is safe.
func (d DB) Retry(ctx context.Context, fn func(ctx context.Context) error) error {
	return Retry(ctx, d.Timeout, fn)
}
