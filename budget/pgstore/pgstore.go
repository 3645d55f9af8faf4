// Package pgstore is the provider budget's Store on PostgreSQL: the row of
// table provider_budget (migration 00020), taken from and slowed by one
// statement each (the functions provider_budget_take and
// provider_budget_slow, which read and write the row under its lock with
// the database's time). pgx is used only here; its errors never leave.
package pgstore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/budget"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/internal/pg"
)

// DefaultStatementTimeout bounds every statement the store runs: a grant
// that takes longer is not worth waiting for (the budget then paces the
// process alone).
const DefaultStatementTimeout = 2 * time.Second

// Config configures a Store; zero values take the defaults.
type Config struct {
	StatementTimeout time.Duration
	// Clock is a test clock; leave it nil in production (see pg.Clock).
	Clock clock.Clock
}

// Store is the budget's bucket in PostgreSQL.
type Store struct{ db pg.DB }

var _ budget.Store = (*Store)(nil)

// New returns a store on pool; the schema must be migrated.
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	db, err := pg.NewDB("provider budget", pool, cfg.Clock, cfg.StatementTimeout, DefaultStatementTimeout)
	if err != nil {
		return nil, err
	}
	return &Store{db: db}, nil
}

const (
	takeSQL = `SELECT granted, coalesce(rate, 0), retry_in
		FROM provider_budget_take($1, $2, nullif($3, 0::double precision), $4, $5, $6::timestamptz)`
	slowSQL = `SELECT coalesce(rate, 0), lowered
		FROM provider_budget_slow($1, $2, $3, $4, $5, $6, $7::timestamptz)`
)

// Take implements budget.Store.
func (s *Store) Take(ctx context.Context, t budget.Take) (budget.Grant, error) {
	var g budget.Grant
	var retryIn float64
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, takeSQL, t.Name, t.Want, t.Ceiling, t.Increase, t.Burst, s.db.Now()).
			Scan(&g.Tokens, &g.Rate, &retryIn)
	})
	if err != nil {
		return budget.Grant{}, pg.Interpret("take provider budget", err, pg.Errors{})
	}
	g.RetryIn = time.Duration(retryIn * float64(time.Second))
	return g, nil
}

// Slow implements budget.Store.
func (s *Store) Slow(ctx context.Context, sl budget.Slow) (float64, bool, error) {
	var r float64
	var lowered bool
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, slowSQL, sl.Name, sl.Lower, sl.Factor, sl.Interval.Seconds(), sl.Floor,
			sl.RetryAfter.Seconds(), s.db.Now()).Scan(&r, &lowered)
	})
	if err != nil {
		return 0, false, pg.Interpret("slow provider budget", err, pg.Errors{})
	}
	return r, lowered, nil
}
