package pgstore

import (
	"context"
	"errors"
	"time"

	"github.com/paydedup/paydedup/ledger"
)

// MaxOpsShown bounds the captures and cancels of one payment a read lists
// (one holds at a time; refused ones pile up only as retries do).
const MaxOpsShown = 100

// OpsOf returns the captures and cancels of the payment (merchantID,
// paymentKey), oldest first, the first MaxOpsShown: the columns migration
// 00031 grants the gateway (paymentOpReadColumns).
func (s *Store) OpsOf(ctx context.Context, merchantID, paymentKey string) ([]ledger.PaymentOp, error) {
	var ops []ledger.PaymentOp
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		ops = ops[:0]
		rows, err := s.db.Pool.Query(ctx, `SELECT `+paymentOpReadColumns+` FROM payment_ops
			WHERE merchant_id = $1 AND payment_key = $2 ORDER BY id LIMIT $3`, merchantID, paymentKey, MaxOpsShown)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var o ledger.PaymentOp
			var completed *time.Time
			if err := rows.Scan(&o.MerchantID, &o.IdempotencyKey, &o.Kind, &o.PaymentKey, &o.RequestHash, &o.Amount,
				&o.AmountReceived, &o.Currency, &o.Status, &o.Reason, &o.CreatedAt, &completed); err != nil {
				return err
			}
			if completed != nil {
				o.CompletedAt = *completed
			}
			ops = append(ops, o)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, interpretError("list payment ops", err)
	}
	return ops, nil
}

// Lifecycle reads what moved the payment (merchantID, key) after its own
// outcome (ledger.Lifecycle): its ledger row's status and what a capture
// received (PaymentLife; none when it has no ledger row), its captures
// and cancels (OpsOf) and its refunds with their sums (RefundsOf), the
// reads the gateway's GET shows a payment by. Three statements: an
// operator's read, not a hot path.
func (s *Store) Lifecycle(ctx context.Context, merchantID, key string) (ledger.Lifecycle, error) {
	var l ledger.Lifecycle
	var err error
	l.LedgerStatus, l.AmountReceived, err = s.PaymentLife(ctx, merchantID, key)
	if err != nil && !errors.Is(err, ledger.ErrNotFound) {
		return ledger.Lifecycle{}, err
	}
	if l.Ops, err = s.OpsOf(ctx, merchantID, key); err != nil {
		return ledger.Lifecycle{}, err
	}
	if l.Refunds, l.RefundsTotal, l.AmountRefunded, err = s.RefundsOf(ctx, merchantID, key); err != nil {
		return ledger.Lifecycle{}, err
	}
	return l, nil
}
