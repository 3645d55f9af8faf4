package dedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/ledger"
)

// settleRefundSQL moves one processing refund to its final status: the
// settle_refund function of migration 00028, which the worker's and the
// gateway's roles may call but not bypass. settled is false, and nothing
// changed, when the refund is not processing; status is then the refund's
// as it stands, NULL when there is no such refund.
const settleRefundSQL = `SELECT settled, status FROM settle_refund(@merchant, @key, @refund_id, @status, @reason,
    @response_status, @response, @now)`

// SettleRefund records how a refund the provider held pending ended:
// c.Status is RefundSucceeded or RefundFailed (a failed refund's amount
// is free to refund again), c.RefundID the provider's refund, which must
// be the one recorded. Its outcome event is written in the same
// transaction. It reports whether this call settled it and the refund's
// status as it stands after the call: a refund already settled (by the
// reconciler, an earlier delivery of the event) is left as it is and
// publishes nothing again. ledger.ErrNotFound: no refund (merchantID, key)
// with that provider id.
func (s *Store) SettleRefund(ctx context.Context, merchantID, key string, c ledger.RefundCompletion) (settled bool, status string, err error) {
	if c.Status != ledger.RefundSucceeded && c.Status != ledger.RefundFailed {
		return false, "", fmt.Errorf("settle refund: status %q is neither %s nor %s", c.Status, ledger.RefundSucceeded, ledger.RefundFailed)
	}
	return s.settleRefund(ctx, settleRefundSQL, merchantID, key, c)
}

// settleRefund runs one of the settle statements (settleRefundSQL,
// settleRefundSucceededSQL) for c.
func (s *Store) settleRefund(ctx context.Context, sql, merchantID, key string, c ledger.RefundCompletion) (settled bool, status string, err error) {
	if c.RefundID == "" || len(c.Response) == 0 || !json.Valid(c.Response) || c.ResponseStatus < 100 || c.ResponseStatus > 599 {
		return false, "", errors.New("settle refund: needs the refund id, a JSON response and its HTTP status")
	}
	args := pgx.NamedArgs{"merchant": merchantID, "key": key, "refund_id": c.RefundID, "status": c.Status, "reason": c.Reason,
		"response_status": int32(c.ResponseStatus), "response": []byte(c.Response), "now": s.db.Now()}
	var st *string
	err = s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, sql, args).Scan(&settled, &st)
	})
	if err != nil {
		return false, "", interpretError("settle refund", err)
	}
	if st == nil {
		return false, "", fmt.Errorf("settle refund: %w", ledger.ErrNotFound)
	}
	return settled, *st, nil
}

// settleRefundSucceededSQL moves one processing refund to succeeded only:
// settle_refund_succeeded (migration 00033), the gateway's one way to
// settle a refund. It can never free a refund's amount.
const settleRefundSucceededSQL = `SELECT settled, status FROM settle_refund_succeeded(@merchant, @key, @refund_id, @reason,
    @response_status, @response, @now)`

// SettleRefundSucceeded is SettleRefund for a refund the provider reports
// succeeded, the webhook's (the gateway's role may not fail a refund: an
// event is only a hint, and a failed refund's amount is free to refund
// again). c.Status must be RefundSucceeded.
func (s *Store) SettleRefundSucceeded(ctx context.Context, merchantID, key string, c ledger.RefundCompletion) (settled bool, status string, err error) {
	if c.Status != ledger.RefundSucceeded {
		return false, "", fmt.Errorf("settle refund succeeded: status %q is not %s", c.Status, ledger.RefundSucceeded)
	}
	return s.settleRefund(ctx, settleRefundSucceededSQL, merchantID, key, c)
}

// ProcessingRefunds returns up to limit refunds the provider holds
// pending (status processing), oldest first, after cur, and the cursor to
// pass for the next page (the zero cursor once the scan reached the end).
func (s *Store) ProcessingRefunds(ctx context.Context, cur ledger.ProcessingCursor, limit int) ([]ledger.Refund, ledger.ProcessingCursor, error) {
	var (
		out  []ledger.Refund
		next ledger.ProcessingCursor
	)
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		out, next = out[:0], ledger.ProcessingCursor{}
		rows, err := s.db.Pool.Query(ctx, `SELECT id, `+refundColumns+` FROM refunds
			WHERE status = 'processing' AND (created_at, id) > ($1, $2)
			ORDER BY created_at, id LIMIT $3`, cur.CreatedAt, cur.ID, int32(limit))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id int64
			r, err := scanRefund(idRow{id: &id, row: rows})
			if err != nil {
				return err
			}
			out = append(out, r)
			next = ledger.ProcessingCursor{CreatedAt: r.CreatedAt, ID: id}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(out) < limit {
			next = ledger.ProcessingCursor{}
		}
		return nil
	})
	if err != nil {
		return nil, ledger.ProcessingCursor{}, interpretError("list processing refunds", err)
	}
	return out, next, nil
}

// idRow scans a leading id column, then hands the rest to scanRefund.
type idRow struct {
	id  *int64
	row pgx.Row
}

func (r idRow) Scan(dest ...any) error { return r.row.Scan(append([]any{r.id}, dest...)...) }

// refundsOfSQL reads the refunds of a batch of payments (merchant,
// payment key), by the claim's index.
const refundsOfSQL = `SELECT ` + refundColumns + ` FROM refunds
    WHERE (merchant_id, payment_key) IN (SELECT DISTINCT * FROM unnest(@merchants::text[], @keys::text[]))
    ORDER BY merchant_id, payment_key, id`

// RefundsOf returns every refund of the payments refs names (a KeyRef's
// IdempotencyKey is the payment's key), in any status: the audit compares
// them with the provider's refunds of those payments.
func (s *Store) RefundsOf(ctx context.Context, payments []ledger.KeyRef) ([]ledger.Refund, error) {
	var out []ledger.Refund
	for start := 0; start < len(payments); start += lookupBatch {
		merchants, keys := refColumns(payments[start:min(start+lookupBatch, len(payments))])
		err := s.db.Retry(ctx, func(ctx context.Context) error {
			rows, err := s.db.Pool.Query(ctx, refundsOfSQL, pgx.NamedArgs{"merchants": merchants, "keys": keys})
			if err != nil {
				return err
			}
			defer rows.Close()
			page := out
			for rows.Next() {
				r, err := scanRefund(rows)
				if err != nil {
					return err
				}
				page = append(page, r)
			}
			if err := rows.Err(); err != nil {
				return err
			}
			out = page
			return nil
		})
		if err != nil {
			return nil, interpretError("refunds of payments", err)
		}
	}
	return out, nil
}
