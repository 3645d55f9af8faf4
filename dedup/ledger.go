package dedup

import (
	"context"
	"time"
)

// Payment is one row of the payments ledger: the business effect of a
// completed key. The ledger is never purged, so it outlives the key's row.
type Payment struct {
	MerchantID     string
	IdempotencyKey string
	ProviderKey    string
	ChargeID       string // empty for a decline that created no object
	Status         string // "succeeded" or "declined"
	Amount         int64
	Currency       string
	CreatedAt      time.Time
}

// Matches reports whether a request with req's amount and currency may be
// this payment. The ledger keeps no fingerprint, so once a key's row is
// purged these are all that tell the old payment's late copy (a duplicate)
// from another payment sent under the old key (a reused key).
func (p Payment) Matches(req ClaimRequest) bool {
	return p.Amount == req.Amount && p.Currency == req.Currency
}

// GetPayment returns the ledger row of a key, or ErrNotFound.
func (s *Store) GetPayment(ctx context.Context, merchantID, key string) (Payment, error) {
	var (
		p        Payment
		chargeID *string
	)
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, `SELECT merchant_id, idempotency_key, provider_key, charge_id, status, amount, currency, created_at
			FROM payments WHERE merchant_id = $1 AND idempotency_key = $2`, merchantID, key).
			Scan(&p.MerchantID, &p.IdempotencyKey, &p.ProviderKey, &chargeID, &p.Status, &p.Amount, &p.Currency, &p.CreatedAt)
	})
	if err != nil {
		return Payment{}, interpretError("get payment", err)
	}
	p.ChargeID = deref(chargeID)
	return p, nil
}
