package dedup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/ledger"
)

// refundColumns are the columns scanRefund reads, in its order.
const refundColumns = `merchant_id, idempotency_key, payment_key, request_hash, provider_key, charge_id, amount, currency, status,
    attempts, coalesce(locked_by, ''), locked_until, key_window_start, coalesce(refund_id, ''), coalesce(response_status, 0),
    response, coalesce(reason, ''), coalesce(last_error, ''), created_at, updated_at, completed_at`

func scanRefund(row pgx.Row) (ledger.Refund, error) {
	var (
		r                   ledger.Refund
		lockedUntil, doneAt *time.Time
		status              int32
		attempts            int32
	)
	err := row.Scan(&r.MerchantID, &r.IdempotencyKey, &r.PaymentKey, &r.RequestHash, &r.ProviderKey, &r.ChargeID, &r.Amount,
		&r.Currency, &r.Status, &attempts, &r.LockedBy, &lockedUntil, &r.KeyWindowStart, &r.RefundID, &status, &r.Response,
		&r.Reason, &r.LastError, &r.CreatedAt, &r.UpdatedAt, &doneAt)
	if err != nil {
		return ledger.Refund{}, err
	}
	r.Attempts, r.ResponseStatus = int(attempts), int(status)
	if lockedUntil != nil {
		r.LockedUntil = *lockedUntil
	}
	if doneAt != nil {
		r.CompletedAt = *doneAt
	}
	return r, nil
}

// The statements of a refund's claim, run in one transaction (ClaimRefund).
const (
	// lockPayment locks the refunded (captured, canceled) payment for
	// the transaction: every claim of a refund, a capture or a cancel of
	// it waits here for the one before to commit, so the rules below see
	// every operation claimed before it. A
	// transaction advisory lock on the payment (per schema, merchant and
	// key; no merchant id holds a ':'), not the ledger row's FOR UPDATE:
	// the worker's role may not update the ledger (migration 00011), and
	// FOR UPDATE needs that right. Everything that changes what a payment
	// may refund takes this lock first.
	lockPayment = `SELECT pg_advisory_xact_lock(hashtextextended(current_schema() || '/payment/' || @merchant || ':' || @payment_key, 0))`
	// refundPayment reads the refunded payment's ledger row: what it
	// captured is what a capture received (00027), else its amount.
	refundPayment = `SELECT status, coalesce(amount_received, amount), currency, coalesce(charge_id, ''), ` + dbNow + `
    FROM payments WHERE merchant_id = @merchant AND idempotency_key = @payment_key`
	// refundExisting reads the refund's own row, if any.
	refundExisting = `SELECT ` + refundColumns + ` FROM refunds
    WHERE merchant_id = @merchant AND idempotency_key = @key FOR UPDATE`
	// refundKeyOfOp reports whether the refund's key is a capture's or a
	// cancel's of the merchant (another operation: key_reused).
	refundKeyOfOp = `SELECT EXISTS (SELECT 1 FROM payment_ops WHERE merchant_id = @merchant AND idempotency_key = @key)`
	// refundHeld is what the payment's refunds may hold: every refund but
	// a failed or refused one (ledger.RefundHolds).
	refundHeld = `SELECT coalesce(sum(amount), 0) FROM refunds
    WHERE merchant_id = @merchant AND payment_key = @payment_key AND status NOT IN ('failed', 'refused')`
	refundInsert = `INSERT INTO refunds (merchant_id, idempotency_key, payment_key, request_hash, provider_key, charge_id, amount,
        currency, status, attempts, locked_by, locked_until, key_window_start, created_at, updated_at)
    VALUES (@merchant, @key, @payment_key, @hash, @provider_key, @charge_id, @amount, @currency, 'pending', 1, @holder,
        ` + dbNow + ` + @lease::interval, ` + dbNow + `, ` + dbNow + `, ` + dbNow + `)
    RETURNING ` + refundColumns
	// refundReacquire takes over a refund that may have been sent (its
	// lease ran out, or its answer was lost): attempts+1 fences the old
	// holder out, and the new holder must look it up before any re-call.
	refundReacquire = `UPDATE refunds SET status = 'pending', locked_by = @holder, locked_until = ` + dbNow + ` + @lease::interval,
        attempts = attempts + 1, updated_at = ` + dbNow + `
    WHERE merchant_id = @merchant AND idempotency_key = @key
    RETURNING ` + refundColumns
)

// ClaimRefund claims one refund for holder, with a lease of the given
// length, in one transaction that locks the refunded payment
// (lockPayment). The payment must exist and be charged (succeeded), and the sum of
// its refunds that may hold money (ledger.RefundHolds) plus this one's
// amount must not pass the amount captured; else the claim is Refused
// with its reason, writes nothing, and the refund must not be sent. An
// Amount of 0 takes what is left. The refund's own row, when it exists,
// decides first: another request under the key is a Mismatch; a final
// (or processing) one a Duplicate; a live lease InFlight; a row that may
// have been sent (an expired lease, an unknown outcome) is re-acquired as
// NeedsLookup: the holder looks the refund up before any re-call.
func (s *Store) ClaimRefund(ctx context.Context, holder string, lease time.Duration, req ledger.RefundRequest) (ledger.RefundClaim, error) {
	if holder == "" {
		return ledger.RefundClaim{}, errors.New("claim refund: empty holder")
	}
	if lease <= 0 {
		return ledger.RefundClaim{}, fmt.Errorf("claim refund: lease must be positive, got %v", lease)
	}
	if err := req.Validate(); err != nil {
		return ledger.RefundClaim{}, fmt.Errorf("claim refund: %w", err)
	}
	args := pgx.NamedArgs{"merchant": req.MerchantID, "key": req.IdempotencyKey, "payment_key": req.PaymentKey,
		"hash": req.RequestHash, "holder": holder, "lease": lease, "now": s.db.Now(),
		"provider_key": ledger.RefundProviderKey(req.MerchantID, req.IdempotencyKey)}
	var res ledger.RefundClaim
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		res = ledger.RefundClaim{}
		return pgx.BeginFunc(ctx, s.db.Pool, func(tx pgx.Tx) error {
			return claimRefundTx(ctx, tx, req, args, &res)
		})
	})
	if err != nil {
		return ledger.RefundClaim{}, interpretError("claim refund", err)
	}
	return res, nil
}

// claimRefundTx is ClaimRefund's transaction.
func claimRefundTx(ctx context.Context, tx pgx.Tx, req ledger.RefundRequest, args pgx.NamedArgs, res *ledger.RefundClaim) error {
	var (
		payStatus, currency, chargeID string
		captured                      int64
		now                           time.Time
	)
	if _, err := tx.Exec(ctx, lockPayment, args); err != nil {
		return err
	}
	err := tx.QueryRow(ctx, refundPayment, args).Scan(&payStatus, &captured, &currency, &chargeID, &now)
	if errors.Is(err, pgx.ErrNoRows) {
		res.Outcome, res.Reason = ledger.Refused, ledger.RefuseNoPayment
		return nil
	}
	if err != nil {
		return err
	}
	existing, err := scanRefund(tx.QueryRow(ctx, refundExisting, args))
	switch {
	case err == nil:
		return judgeRefund(ctx, tx, existing, req, args, now, res)
	case !errors.Is(err, pgx.ErrNoRows):
		return err
	}
	var other bool
	if err := tx.QueryRow(ctx, refundKeyOfOp, args).Scan(&other); err != nil {
		return err
	}
	if other {
		res.Outcome = ledger.Mismatch
		return nil
	}
	if payStatus != ledger.PaymentSucceeded {
		res.Outcome, res.Reason = ledger.Refused, ledger.RefuseNotCharged
		return nil
	}
	if req.Currency != "" && req.Currency != currency {
		res.Outcome, res.Reason = ledger.Refused, ledger.RefuseCurrency
		return nil
	}
	var held int64
	if err := tx.QueryRow(ctx, refundHeld, args).Scan(&held); err != nil {
		return err
	}
	res.Refundable = captured - held
	amount := req.Amount
	if amount == 0 {
		amount = res.Refundable
	}
	if amount <= 0 || amount > res.Refundable {
		res.Outcome, res.Reason = ledger.Refused, ledger.RefuseOverRefundable
		return nil
	}
	args["charge_id"], args["amount"], args["currency"] = chargeID, amount, currency
	r, err := scanRefund(tx.QueryRow(ctx, refundInsert, args))
	if err != nil {
		return err
	}
	l := r.Lease()
	res.Outcome, res.Refund, res.Lease = ledger.Claimed, r, &l
	return nil
}

// judgeRefund decides a claim that found the refund's own row (locked).
func judgeRefund(ctx context.Context, tx pgx.Tx, r ledger.Refund, req ledger.RefundRequest, args pgx.NamedArgs, now time.Time, res *ledger.RefundClaim) error {
	res.Refund = r
	switch {
	case !bytes.Equal(r.RequestHash, req.RequestHash):
		res.Outcome = ledger.Mismatch
	case r.Final() || r.Status == ledger.RefundProcessing:
		res.Outcome = ledger.Duplicate
	case r.Status == ledger.RefundPending && r.LockedUntil.After(now):
		res.Outcome, res.RetryIn = ledger.InFlight, max(r.LockedUntil.Sub(now), ledger.MinRetry)
	default:
		// Pending past its lease, or unknown: it may have been sent.
		taken, err := scanRefund(tx.QueryRow(ctx, refundReacquire, args))
		if err != nil {
			return err
		}
		l := taken.Lease()
		res.Outcome, res.Refund, res.Lease = ledger.NeedsLookup, taken, &l
	}
	return nil
}

// completeRefundSQL records a provider's settled answer under the lease.
const completeRefundSQL = `UPDATE refunds
    SET status = @status, refund_id = nullif(@refund_id, ''), reason = nullif(@reason, ''), response_status = @response_status,
        response = @response, completed_at = ` + dbNow + `, updated_at = ` + dbNow + `, locked_until = NULL, last_error = NULL
    WHERE merchant_id = @merchant AND idempotency_key = @key AND status = 'pending'
      AND locked_by = @holder AND attempts = @attempt
    RETURNING 1`

// CompleteRefund records the provider's settled answer to a refund under
// l: processing, succeeded, failed or refused. With a lost lease it is
// ledger.ErrLeaseLost and changes nothing; completing again with the same
// lease is a no-op.
func (s *Store) CompleteRefund(ctx context.Context, l ledger.Lease, c ledger.RefundCompletion) error {
	switch c.Status {
	case ledger.RefundProcessing, ledger.RefundSucceeded, ledger.RefundFailed, ledger.RefundRefused:
	default:
		return fmt.Errorf("complete refund: status %q is not a provider's answer", c.Status)
	}
	if c.Status != ledger.RefundRefused && c.RefundID == "" {
		return errors.New("complete refund: a refund made needs its provider id")
	}
	if len(c.Response) == 0 || !json.Valid(c.Response) {
		return errors.New("complete refund: the response is not JSON")
	}
	args := pgx.NamedArgs{"merchant": l.MerchantID, "key": l.IdempotencyKey, "holder": l.Holder, "attempt": int32(l.Attempt),
		"status": c.Status, "refund_id": c.RefundID, "reason": c.Reason, "response_status": int32(c.ResponseStatus),
		"response": []byte(c.Response), "now": s.db.Now()}
	return s.completeOpUnderLease(ctx, "complete refund", completeRefundSQL, args, l, c.Status,
		func() (string, string, int, error) {
			r, err := s.GetRefund(ctx, l.MerchantID, l.IdempotencyKey)
			return r.Status, r.LockedBy, r.Attempts, err
		})
}

// ReleaseRefund gives up the lease of a refund whose call's outcome is
// unknown (a timeout, a reset, no answer): the row becomes unknown, still
// counted against what is left to refund, and is looked up before any
// re-call. With a lost lease it is ledger.ErrLeaseLost.
func (s *Store) ReleaseRefund(ctx context.Context, l ledger.Lease, reason string) error {
	return s.releaseOpLease(ctx, "release refund", refundsTable, l, reason)
}

// GetRefund returns the refund (merchantID, key); ledger.ErrNotFound when
// there is none.
func (s *Store) GetRefund(ctx context.Context, merchantID, key string) (ledger.Refund, error) {
	return getOp(ctx, s, "get refund", refundsTable, refundColumns, scanRefund, merchantID, key)
}

// acquireStuckRefundsSQL leases the refunds that may have been made and
// that no one resolves (acquireStuckOpsSQL).
var acquireStuckRefundsSQL = acquireStuckOpsSQL(refundsTable, "r", refundColumnsOf("r"))

// refundColumnsOf is refundColumns of the table aliased a.
func refundColumnsOf(a string) string {
	return a + `.merchant_id, ` + a + `.idempotency_key, ` + a + `.payment_key, ` + a + `.request_hash, ` + a + `.provider_key, ` +
		a + `.charge_id, ` + a + `.amount, ` + a + `.currency, ` + a + `.status, ` + a + `.attempts, coalesce(` + a + `.locked_by, ''), ` +
		a + `.locked_until, ` + a + `.key_window_start, coalesce(` + a + `.refund_id, ''), coalesce(` + a + `.response_status, 0), ` +
		a + `.response, coalesce(` + a + `.reason, ''), coalesce(` + a + `.last_error, ''), ` + a + `.created_at, ` + a + `.updated_at, ` +
		a + `.completed_at`
}

// AcquireStuckRefunds leases, for holder, up to limit refunds that may
// have been made and that neither a redelivery nor another reconciler
// resolves (see acquireStuckRefundsSQL): each is looked up, never
// re-called, and recorded under its lease (CompleteRefund) or given back
// unknown (ReleaseRefund).
func (s *Store) AcquireStuckRefunds(ctx context.Context, holder string, grace, lease time.Duration, limit int) ([]ledger.Refund, error) {
	return acquireStuckOps(ctx, s, "acquire stuck refunds", acquireStuckRefundsSQL, scanRefund, holder, grace, lease, limit)
}
