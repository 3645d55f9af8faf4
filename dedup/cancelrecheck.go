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
// their cancel (RequestCancelRecheck) that are due (next_at passed),
// earliest due first, each with its stamp's requested_at (RecheckCancel
// and PostponeCancelRecheck take it back) and attempts.
func (s *Store) CancelsToRecheck(ctx context.Context, limit int) ([]ledger.CancelRecheck, error) {
	var out []ledger.CancelRecheck
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		out = out[:0]
		rows, err := s.db.Pool.Query(ctx, `SELECT p.merchant_id, p.idempotency_key, p.provider_key, p.charge_id, p.status, p.amount, p.currency,
				p.created_at, p.settled_at, r.requested_at, r.attempts
			FROM payment_cancel_rechecks r
			JOIN payments p ON p.merchant_id = r.merchant_id AND p.idempotency_key = r.idempotency_key AND p.charge_id = r.charge_id
			WHERE r.next_at <= coalesce($2::timestamptz, now())
			ORDER BY r.next_at, r.merchant_id, r.idempotency_key LIMIT $1`, int32(limit), s.db.Now())
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				c        ledger.CancelRecheck
				chargeID *string
				settled  *time.Time
				attempts int32
			)
			if err := rows.Scan(append(paymentScan(&c.Payment, &chargeID, &settled), &c.RequestedAt, &attempts)...); err != nil {
				return err
			}
			c.ChargeID, c.SettledAt, c.Attempts = deref(chargeID), derefTime(settled), int(attempts)
			out = append(out, c)
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
const recheckCancelSQL = `SELECT canceled, status FROM recheck_payment_cancel(@merchant, @key, @charge_id, @requested_at, @provider_status, @reason, @now)`

// RecheckCancel records what the provider says now of the intent chargeID
// of a payment stamped for a recheck of its cancel, requestedAt the
// stamp's as CancelsToRecheck listed it: providerStatus canceled moves an
// authorized payment to canceled with one canceled event
// (CancelAuthorizedPayment's rules: not while a capture or cancel of it
// holds) and reports canceled. The stamp is cleared (unless a newer one
// replaced it), except when the provider said canceled and the payment
// stays authorized (canceled false, status authorized: an operation in
// flight), which keeps it for a later pass. status is the payment's after
// the call. ledger.ErrNotFound: no payment (merchantID, key) of that
// intent.
func (s *Store) RecheckCancel(ctx context.Context, merchantID, key, chargeID string, requestedAt time.Time, providerStatus, reason string) (canceled bool, status string, err error) {
	if providerStatus == "" || requestedAt.IsZero() {
		return false, "", errors.New("recheck cancel: needs the provider's status of the intent and the stamp's time")
	}
	var st *string
	err = s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, recheckCancelSQL, pgx.NamedArgs{"merchant": merchantID, "key": key, "charge_id": chargeID,
			"requested_at": requestedAt, "provider_status": providerStatus, "reason": reason, "now": s.db.Now()}).Scan(&canceled, &st)
	})
	if err != nil {
		return false, "", interpretError("recheck cancel", err)
	}
	if st == nil {
		return false, "", fmt.Errorf("recheck cancel: %w", ledger.ErrNotFound)
	}
	return canceled, *st, nil
}

// PostponeCancelRecheck pushes the stamp (merchantID, key), as listed at
// requestedAt, to after from now and counts the attempt: a pass that got
// no answer (a failed retrieve, an operation in flight) lets the stamps
// behind it have their turn. attempts is the stamp's count after the
// call; 0 when no such stamp is left (cleared, or replaced by a newer
// one, which stays due).
func (s *Store) PostponeCancelRecheck(ctx context.Context, merchantID, key string, requestedAt time.Time, after time.Duration) (attempts int, err error) {
	var n *int32
	err = s.db.Retry(ctx, func(ctx context.Context) error {
		n = nil
		return s.db.Pool.QueryRow(ctx, `SELECT attempts FROM postpone_cancel_recheck($1, $2, $3, coalesce($4::timestamptz, now()) + $5::bigint * interval '1 microsecond')`,
			merchantID, key, requestedAt, s.db.Now(), after.Microseconds()).Scan(&n)
	})
	if err != nil {
		return 0, interpretError("postpone cancel recheck", err)
	}
	if n == nil {
		return 0, nil
	}
	return int(*n), nil
}
