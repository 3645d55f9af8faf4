package dedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/ledger"
)

// GetPayment returns the ledger row of a key, or ErrNotFound.
func (s *Store) GetPayment(ctx context.Context, merchantID, key string) (ledger.Payment, error) {
	var (
		p        ledger.Payment
		chargeID *string
		settled  *time.Time
	)
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, `SELECT `+paymentColumns+`
			FROM payments WHERE merchant_id = $1 AND idempotency_key = $2`, merchantID, key).
			Scan(paymentScan(&p, &chargeID, &settled)...)
	})
	if err != nil {
		return ledger.Payment{}, interpretError("get payment", err)
	}
	p.ChargeID, p.SettledAt = deref(chargeID), derefTime(settled)
	return p, nil
}

const paymentColumns = `merchant_id, idempotency_key, provider_key, charge_id, status, amount, currency, created_at, settled_at`

func paymentScan(p *ledger.Payment, chargeID **string, settled **time.Time) []any {
	return []any{&p.MerchantID, &p.IdempotencyKey, &p.ProviderKey, chargeID, &p.Status, &p.Amount, &p.Currency, &p.CreatedAt, settled}
}

func derefTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// ProcessingPayments returns up to limit ledger rows still `processing`,
// oldest first, after cur, and the cursor to pass for the next page (the
// zero cursor once the scan reached the end).
func (s *Store) ProcessingPayments(ctx context.Context, cur ledger.ProcessingCursor, limit int) ([]ledger.Payment, ledger.ProcessingCursor, error) {
	var (
		out  []ledger.Payment
		next ledger.ProcessingCursor
	)
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		out, next = out[:0], ledger.ProcessingCursor{}
		rows, err := s.db.Pool.Query(ctx, `SELECT id, `+paymentColumns+` FROM payments
			WHERE status = 'processing' AND (created_at, id) > ($1, $2)
			ORDER BY created_at, id LIMIT $3`, cur.CreatedAt, cur.ID, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				p        ledger.Payment
				id       int64
				chargeID *string
				settled  *time.Time
			)
			if err := rows.Scan(append([]any{&id}, paymentScan(&p, &chargeID, &settled)...)...); err != nil {
				return err
			}
			p.ChargeID, p.SettledAt = deref(chargeID), derefTime(settled)
			out = append(out, p)
			next = ledger.ProcessingCursor{CreatedAt: p.CreatedAt, ID: id}
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
		return nil, ledger.ProcessingCursor{}, interpretError("list processing payments", err)
	}
	return out, next, nil
}

// settleSQL moves one processing ledger row to its final status and, when
// the key's row is still kept, replaces its stored response with the final
// one, in one statement: the settle_payment function of migration 00011,
// which the worker and the gateway roles may call but not bypass (neither
// may update those tables itself). It is false when the row is not
// processing; nothing is changed then.
const settleSQL = `SELECT settle_payment(@merchant, @key, @charge_id, @status, @response_status, @response, @now)`

// SettlePayment records how a processing payment ended: status is
// PaymentSucceeded or PaymentFailed, responseStatus and response the final
// answer replayed from now on to duplicates of the key. p names the ledger
// row (merchant, key, charge id). It returns ErrNotFound when the row is
// no longer processing (another reconciler settled it first): nothing is
// changed then.
func (s *Store) SettlePayment(ctx context.Context, p ledger.Payment, status string, responseStatus int, response json.RawMessage) error {
	if status != ledger.PaymentSucceeded && status != ledger.PaymentFailed {
		return fmt.Errorf("settle payment: status %q is neither %s nor %s", status, ledger.PaymentSucceeded, ledger.PaymentFailed)
	}
	if p.ChargeID == "" || len(response) == 0 || responseStatus < 100 || responseStatus > 599 {
		return errors.New("settle payment: needs the charge id, a response and its HTTP status")
	}
	args := pgx.NamedArgs{"merchant": p.MerchantID, "key": p.IdempotencyKey, "charge_id": p.ChargeID, "status": status,
		"response_status": int32(responseStatus), "response": []byte(response), "now": s.db.Now()}
	var settled bool
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, settleSQL, args).Scan(&settled)
	})
	if err != nil {
		return interpretError("settle payment", err)
	}
	if !settled {
		return fmt.Errorf("settle payment: %w", ledger.ErrNotFound)
	}
	return nil
}
