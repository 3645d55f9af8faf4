package pgstore

import (
	"context"
	"time"

	"github.com/paydedup/paydedup/ledger"
)

// paymentOpReadColumns are the columns of a capture or a cancel the
// gateway shows or decides a retried one by: the only ones migration
// 00031 grants it (never its lease, its provider key, its stored
// response or its last error).
const paymentOpReadColumns = `merchant_id, idempotency_key, kind, payment_key, request_hash, amount,
	coalesce(amount_received, 0), currency, status, coalesce(reason, ''), created_at, completed_at`

// GetPaymentOp returns the capture or cancel (merchantID, key), the
// operation's own key, as the worker claimed it (migration 00027);
// ledger.ErrNotFound when the worker has claimed none.
func (s *Store) GetPaymentOp(ctx context.Context, merchantID, key string) (ledger.PaymentOp, error) {
	var o ledger.PaymentOp
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		var completed *time.Time
		o = ledger.PaymentOp{}
		if err := s.db.Pool.QueryRow(ctx, `SELECT `+paymentOpReadColumns+` FROM payment_ops
			WHERE merchant_id = $1 AND idempotency_key = $2`, merchantID, key).Scan(&o.MerchantID, &o.IdempotencyKey,
			&o.Kind, &o.PaymentKey, &o.RequestHash, &o.Amount, &o.AmountReceived, &o.Currency, &o.Status, &o.Reason,
			&o.CreatedAt, &completed); err != nil {
			return err
		}
		if completed != nil {
			o.CompletedAt = *completed
		}
		return nil
	})
	if err != nil {
		return ledger.PaymentOp{}, interpretError("get payment op", err)
	}
	return o, nil
}

// PaymentLife is where an authorized payment's ledger row stands after a
// capture or a cancel moved it (migration 00027's trigger): its status
// (ledger.PaymentSucceeded once captured, ledger.PaymentCanceled, or as
// it was) and what a capture received (0 when none).
func (s *Store) PaymentLife(ctx context.Context, merchantID, key string) (status string, received int64, err error) {
	err = s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, `SELECT status, coalesce(amount_received, 0) FROM payments
			WHERE merchant_id = $1 AND idempotency_key = $2`, merchantID, key).Scan(&status, &received)
	})
	if err != nil {
		return "", 0, interpretError("read payment's ledger row", err)
	}
	return status, received, nil
}
