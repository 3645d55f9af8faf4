package dedup

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/ledger"
)

// The audit's reads of the ledger (package audit compares them with the
// provider's records). Read-only: nothing here writes.

// auditPage is the number of ledger rows one PaymentsBetween statement
// reads; pages follow the (created_at, id) index order.
const auditPage = 5000

const auditColumns = `p.id, p.merchant_id, p.idempotency_key, p.provider_key, p.charge_id, p.status, p.amount, p.currency, p.created_at`

// PaymentsBetween returns the ledger rows created in [from, to), of
// merchantID only when it is not empty, oldest first. It reads in keyset
// pages on payments_created_at, each its own statement under the store's
// timeout, so a long window never holds one long query.
func (s *Store) PaymentsBetween(ctx context.Context, from, to time.Time, merchantID string) ([]ledger.Payment, error) {
	var (
		out    []ledger.Payment
		lastAt = from
		lastID int64
	)
	for {
		var page []ledger.Payment
		var ids []int64
		err := s.db.Retry(ctx, func(ctx context.Context) error {
			page, ids = page[:0], ids[:0]
			rows, err := s.db.Pool.Query(ctx, `SELECT `+auditColumns+` FROM payments p
				WHERE (p.created_at, p.id) > (@after_at, @after_id) AND p.created_at < @to
				  AND (@merchant = '' OR p.merchant_id = @merchant)
				ORDER BY p.created_at, p.id LIMIT @limit`,
				pgx.NamedArgs{"after_at": lastAt, "after_id": lastID, "to": to, "merchant": merchantID, "limit": auditPage})
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				id, p, err := scanPayment(rows)
				if err != nil {
					return err
				}
				page, ids = append(page, p), append(ids, id)
			}
			return rows.Err()
		})
		if err != nil {
			return nil, interpretError("list payments", err)
		}
		out = append(out, page...)
		if len(page) < auditPage {
			return out, nil
		}
		lastAt, lastID = page[len(page)-1].CreatedAt, ids[len(ids)-1]
	}
}

// paymentsForSQL reads the ledger rows of a batch of keys.
var paymentsForSQL = `SELECT ` + auditColumns + ` FROM payments p
	WHERE (p.merchant_id, p.idempotency_key) IN
	      (SELECT DISTINCT * FROM unnest(@merchants::text[], @keys::text[]))`

// PaymentsFor returns the ledger rows of the keys that have one, once each,
// in no particular order; keys without a row are absent. It takes one round
// trip.
func (s *Store) PaymentsFor(ctx context.Context, refs []ledger.KeyRef) ([]ledger.Payment, error) {
	return sendQueued(ctx, s, "get payments", func(b *pg.Batch) func() []ledger.Payment { return s.QueuePaymentsFor(b, refs) })
}

// QueuePaymentsFor queues PaymentsFor's read of refs on b, as
// QueueGetMany does GetMany's, and returns the function that gives its rows
// once b is sent without error.
func (s *Store) QueuePaymentsFor(b *pg.Batch, refs []ledger.KeyRef) func() []ledger.Payment {
	var out []ledger.Payment
	if len(refs) == 0 {
		return func() []ledger.Payment { return out }
	}
	for start := 0; start < len(refs); start += lookupBatch {
		merchants, keys := refColumns(refs[start:min(start+lookupBatch, len(refs))])
		b.Query(paymentsForSQL, func(rows pgx.Rows) error {
			for rows.Next() {
				_, p, err := scanPayment(rows)
				if err != nil {
					return err
				}
				out = append(out, p)
			}
			return rows.Err()
		}, pgx.NamedArgs{"merchants": merchants, "keys": keys})
	}
	return func() []ledger.Payment { return out }
}

func scanPayment(rows pgx.Rows) (int64, ledger.Payment, error) {
	var (
		id       int64
		p        ledger.Payment
		chargeID *string
	)
	err := rows.Scan(&id, &p.MerchantID, &p.IdempotencyKey, &p.ProviderKey, &chargeID, &p.Status, &p.Amount, &p.Currency, &p.CreatedAt)
	p.ChargeID = deref(chargeID)
	return id, p, err
}
