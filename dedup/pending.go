package dedup

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/ledger"
)

// CountPending reads PendingCounts as of the store's time (the database's
// clock in production). A row counts as stuck when it has been pending for
// longer than grace.
func (s *Store) CountPending(ctx context.Context, grace time.Duration) (ledger.PendingCounts, error) {
	var c ledger.PendingCounts
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE pending_since < `+dbNow+` - @grace::interval)
			FROM pending_keys p JOIN idempotency_keys k USING (merchant_id, idempotency_key) WHERE k.status = 'pending'`,
			pgx.NamedArgs{"now": s.db.Now(), "grace": grace}).Scan(&c.Pending, &c.Stuck)
	})
	if err != nil {
		return ledger.PendingCounts{}, interpretError("count pending keys", err)
	}
	return c, nil
}
