package pgstore

import (
	"context"
	"errors"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/ledger"
)

// refundReadColumns are the columns of a refund the gateway shows or
// decides a retried refund by, the only ones migration 00030 grants it
// (with id, its order): never its lease, its provider key or its stored
// response.
const refundReadColumns = `merchant_id, idempotency_key, payment_key, request_hash, amount, currency, status,
	coalesce(refund_id, ''), coalesce(reason, ''), created_at, updated_at, completed_at`

func scanRefundRead(row pgx.Row) (ledger.Refund, error) {
	var r ledger.Refund
	var completed *time.Time
	if err := row.Scan(&r.MerchantID, &r.IdempotencyKey, &r.PaymentKey, &r.RequestHash, &r.Amount, &r.Currency, &r.Status,
		&r.RefundID, &r.Reason, &r.CreatedAt, &r.UpdatedAt, &completed); err != nil {
		return ledger.Refund{}, err
	}
	if completed != nil {
		r.CompletedAt = *completed
	}
	return r, nil
}

// GetRefund returns the refund (merchantID, key), the refund's own key;
// ledger.ErrNotFound when the worker has claimed none.
func (s *Store) GetRefund(ctx context.Context, merchantID, key string) (ledger.Refund, error) {
	var r ledger.Refund
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		var err error
		r, err = scanRefundRead(s.db.Pool.QueryRow(ctx, `SELECT `+refundReadColumns+` FROM refunds
			WHERE merchant_id = $1 AND idempotency_key = $2`, merchantID, key))
		return err
	})
	if err != nil {
		return ledger.Refund{}, interpretError("get refund", err)
	}
	return r, nil
}

// MaxRefundsShown bounds the refunds of one payment a read lists; the
// sums count them all (RefundsOf).
const MaxRefundsShown = 100

// RefundsOf returns the refunds of the payment (merchantID, paymentKey),
// oldest first, the first MaxRefundsShown of them; and, over all of them
// (summed in the statement, never cut), how many there are and the amount
// refunded: the succeeded refunds' and those the provider holds pending
// (ledger.RefundProcessing), as Stripe's amount_refunded counts its
// pending refunds. A refund claimed whose call is under way or unknown is
// not counted: the provider may not have it.
func (s *Store) RefundsOf(ctx context.Context, merchantID, paymentKey string) (refunds []ledger.Refund, total int, refunded int64, err error) {
	err = s.db.Retry(ctx, func(ctx context.Context) error {
		refunds, total, refunded = refunds[:0], 0, 0
		// The window sums run over every refund of the payment, before
		// the LIMIT: one statement, one snapshot.
		rows, err := s.db.Pool.Query(ctx, `SELECT `+refundReadColumns+`, count(*) OVER (),
				coalesce(sum(amount) FILTER (WHERE status IN ('succeeded', 'processing')) OVER (), 0)
			FROM refunds WHERE merchant_id = $1 AND payment_key = $2 ORDER BY id LIMIT $3`, merchantID, paymentKey, MaxRefundsShown)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var r ledger.Refund
			var completed *time.Time
			var n int64
			if err := rows.Scan(&r.MerchantID, &r.IdempotencyKey, &r.PaymentKey, &r.RequestHash, &r.Amount, &r.Currency, &r.Status,
				&r.RefundID, &r.Reason, &r.CreatedAt, &r.UpdatedAt, &completed, &n, &refunded); err != nil {
				return err
			}
			if completed != nil {
				r.CompletedAt = *completed
			}
			total = int(n)
			refunds = append(refunds, r)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, 0, 0, interpretError("list refunds", err)
	}
	return refunds, total, refunded, nil
}

// RefusalOf returns the reason the worker refused the command it
// consumed at stream sequence seq under (merchantID, key): the refused
// outcome event it wrote when it dead-lettered the command (migration
// 00026; a refund the ledger's rules refuse, over_refundable...). ok is
// false while the outbox holds none (not refused, or purged after its
// retention).
func (s *Store) RefusalOf(ctx context.Context, merchantID, key string, seq uint64) (reason string, ok bool, err error) {
	if seq == 0 || seq > math.MaxInt64 {
		return "", false, nil
	}
	id := merchantID + ":" + key + ":refused:" + strconv.FormatUint(seq, 10)
	err = s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, `SELECT coalesce(reason, '') FROM outcome_events WHERE event_id = $1
			AND merchant_id = $2 AND idempotency_key = $3 AND kind = 'refused'`, id, merchantID, key).Scan(&reason)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, interpretError("read refusal", err)
	}
	return reason, true, nil
}
