// Package pgstore is the gateway's Postgres store: its intake guard rows
// (gateway_intake), the API keys it authenticates (api_keys), and the
// Listener that wakes requests waiting on a key's completion. The tables
// are migrated with the rest of the schema (dedup.Migrator).
//
// The Listener consumes what dedup announces on dedup.CompletedChannel (its
// documented contract: a completed key that has an intake row, payload
// {"s": schema, "m": merchant, "k": key}); MarkIntakeDeadLettered, which
// the worker calls for a final dead letter, sends the same payload on the
// same channel, so a waiting request re-reads the key and answers the dead
// letter.
//
// pgx is used only here (and in internal/pg); its errors never leave the
// package: they wrap dedup's sentinels (dedup.ErrNotFound,
// dedup.ErrLeaseLost, dedup.ErrUnavailable), which the gateway tests with
// errors.Is.
package pgstore

import (
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/internal/pg"
)

// DefaultStatementTimeout bounds every statement the store runs.
const DefaultStatementTimeout = 10 * time.Second

// Config configures a Store. Zero values take the defaults.
type Config struct {
	StatementTimeout time.Duration
	// Clock is a test clock; leave it nil in production (see pg.Clock).
	Clock clock.Clock
}

// Store is the gateway's Postgres store. It is safe for concurrent use.
type Store struct{ db pg.DB }

// New returns a store on pool. The schema must be migrated
// (dedup.Migrator).
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	db, err := pg.NewDB("gateway store", pool, cfg.Clock, cfg.StatementTimeout, DefaultStatementTimeout)
	if err != nil {
		return nil, err
	}
	return &Store{db: db}, nil
}

// dbNow is the SQL for the statement's time (see pg.DBNow).
const dbNow = pg.DBNow

// pinPlans is queued first in the pipelined batch of a statement that
// takes a batch of keys (the acquisition, the read of held intakes, the
// publish mark; the batch's reads of records and ledger are pinned by
// dedup's own settings): for that one implicit transaction, no sequential
// scan and generic plans. The only plans that
// stay cheap as the tables grow probe an index once per key; left to
// itself the planner picks a hash join over a sequential scan of the whole
// table when its statistics are older than the table (a young deployment,
// or traffic that outgrew them), and every batch then reads every row.
// The worker's statements are pinned the same way (dedup's planGeneric);
// TestIntakeBatchReadsBoundedByBatch holds the gateway's to it.
const pinPlans = `SELECT set_config('enable_seqscan', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)`

// storeErrors are the sentinels the store's errors wrap.
var storeErrors = pg.Errors{NotFound: dedup.ErrNotFound}

// interpretError maps pgx errors to the store's errors; pgx types never
// leave the package.
func interpretError(op string, err error) error {
	return pg.Interpret(op, err, storeErrors)
}

// rowKey is a (merchant, key) pair.
type rowKey struct{ merchant, key string }
