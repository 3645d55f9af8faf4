package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/ledger"
)

// The lease writes refunds and payment_ops (captures and cancels) share:
// both tables hold an operation on a payment under the same lease columns
// (status pending/unknown, locked_by, locked_until, attempts), so a
// settled answer, a lost answer and a stuck row are written alike. table
// is always one of the two names below, never input.

const (
	refundsTable    = "refunds"
	paymentOpsTable = "payment_ops"
)

// completeOpUnderLease runs completeSQL (an UPDATE … RETURNING 1 fenced by
// the lease's holder and attempt). When it moves no row, get re-reads the
// operation: one already completed with status by this very lease is
// done (a retried commit whose first answer was lost); anything else is
// ledger.ErrLeaseLost.
func (s *Store) completeOpUnderLease(ctx context.Context, what, completeSQL string, args pgx.NamedArgs, l ledger.Lease,
	status string, get func() (status, lockedBy string, attempts int, err error)) error {
	var n int
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		n = 0
		err := s.db.Pool.QueryRow(ctx, completeSQL, args).Scan(&n)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	if err != nil {
		return interpretError(what, err)
	}
	if n == 1 {
		return nil
	}
	got, lockedBy, attempts, err := get()
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if got == status && lockedBy == l.Holder && attempts == l.Attempt {
		return nil // already completed by this very lease
	}
	return fmt.Errorf("%s: %w", what, ledger.ErrLeaseLost)
}

// releaseOpLease gives up the lease l of an operation in table whose
// call's outcome is unknown: the row becomes unknown, still counted as if
// it were made, and is looked up before any re-call. With a lost lease it
// is ledger.ErrLeaseLost.
func (s *Store) releaseOpLease(ctx context.Context, what, table string, l ledger.Lease, reason string) error {
	var n int
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		n = 0
		err := s.db.Pool.QueryRow(ctx, `UPDATE `+table+`
            SET status = 'unknown', locked_until = NULL, last_error = @reason, updated_at = `+dbNow+`
            WHERE merchant_id = @merchant AND idempotency_key = @key AND status = 'pending'
              AND locked_by = @holder AND attempts = @attempt
            RETURNING 1`, pgx.NamedArgs{"merchant": l.MerchantID, "key": l.IdempotencyKey, "holder": l.Holder,
			"attempt": int32(l.Attempt), "reason": clipError(reason), "now": s.db.Now()}).Scan(&n)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	if err != nil {
		return interpretError(what, err)
	}
	if n != 1 {
		return fmt.Errorf("%s: %w", what, ledger.ErrLeaseLost)
	}
	return nil
}

// getOp reads one operation (merchantID, key) of table with scan;
// ledger.ErrNotFound when there is none.
func getOp[T any](ctx context.Context, s *Store, what, table, columns string, scan func(pgx.Row) (T, error), merchantID, key string) (T, error) {
	var op T
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		var err error
		op, err = scan(s.db.Pool.QueryRow(ctx, `SELECT `+columns+` FROM `+table+`
            WHERE merchant_id = $1 AND idempotency_key = $2`, merchantID, key))
		return err
	})
	if err != nil {
		var zero T
		return zero, interpretError(what, err)
	}
	return op, nil
}

// acquireStuckOpsSQL leases up to @limit operations of table (aliased a,
// returning columns) that may have been made and that no one resolves:
// pending with a lease run out more than @grace ago, or unknown (an
// answer lost) for more than @grace. Several reconcilers skip each
// other's rows; attempts+1 fences out the old holder.
func acquireStuckOpsSQL(table, a, columns string) string {
	return `
WITH stuck AS (
    SELECT id FROM ` + table + `
    WHERE status IN ('pending', 'unknown') AND updated_at <= ` + dbNow + ` - @grace::interval
      AND (status = 'unknown' OR locked_until <= ` + dbNow + ` - @grace::interval)
    ORDER BY updated_at
    LIMIT @limit
    FOR UPDATE SKIP LOCKED
)
UPDATE ` + table + ` AS ` + a + `
SET status = 'pending', locked_by = @holder, locked_until = ` + dbNow + ` + @lease::interval, attempts = ` + a + `.attempts + 1,
    updated_at = ` + dbNow + `
FROM stuck WHERE ` + a + `.id = stuck.id
RETURNING ` + columns
}

// acquireStuckOps leases, for holder, up to limit operations that
// acquireSQL (an acquireStuckOpsSQL) finds stuck, each read with scan.
func acquireStuckOps[T any](ctx context.Context, s *Store, what, acquireSQL string, scan func(pgx.Row) (T, error),
	holder string, grace, lease time.Duration, limit int) ([]T, error) {
	if holder == "" || lease <= 0 || limit <= 0 {
		return nil, fmt.Errorf("%s: needs a holder, a positive lease and a positive limit", what)
	}
	args := pgx.NamedArgs{"holder": holder, "grace": grace, "lease": lease, "limit": int32(limit), "now": s.db.Now()}
	var out []T
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		out = out[:0]
		rows, err := s.db.Pool.Query(ctx, acquireSQL, args)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			op, err := scan(rows)
			if err != nil {
				return err
			}
			out = append(out, op)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, interpretError(what, err)
	}
	return out, nil
}
