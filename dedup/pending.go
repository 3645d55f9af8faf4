package dedup

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// PendingCounts are the figures an operator alerts on, cheap enough to read
// on every metrics scrape: both use the partial index on pending rows.
type PendingCounts struct {
	// Pending counts rows claimed and not finished.
	Pending int64
	// Stuck counts pending rows whose lease expired more than the grace
	// ago: their holder is gone and nothing has resolved them yet.
	Stuck int64
}

// CountPending reads PendingCounts as of now.
func (s *Store) CountPending(ctx context.Context, now time.Time, grace time.Duration) (PendingCounts, error) {
	var c PendingCounts
	err := s.withRetry(ctx, func(ctx context.Context) error {
		return s.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE locked_until < @stuck_before)
			FROM idempotency_keys WHERE status = 'pending'`,
			pgx.NamedArgs{"stuck_before": now.Add(-grace)}).Scan(&c.Pending, &c.Stuck)
	})
	if err != nil {
		return PendingCounts{}, interpretError("count pending keys", err)
	}
	return c, nil
}

// Now is the store's clock: lease times are written from it.
func (s *Store) Now() time.Time { return s.clock.Now() }
