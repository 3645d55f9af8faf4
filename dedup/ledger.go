package dedup

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
)

// Payment is one row of the payments ledger: the business effect of a
// completed key. The ledger is never purged, so it outlives the key's row.
type Payment struct {
	MerchantID     string
	IdempotencyKey string
	ProviderKey    string
	ChargeID       string // empty for a decline that created no object
	Status         string // PaymentSucceeded, PaymentDeclined, PaymentProcessing or PaymentFailed
	Amount         int64
	Currency       string
	CreatedAt      time.Time
	SettledAt      time.Time // when a processing payment settled; zero otherwise
}

// The ledger's payment statuses. A row is never changed but for one
// transition, guarded by the schema (migration 00009): PaymentProcessing to
// PaymentSucceeded or PaymentFailed, by SettlePayment.
const (
	PaymentSucceeded  = "succeeded"
	PaymentDeclined   = "declined"
	PaymentProcessing = "processing"
	// PaymentFailed is a processing payment that ended without moving
	// money (a bank debit returned).
	PaymentFailed = "failed"
)

// GetPayment returns the ledger row of a key, or ErrNotFound.
func (s *Store) GetPayment(ctx context.Context, merchantID, key string) (Payment, error) {
	var (
		p        Payment
		chargeID *string
		settled  *time.Time
	)
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, `SELECT `+paymentColumns+`
			FROM payments WHERE merchant_id = $1 AND idempotency_key = $2`, merchantID, key).
			Scan(p.scan(&chargeID, &settled)...)
	})
	if err != nil {
		return Payment{}, interpretError("get payment", err)
	}
	p.ChargeID, p.SettledAt = deref(chargeID), derefTime(settled)
	return p, nil
}

const paymentColumns = `merchant_id, idempotency_key, provider_key, charge_id, status, amount, currency, created_at, settled_at`

func (p *Payment) scan(chargeID **string, settled **time.Time) []any {
	return []any{&p.MerchantID, &p.IdempotencyKey, &p.ProviderKey, chargeID, &p.Status, &p.Amount, &p.Currency, &p.CreatedAt, settled}
}

func derefTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// ProcessingCursor is where a scan of processing payments resumes: after
// the payment created at CreatedAt with ledger id ID. The zero value starts
// at the oldest.
type ProcessingCursor struct {
	CreatedAt time.Time
	ID        int64
}

// ProcessingPayments returns up to limit ledger rows still `processing`,
// oldest first, after cur, and the cursor to pass for the next page (the
// zero cursor once the scan reached the end).
func (s *Store) ProcessingPayments(ctx context.Context, cur ProcessingCursor, limit int) ([]Payment, ProcessingCursor, error) {
	var (
		out  []Payment
		next ProcessingCursor
	)
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		out, next = out[:0], ProcessingCursor{}
		rows, err := s.db.Pool.Query(ctx, `SELECT id, `+paymentColumns+` FROM payments
			WHERE status = 'processing' AND (created_at, id) > ($1, $2)
			ORDER BY created_at, id LIMIT $3`, cur.CreatedAt, cur.ID, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				p        Payment
				id       int64
				chargeID *string
				settled  *time.Time
			)
			if err := rows.Scan(append([]any{&id}, p.scan(&chargeID, &settled)...)...); err != nil {
				return err
			}
			p.ChargeID, p.SettledAt = deref(chargeID), derefTime(settled)
			out = append(out, p)
			next = ProcessingCursor{CreatedAt: p.CreatedAt, ID: id}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(out) < limit {
			next = ProcessingCursor{}
		}
		return nil
	})
	if err != nil {
		return nil, ProcessingCursor{}, interpretError("list processing payments", err)
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

// SettleStatus is the ledger status and stored HTTP status of a processing
// payment whose provider answer is final: PaymentFailed and 402 when the
// provider declined it (httpStatus, when not 0, over 402), else
// PaymentSucceeded and 200. The reconciler and the gateway's webhook both
// read an answer through it, so the two cannot settle a row differently.
func SettleStatus(declined bool, httpStatus int) (status string, responseStatus int) {
	if declined {
		return PaymentFailed, cmp.Or(httpStatus, http.StatusPaymentRequired)
	}
	return PaymentSucceeded, cmp.Or(httpStatus, http.StatusOK)
}

// SettlePayment records how a processing payment ended: status is
// PaymentSucceeded or PaymentFailed, responseStatus and response the final
// answer replayed from now on to duplicates of the key. p names the ledger
// row (merchant, key, charge id). It returns ErrNotFound when the row is
// no longer processing (another reconciler settled it first): nothing is
// changed then.
func (s *Store) SettlePayment(ctx context.Context, p Payment, status string, responseStatus int, response json.RawMessage) error {
	if status != PaymentSucceeded && status != PaymentFailed {
		return fmt.Errorf("settle payment: status %q is neither %s nor %s", status, PaymentSucceeded, PaymentFailed)
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
		return fmt.Errorf("settle payment: %w", ErrNotFound)
	}
	return nil
}
