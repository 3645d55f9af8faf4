package dedup

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// PendingCounts are the figures an operator alerts on, cheap enough to read
// on every metrics scrape: both walk pending_keys, which names only the keys
// in flight or stuck.
type PendingCounts struct {
	// Pending counts rows claimed and not finished.
	Pending int64
	// Stuck counts rows pending for longer than the grace: since they became
	// pending (pending_since), however often a redelivery or a failed lookup
	// took and released them since.
	Stuck int64
}

// CountPending reads PendingCounts as of the store's time (the database's
// clock in production). A row counts as stuck when it has been pending for
// longer than grace.
func (s *Store) CountPending(ctx context.Context, grace time.Duration) (PendingCounts, error) {
	var c PendingCounts
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE pending_since < `+dbNow+` - @grace::interval)
			FROM pending_keys p JOIN idempotency_keys k USING (merchant_id, idempotency_key) WHERE k.status = 'pending'`,
			pgx.NamedArgs{"now": s.db.Now(), "grace": grace}).Scan(&c.Pending, &c.Stuck)
	})
	if err != nil {
		return PendingCounts{}, interpretError("count pending keys", err)
	}
	return c, nil
}
