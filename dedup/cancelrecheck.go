package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/ledger"
)

// requestCancelRecheckSQL stamps an authorized payment for the reconciler
// to look its intent up (request_cancel_recheck, migration 00034).
const requestCancelRecheckSQL = `SELECT requested, status FROM request_cancel_recheck(@merchant, @key, @charge_id, @now)`

// RequestCancelRecheck asks the reconciler to retrieve the intent chargeID
// of the authorized payment (merchantID, key): an event said the provider
// canceled it, which only a lookup may confirm (the event may be forged or
// stale). Only an authorized payment is stamped (requested true, also when
// it was already); status is the payment's as it stands.
// ledger.ErrNotFound: no payment (merchantID, key) of that intent.
func (s *Store) RequestCancelRecheck(ctx context.Context, merchantID, key, chargeID string) (requested bool, status string, err error) {
	var st *string
	err = s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, requestCancelRecheckSQL, pgx.NamedArgs{"merchant": merchantID, "key": key,
			"charge_id": chargeID, "now": s.db.Now()}).Scan(&requested, &st)
	})
	if err != nil {
		return false, "", interpretError("request cancel recheck", err)
	}
	if st == nil {
		return false, "", fmt.Errorf("request cancel recheck: %w", ledger.ErrNotFound)
	}
	return requested, *st, nil
}

// CancelsToRecheck returns up to limit payments stamped for a recheck of
// their cancel (RequestCancelRecheck), oldest stamp first.
func (s *Store) CancelsToRecheck(ctx context.Context, limit int) ([]ledger.Payment, error) {
	var out []ledger.Payment
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		out = out[:0]
		rows, err := s.db.Pool.Query(ctx, `SELECT p.merchant_id, p.idempotency_key, p.provider_key, p.charge_id, p.status, p.amount, p.currency,
				p.created_at, p.settled_at
			FROM payment_cancel_rechecks r
			JOIN payments p ON p.merchant_id = r.merchant_id AND p.idempotency_key = r.idempotency_key AND p.charge_id = r.charge_id
			ORDER BY r.requested_at, r.merchant_id, r.idempotency_key LIMIT $1`, int32(limit))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				p        ledger.Payment
				chargeID *string
				settled  *time.Time
			)
			if err := rows.Scan(paymentScan(&p, &chargeID, &settled)...); err != nil {
				return err
			}
			p.ChargeID, p.SettledAt = deref(chargeID), derefTime(settled)
			out = append(out, p)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, interpretError("list cancels to recheck", err)
	}
	return out, nil
}

// recheckCancelSQL records what a retrieve found of a stamped payment's
// intent (recheck_payment_cancel, migration 00034).
const recheckCancelSQL = `SELECT canceled, status FROM recheck_payment_cancel(@merchant, @key, @charge_id, @provider_status, @reason, @now)`

// RecheckCancel records what the provider says now of the intent chargeID
// of a payment stamped for a recheck of its cancel: providerStatus
// canceled moves an authorized payment to canceled with one canceled
// event (CancelAuthorizedPayment's rules: not while a capture or cancel
// of it holds) and reports canceled; any other status only clears the
// stamp. status is the payment's after the call. ledger.ErrNotFound: no
// payment (merchantID, key) of that intent.
func (s *Store) RecheckCancel(ctx context.Context, merchantID, key, chargeID, providerStatus, reason string) (canceled bool, status string, err error) {
	if providerStatus == "" {
		return false, "", errors.New("recheck cancel: needs the provider's status of the intent")
	}
	var st *string
	err = s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, recheckCancelSQL, pgx.NamedArgs{"merchant": merchantID, "key": key, "charge_id": chargeID,
			"provider_status": providerStatus, "reason": reason, "now": s.db.Now()}).Scan(&canceled, &st)
	})
	if err != nil {
		return false, "", interpretError("recheck cancel", err)
	}
	if st == nil {
		return false, "", fmt.Errorf("recheck cancel: %w", ledger.ErrNotFound)
	}
	return canceled, *st, nil
}
