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
// decides a retried refund by (migration 00030 grants it SELECT on
// refunds): never its lease or its provider key.
const refundReadColumns = `merchant_id, idempotency_key, payment_key, request_hash, amount, currency, status,
	coalesce(refund_id, ''), coalesce(response_status, 0), response, coalesce(reason, ''), created_at, updated_at, completed_at`

func scanRefundRead(row pgx.Row) (ledger.Refund, error) {
	var r ledger.Refund
	var completed *time.Time
	if err := row.Scan(&r.MerchantID, &r.IdempotencyKey, &r.PaymentKey, &r.RequestHash, &r.Amount, &r.Currency, &r.Status,
		&r.RefundID, &r.ResponseStatus, &r.Response, &r.Reason, &r.CreatedAt, &r.UpdatedAt, &completed); err != nil {
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

// maxRefundsShown bounds the refunds of one payment a read returns.
const maxRefundsShown = 100

// RefundsOf returns the refunds of the payment (merchantID, paymentKey),
// oldest first, at most 100.
func (s *Store) RefundsOf(ctx context.Context, merchantID, paymentKey string) ([]ledger.Refund, error) {
	var out []ledger.Refund
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		out = out[:0]
		rows, err := s.db.Pool.Query(ctx, `SELECT `+refundReadColumns+` FROM refunds
			WHERE merchant_id = $1 AND payment_key = $2 ORDER BY id LIMIT $3`, merchantID, paymentKey, maxRefundsShown)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			r, err := scanRefundRead(rows)
			if err != nil {
				return err
			}
			out = append(out, r)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, interpretError("list refunds", err)
	}
	return out, nil
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
