package dedup

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/ledger"
)

// Defaults for Config.
const (
	// DefaultStatementTimeout bounds every statement the store runs.
	DefaultStatementTimeout = 10 * time.Second
)

// Config configures a Store. Zero values take the defaults.
type Config struct {
	Retention         time.Duration
	ProviderKeyWindow time.Duration
	StatementTimeout  time.Duration
	// Clock is a test clock; leave it nil in production: with none, or with
	// a process's wall clock (clock.System), statements take the database's
	// time, so that pods whose clocks disagree still agree on who holds a
	// lease (see pg.Clock).
	Clock clock.Clock
}

// Store is the Postgres idempotency store. It is safe for concurrent use.
type Store struct {
	db        pg.DB
	retention time.Duration
	window    time.Duration
}

// dbNow is the SQL for the statement's time (see pg.DBNow).
const dbNow = pg.DBNow

// New returns a store on pool. The schema must be migrated (see Migrate).
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	db, err := pg.NewDB("dedup", pool, cfg.Clock, cfg.StatementTimeout, DefaultStatementTimeout)
	if err != nil {
		return nil, err
	}
	s := &Store{
		db:        db,
		retention: cmp.Or(cfg.Retention, ledger.DefaultRetention),
		window:    cmp.Or(cfg.ProviderKeyWindow, ledger.DefaultProviderKeyWindow),
	}
	switch {
	case s.retention < 0 || s.window < 0:
		return nil, errors.New("dedup: durations must not be negative")
	case s.window >= s.retention:
		return nil, fmt.Errorf("dedup: key retention %v must exceed the provider key window %v", s.retention, s.window)
	}
	return s, nil
}

// ProviderKeyWindow returns how long after a key's window starts its
// provider call may go out blind; past it, the claim asks for a lookup.
func (s *Store) ProviderKeyWindow() time.Duration { return s.window }

// Retention returns the configured key retention.
func (s *Store) Retention() time.Duration { return s.retention }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.db.Timeout)
	defer cancel()
	if err := s.db.Pool.Ping(ctx); err != nil {
		return interpretError("ping database", err)
	}
	return nil
}

const recordColumns = `merchant_id, idempotency_key, request_hash, status, provider_key, amount, currency,
	attempts, locked_by, locked_until, maybe_charged, key_window_start, charge_id, response_status,
	response, last_error, created_at, updated_at, completed_at, expires_at, trace_id`

func qualified(alias string) string {
	return alias + `.merchant_id, ` + alias + `.idempotency_key, ` + alias + `.request_hash, ` + alias + `.status, ` +
		alias + `.provider_key, ` + alias + `.amount, ` + alias + `.currency, ` + alias + `.attempts, ` +
		alias + `.locked_by, ` + alias + `.locked_until, ` + alias + `.maybe_charged, ` + alias + `.key_window_start, ` +
		alias + `.charge_id, ` + alias + `.response_status, ` + alias + `.response, ` + alias + `.last_error, ` +
		alias + `.created_at, ` + alias + `.updated_at, ` + alias + `.completed_at, ` + alias + `.expires_at, ` +
		alias + `.trace_id`
}

// scanRecord scans recordColumns, after any leading destinations.
func scanRecord(row pgx.Row, lead ...any) (ledger.Record, error) {
	return newRecordScanner(lead...).scan(row)
}

// recordScanner holds the destinations of recordColumns (after any leading
// ones), so that a statement reading many rows makes them once rather than
// once per row: the destinations escape to the heap through pgx's []any.
type recordScanner struct {
	dest                               []any
	r                                  ledger.Record
	status                             string
	lockedBy, chargeID, lastErr, trace pgtype.Text
	lockedUntil, completedAt           pgtype.Timestamptz
	responseStatus                     pgtype.Int4
	response                           []byte
	attempts                           int32
}

func newRecordScanner(lead ...any) *recordScanner {
	s := &recordScanner{}
	r := &s.r
	s.dest = append(lead,
		&r.MerchantID, &r.IdempotencyKey, &r.RequestHash, &s.status, &r.ProviderKey, &r.Amount, &r.Currency,
		&s.attempts, &s.lockedBy, &s.lockedUntil, &r.MaybeCharged, &r.KeyWindowStart, &s.chargeID, &s.responseStatus,
		&s.response, &s.lastErr, &r.CreatedAt, &r.UpdatedAt, &s.completedAt, &r.ExpiresAt, &s.trace)
	return s
}

// scan reads one row. Every destination is written by each Scan (NULL
// included), and the Record returned is a copy: what it holds (strings,
// new byte slices) is the row's own.
func (s *recordScanner) scan(row pgx.Row) (ledger.Record, error) {
	if err := row.Scan(s.dest...); err != nil {
		return ledger.Record{}, err
	}
	r := s.r
	r.Status = ledger.Status(s.status)
	r.Attempts = int(s.attempts)
	r.LockedBy = s.lockedBy.String
	r.ChargeID = s.chargeID.String
	r.LastError = s.lastErr.String
	r.TraceID = s.trace.String
	var err error
	if r.LockedUntil, err = pg.Finite(s.lockedUntil); err != nil {
		return ledger.Record{}, err
	}
	if r.CompletedAt, err = pg.Finite(s.completedAt); err != nil {
		return ledger.Record{}, err
	}
	if s.responseStatus.Valid {
		r.ResponseStatus = int(s.responseStatus.Int32)
	}
	if s.response != nil {
		r.Response = json.RawMessage(s.response)
	}
	return r, nil
}

func deref(s *string) string { return pg.Deref(s) }

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Plans of the statements that take a batch of keys (the claim, the group
// commit, GetMany and PaymentsFor).
// Their input is a batch of keys, and the only plans that stay cheap as the
// tables grow probe the primary key (or the ledger's unique key) once per
// key. Left to itself the planner often picks a sequential scan and a hash
// join instead: on a young table, with stale statistics, or through the
// pending-lease index, whose dead entries it does not count, and those
// plans cost more as the table grows. So sequential scans are off for these
// statements (set for their own transaction only), and the statements are
// written so that no partial index can be walked for them (the claim's
// re-acquire tests status in a CASE; the group commit fences on
// locked_until, not status). Under those settings their generic plans are
// the per-key probes too, so they skip the planner after their first
// executions (docs/performance.md). TestHotPathReadsBoundedByBatch holds
// them to that, for small batches and large, new keys and duplicates.
//
// The group commit also sends its rows' completion notifications itself,
// and tells the row trigger (migration 00005) not to.
//
// The settings' statement also reads the transaction's now(): the time the
// statement after it took as its database clock (see dbNow).
const (
	planGeneric         = `SELECT now(), set_config('enable_seqscan', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)`
	planGenericNotified = `SELECT now(), set_config('enable_seqscan', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true),
		set_config('paydedup.completions_notified', 'on', true)`
)

// queryPinned runs one statement under the planner settings plan, in one
// round trip (the settings and the statement are pipelined in one implicit
// transaction), and calls each for every row. It returns the time the
// statement ran at (the test clock's, or the database's now()).
func (s *Store) queryPinned(ctx context.Context, plan, sql string, args pgx.NamedArgs, each func(pgx.Rows) error) (time.Time, error) {
	b := &pgx.Batch{}
	if strings.Contains(plan, "@") {
		b.Queue(plan, args) // a prelude that takes the statement's arguments (claimLocks)
	} else {
		b.Queue(plan)
	}
	b.Queue(sql, args)
	br := s.db.Pool.SendBatch(ctx, b)
	at, err := readPinned(br, each)
	if err != nil {
		_ = br.Close() // the same error, or one caused by it
		return time.Time{}, err
	}
	if t, ok := args["now"].(*time.Time); ok && t != nil {
		at = *t // the test clock's time, which the statement took as @now
	}
	return at, br.Close()
}

func readPinned(br pgx.BatchResults, each func(pgx.Rows) error) (time.Time, error) {
	var db time.Time
	rows, err := br.Query()
	if err != nil {
		return db, err
	}
	if rows.Next() {
		dest := make([]any, len(rows.FieldDescriptions())) // the settings' values are skipped
		dest[0] = &db
		err = rows.Scan(dest...)
	}
	rows.Close()
	if err = cmp.Or(err, rows.Err()); err != nil {
		return db, err
	}
	return db, readRows(br, each)
}

func readRows(br pgx.BatchResults, each func(pgx.Rows) error) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// storeErrors are the sentinels the store's errors wrap.
var storeErrors = pg.Errors{
	NotFound: ledger.ErrNotFound,
	Unique:   map[string]error{"payments_charge_unique": ledger.ErrLedgerConflict, "payments_key_unique": ledger.ErrLedgerConflict},
}

// interpretError maps pgx errors to the package's errors; pgx types never
// leave the package.
func interpretError(op string, err error) error {
	return pg.Interpret(op, err, storeErrors)
}

// Get returns the record for a key.
func (s *Store) Get(ctx context.Context, merchantID, key string) (ledger.Record, error) {
	var rec ledger.Record
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		var err error
		rec, err = scanRecord(s.db.Pool.QueryRow(ctx,
			`SELECT `+recordColumns+` FROM idempotency_keys WHERE merchant_id = $1 AND idempotency_key = $2`,
			merchantID, key))
		return err
	})
	if err != nil {
		return ledger.Record{}, interpretError("get key", err)
	}
	return rec, nil
}
