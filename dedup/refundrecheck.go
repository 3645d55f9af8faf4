package dedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/ledger"
)

// requestRefundRecheckSQL stamps a succeeded refund for the reconciler to
// look up again (request_refund_recheck, migration 00032).
const requestRefundRecheckSQL = `SELECT requested, status FROM request_refund_recheck(@merchant, @key, @refund_id, @now)`

// RequestRefundRecheck asks the reconciler to look the refund (merchantID,
// key), the provider's refundID, up again: an event said the provider
// failed a refund the ledger holds succeeded, which only a lookup may
// confirm. Only a succeeded refund is stamped (requested true, also when
// it was already); status is the refund's as it stands.
// ledger.ErrNotFound: no refund (merchantID, key) with that provider id.
func (s *Store) RequestRefundRecheck(ctx context.Context, merchantID, key, refundID string) (requested bool, status string, err error) {
	var st *string
	err = s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, requestRefundRecheckSQL, pgx.NamedArgs{"merchant": merchantID, "key": key,
			"refund_id": refundID, "now": s.db.Now()}).Scan(&requested, &st)
	})
	if err != nil {
		return false, "", interpretError("request refund recheck", err)
	}
	if st == nil {
		return false, "", fmt.Errorf("request refund recheck: %w", ledger.ErrNotFound)
	}
	return requested, *st, nil
}

// RefundsToRecheck returns up to limit refunds stamped for a recheck
// (RequestRefundRecheck), oldest stamp first.
func (s *Store) RefundsToRecheck(ctx context.Context, limit int) ([]ledger.Refund, error) {
	var out []ledger.Refund
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		out = out[:0]
		rows, err := s.db.Pool.Query(ctx, `SELECT `+refundColumns+` FROM refunds
			WHERE recheck_requested_at IS NOT NULL ORDER BY recheck_requested_at, id LIMIT $1`, int32(limit))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			r, err := scanRefund(rows)
			if err != nil {
				return err
			}
			out = append(out, r)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, interpretError("list refunds to recheck", err)
	}
	return out, nil
}

// recheckRefundSQL records what a lookup found of a stamped refund
// (recheck_refund, migration 00032).
const recheckRefundSQL = `SELECT reversed, status FROM recheck_refund(@merchant, @key, @refund_id, @status, @reason,
    @response_status, @response, @now)`

// RecheckRefund records what the provider says now of a succeeded refund
// stamped for a recheck: c.Status RefundFailed moves it to failed (its
// amount free again) with one refund_failed event, and reports reversed;
// RefundSucceeded only clears the stamp. A refund not succeeded is never
// moved, so a failed one never goes back. status is the refund's after
// the call. ledger.ErrNotFound: no refund (merchantID, key) with
// c.RefundID.
func (s *Store) RecheckRefund(ctx context.Context, merchantID, key string, c ledger.RefundCompletion) (reversed bool, status string, err error) {
	if c.Status != ledger.RefundSucceeded && c.Status != ledger.RefundFailed {
		return false, "", fmt.Errorf("recheck refund: status %q is neither %s nor %s", c.Status, ledger.RefundSucceeded, ledger.RefundFailed)
	}
	if c.RefundID == "" || len(c.Response) == 0 || !json.Valid(c.Response) || c.ResponseStatus < 100 || c.ResponseStatus > 599 {
		return false, "", errors.New("recheck refund: needs the refund id, a JSON response and its HTTP status")
	}
	args := pgx.NamedArgs{"merchant": merchantID, "key": key, "refund_id": c.RefundID, "status": c.Status, "reason": c.Reason,
		"response_status": int32(c.ResponseStatus), "response": []byte(c.Response), "now": s.db.Now()}
	var st *string
	err = s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, recheckRefundSQL, args).Scan(&reversed, &st)
	})
	if err != nil {
		return false, "", interpretError("recheck refund", err)
	}
	if st == nil {
		return false, "", fmt.Errorf("recheck refund: %w", ledger.ErrNotFound)
	}
	return reversed, *st, nil
}

// cancelAuthorizedSQL moves an authorized payment the provider canceled
// to canceled (cancel_authorized_payment, migration 00032).
const cancelAuthorizedSQL = `SELECT canceled, status FROM cancel_authorized_payment(@merchant, @key, @charge_id, @reason, @now)`

// CancelAuthorizedPayment records that the provider canceled the
// authorized payment (merchantID, key) of intent chargeID (its capture
// window ran out, or it was voided at the provider): the payment moves to
// canceled with one canceled event, written in the same transaction.
// canceled is false, and nothing changed, when the payment is not
// authorized (told again, or canceled or captured first); status is the
// payment's as it stands. ledger.ErrNotFound: no payment (merchantID,
// key) of that intent.
func (s *Store) CancelAuthorizedPayment(ctx context.Context, merchantID, key, chargeID, reason string) (canceled bool, status string, err error) {
	var st *string
	err = s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, cancelAuthorizedSQL, pgx.NamedArgs{"merchant": merchantID, "key": key,
			"charge_id": chargeID, "reason": reason, "now": s.db.Now()}).Scan(&canceled, &st)
	})
	if err != nil {
		return false, "", interpretError("cancel authorized payment", err)
	}
	if st == nil {
		return false, "", fmt.Errorf("cancel authorized payment: %w", ledger.ErrNotFound)
	}
	return canceled, *st, nil
}
