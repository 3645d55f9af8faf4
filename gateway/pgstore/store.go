// Package pgstore is the gateway's Postgres store: its intake guard rows
// (gateway_intake), the API keys it authenticates (api_keys), and the
// Listener that wakes requests waiting on a key's completion. The tables
// are migrated with the rest of the schema (migrations/migrate).
//
// The Listener consumes what dedup announces on dedup.CompletedChannel (its
// documented contract: a completed key that has an intake row, payload
// {"s": schema, "m": merchant, "k": key}); MarkIntakeDeadLettered, which
// the worker calls for a final dead letter, sends the same payload on the
// same channel, so a waiting request re-reads the key and answers the dead
// letter.
//
// pgx is used only here (and in internal/pg); its errors never leave the
// package: they wrap the core's sentinels (ledger.ErrNotFound,
// ledger.ErrLeaseLost, ledger.ErrUnavailable, apikey.ErrUnauthenticated),
// which the gateway tests with errors.Is. Its values (ledger.Intake,
// ledger.IntakeResult, ledger.BatchReads, ledger.Subscription...) are the
// core's too, so gateway.Store and gateway.Completions name no driver type.
package pgstore

import (
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/ledger"
)

// DefaultStatementTimeout bounds every statement the store runs.
const DefaultStatementTimeout = 10 * time.Second

// Config configures a Store. Zero values take the defaults.
type Config struct {
	StatementTimeout time.Duration
	// Clock is a test clock; leave it nil in production (see pg.Clock).
	Clock clock.Clock
	// Records are the worker's records (*dedup.Store) on the same
	// database, whose reads ReadBatch queues on its round trip. A store
	// without them fails ReadBatch.
	Records RecordReads
}

// Store is the gateway's Postgres store. It is safe for concurrent use.
type Store struct {
	db      pg.DB
	records RecordReads
}

// New returns a store on pool. The schema must be migrated
// (migrations/migrate).
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	db, err := pg.NewDB("gateway store", pool, cfg.Clock, cfg.StatementTimeout, DefaultStatementTimeout)
	if err != nil {
		return nil, err
	}
	return &Store{db: db, records: cfg.Records}, nil
}

// dbNow is the SQL for the statement's time (see pg.DBNow).
const dbNow = pg.DBNow

// pinPlans is queued first in the pipelined batch of a statement that
// takes a batch of keys (the acquisition, the read of held intakes, the
// publish mark), as pg.NewBatch pins the batch of reads: a probe per key
// whatever the tables' statistics. TestIntakeBatchReadsBoundedByBatch
// holds the gateway's statements to it.
const pinPlans = pg.PinPlans

// storeErrors are the sentinels the store's errors wrap.
var storeErrors = pg.Errors{NotFound: ledger.ErrNotFound}

// interpretError maps pgx errors to the store's errors; pgx types never
// leave the package.
func interpretError(op string, err error) error {
	return pg.Interpret(op, err, storeErrors)
}

// rowKey is a (merchant, key) pair.
type rowKey struct{ merchant, key string }
