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
	"github.com/paydedup/paydedup/payment"
)

// paymentOpColumnsOf are the columns scanPaymentOp reads, in its order, of
// the table aliased a.
func paymentOpColumnsOf(a string) string {
	return a + `.kind, ` + a + `.merchant_id, ` + a + `.idempotency_key, ` + a + `.payment_key, ` + a + `.request_hash, ` +
		a + `.provider_key, ` + a + `.charge_id, ` + a + `.amount, coalesce(` + a + `.amount_received, 0), ` + a + `.currency, ` +
		a + `.status, ` + a + `.attempts, coalesce(` + a + `.locked_by, ''), ` + a + `.locked_until, ` + a + `.key_window_start, ` +
		`coalesce(` + a + `.response_status, 0), ` + a + `.response, coalesce(` + a + `.reason, ''), coalesce(` + a + `.last_error, ''), ` +
		a + `.created_at, ` + a + `.updated_at, ` + a + `.completed_at`
}

var paymentOpColumns = paymentOpColumnsOf("payment_ops")

func scanPaymentOp(row pgx.Row) (ledger.PaymentOp, error) {
	var (
		o                   ledger.PaymentOp
		lockedUntil, doneAt *time.Time
		status, attempts    int32
	)
	err := row.Scan(&o.Kind, &o.MerchantID, &o.IdempotencyKey, &o.PaymentKey, &o.RequestHash, &o.ProviderKey, &o.ChargeID, &o.Amount,
		&o.AmountReceived, &o.Currency, &o.Status, &attempts, &o.LockedBy, &lockedUntil, &o.KeyWindowStart, &status, &o.Response,
		&o.Reason, &o.LastError, &o.CreatedAt, &o.UpdatedAt, &doneAt)
	if err != nil {
		return ledger.PaymentOp{}, err
	}
	o.Attempts, o.ResponseStatus = int(attempts), int(status)
	if lockedUntil != nil {
		o.LockedUntil = *lockedUntil
	}
	if doneAt != nil {
		o.CompletedAt = *doneAt
	}
	return o, nil
}

// The statements of a capture's or a cancel's claim, run in one
// transaction under the payment's lock (lockPayment, a refund's).
var (
	opPayment = `SELECT status, amount, currency, coalesce(charge_id, ''), ` + dbNow + `
    FROM payments WHERE merchant_id = @merchant AND idempotency_key = @payment_key`
	opExisting = `SELECT ` + paymentOpColumns + ` FROM payment_ops
    WHERE merchant_id = @merchant AND idempotency_key = @key FOR UPDATE`
	// opKeyOfRefund reports whether the key is a refund's of the merchant
	// (another operation: key_reused).
	opKeyOfRefund = `SELECT EXISTS (SELECT 1 FROM refunds WHERE merchant_id = @merchant AND idempotency_key = @key)`
	// opHeld is the kind of the payment's capture or cancel that holds
	// (every one but a refused one), if any: at most one (payment_ops_once).
	opHeld = `SELECT kind FROM payment_ops
    WHERE merchant_id = @merchant AND payment_key = @payment_key AND status <> 'refused' LIMIT 1`
	opInsert = `INSERT INTO payment_ops (kind, merchant_id, idempotency_key, payment_key, request_hash, provider_key, charge_id, amount,
        currency, status, attempts, locked_by, locked_until, key_window_start, created_at, updated_at)
    VALUES (@kind, @merchant, @key, @payment_key, @hash, @provider_key, @charge_id, @amount, @currency, 'pending', 1, @holder,
        ` + dbNow + ` + @lease::interval, ` + dbNow + `, ` + dbNow + `, ` + dbNow + `)
    RETURNING ` + paymentOpColumns
	// opReacquire takes over an operation that may have been sent (its
	// lease ran out, or its answer was lost): attempts+1 fences the old
	// holder out, and the new holder looks the intent up before any
	// re-call.
	opReacquire = `UPDATE payment_ops SET status = 'pending', locked_by = @holder, locked_until = ` + dbNow + ` + @lease::interval,
        attempts = attempts + 1, updated_at = ` + dbNow + `
    WHERE merchant_id = @merchant AND idempotency_key = @key
    RETURNING ` + paymentOpColumns
)

// ClaimPaymentOp claims one capture or cancel for holder, with a lease of
// the given length, in one transaction that locks the payment (lockPayment,
// as a refund's claim). The operation's own row, when it exists, decides
// first, as a refund's does (ClaimRefund): a Mismatch, a Duplicate, an
// InFlight lease, or a row that may have been sent re-acquired as
// NeedsLookup. A new one is Refused with its reason, writes nothing and
// must not be sent, unless: the payment exists (RefuseNoPayment), its key
// is no refund's of the merchant (else Mismatch), no capture or cancel of
// it holds (RefuseAlreadyCaptured, RefuseCaptured, RefuseCanceled), it is
// authorized (RefuseNotAuthorized), in the currency named (RefuseCurrency)
// and, for a capture, the amount is at most what was authorized
// (RefuseOverCapturable; 0 captures all of it).
func (s *Store) ClaimPaymentOp(ctx context.Context, holder string, lease time.Duration, req ledger.PaymentOpRequest) (ledger.PaymentOpClaim, error) {
	if holder == "" {
		return ledger.PaymentOpClaim{}, errors.New("claim payment op: empty holder")
	}
	if lease <= 0 {
		return ledger.PaymentOpClaim{}, fmt.Errorf("claim payment op: lease must be positive, got %v", lease)
	}
	if err := req.Validate(); err != nil {
		return ledger.PaymentOpClaim{}, fmt.Errorf("claim payment op: %w", err)
	}
	args := pgx.NamedArgs{"kind": req.Kind, "merchant": req.MerchantID, "key": req.IdempotencyKey, "payment_key": req.PaymentKey,
		"hash": req.RequestHash, "holder": holder, "lease": lease, "now": s.db.Now(),
		"provider_key": ledger.PaymentOpProviderKey(req.Kind, req.MerchantID, req.IdempotencyKey)}
	var res ledger.PaymentOpClaim
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		res = ledger.PaymentOpClaim{}
		return pgx.BeginFunc(ctx, s.db.Pool, func(tx pgx.Tx) error {
			return claimPaymentOpTx(ctx, tx, req, args, &res)
		})
	})
	if err != nil {
		return ledger.PaymentOpClaim{}, interpretError("claim payment op", err)
	}
	return res, nil
}

// claimPaymentOpTx is ClaimPaymentOp's transaction.
func claimPaymentOpTx(ctx context.Context, tx pgx.Tx, req ledger.PaymentOpRequest, args pgx.NamedArgs, res *ledger.PaymentOpClaim) error {
	var (
		payStatus, currency, chargeID string
		authorized                    int64
		now                           time.Time
	)
	if _, err := tx.Exec(ctx, lockPayment, args); err != nil {
		return err
	}
	err := tx.QueryRow(ctx, opPayment, args).Scan(&payStatus, &authorized, &currency, &chargeID, &now)
	if errors.Is(err, pgx.ErrNoRows) {
		res.Outcome, res.Reason = ledger.Refused, ledger.RefuseNoPayment
		return nil
	}
	if err != nil {
		return err
	}
	existing, err := scanPaymentOp(tx.QueryRow(ctx, opExisting, args))
	switch {
	case err == nil:
		return judgePaymentOp(ctx, tx, existing, req, args, now, res)
	case !errors.Is(err, pgx.ErrNoRows):
		return err
	}
	var other bool
	if err := tx.QueryRow(ctx, opKeyOfRefund, args).Scan(&other); err != nil {
		return err
	}
	if other {
		res.Outcome = ledger.Mismatch
		return nil
	}
	var held string
	switch err := tx.QueryRow(ctx, opHeld, args).Scan(&held); {
	case err == nil:
		res.Outcome, res.Reason = ledger.Refused, heldRefusal(req.Kind, held)
		return nil
	case !errors.Is(err, pgx.ErrNoRows):
		return err
	}
	if payStatus != ledger.PaymentAuthorized {
		res.Outcome, res.Reason = ledger.Refused, ledger.RefuseNotAuthorized
		return nil
	}
	if req.Currency != "" && req.Currency != currency {
		res.Outcome, res.Reason = ledger.Refused, ledger.RefuseCurrency
		return nil
	}
	res.Capturable = authorized
	amount := req.Amount
	if amount == 0 {
		amount = authorized // a capture of all of it; a cancel releases all of it
	}
	if amount > authorized {
		res.Outcome, res.Reason = ledger.Refused, ledger.RefuseOverCapturable
		return nil
	}
	args["charge_id"], args["amount"], args["currency"] = chargeID, amount, currency
	o, err := scanPaymentOp(tx.QueryRow(ctx, opInsert, args))
	if err != nil {
		return err
	}
	l := o.Lease()
	res.Outcome, res.Op, res.Lease = ledger.Claimed, o, &l
	return nil
}

// heldRefusal is the refusal of an operation of kind on a payment an
// operation of kind held holds: a cancel holding refuses all
// (RefuseCanceled); a capture holding refuses a capture
// (RefuseAlreadyCaptured) and a cancel (RefuseCaptured).
func heldRefusal(kind, held string) string {
	switch {
	case held == payment.KindCancel:
		return ledger.RefuseCanceled
	case kind == payment.KindCapture:
		return ledger.RefuseAlreadyCaptured
	}
	return ledger.RefuseCaptured
}

// judgePaymentOp decides a claim that found the operation's own row
// (locked), as judgeRefund does.
func judgePaymentOp(ctx context.Context, tx pgx.Tx, o ledger.PaymentOp, req ledger.PaymentOpRequest, args pgx.NamedArgs, now time.Time, res *ledger.PaymentOpClaim) error {
	res.Op = o
	switch {
	case !bytes.Equal(o.RequestHash, req.RequestHash):
		res.Outcome = ledger.Mismatch
	case o.Final():
		res.Outcome = ledger.Duplicate
	case o.Status == ledger.OpPending && o.LockedUntil.After(now):
		res.Outcome, res.RetryIn = ledger.InFlight, max(o.LockedUntil.Sub(now), ledger.MinRetry)
	default:
		// Pending past its lease, or unknown: it may have been sent.
		taken, err := scanPaymentOp(tx.QueryRow(ctx, opReacquire, args))
		if err != nil {
			return err
		}
		l := taken.Lease()
		res.Outcome, res.Op, res.Lease = ledger.NeedsLookup, taken, &l
	}
	return nil
}

// completePaymentOpSQL records a settled answer under the lease; the
// table's trigger (payment_ops_settled) moves the payment's ledger row and
// writes the outcome event in the same statement.
const completePaymentOpSQL = `UPDATE payment_ops
    SET status = @status, amount_received = nullif(@received::bigint, 0), reason = nullif(@reason, ''),
        response_status = @response_status, response = @response, completed_at = ` + dbNow + `, updated_at = ` + dbNow + `,
        locked_until = NULL, last_error = NULL
    WHERE merchant_id = @merchant AND idempotency_key = @key AND status = 'pending'
      AND locked_by = @holder AND attempts = @attempt
    RETURNING 1`

// CompletePaymentOp records a settled answer to a capture or a cancel
// under l: succeeded (a capture with what it received) or refused. The
// payment's ledger row moves with a succeeded one (captured: succeeded;
// canceled: canceled), and the outcome event is written, in the same
// transaction. With a lost lease it is ledger.ErrLeaseLost and changes
// nothing; completing again with the same lease is a no-op.
func (s *Store) CompletePaymentOp(ctx context.Context, l ledger.Lease, c ledger.PaymentOpCompletion) error {
	if c.Status != ledger.OpSucceeded && c.Status != ledger.OpRefused {
		return fmt.Errorf("complete payment op: status %q is not a settled answer", c.Status)
	}
	if c.AmountReceived < 0 || c.Status == ledger.OpRefused && c.AmountReceived != 0 {
		return fmt.Errorf("complete payment op: amount received %d with status %s", c.AmountReceived, c.Status)
	}
	if len(c.Response) == 0 || !json.Valid(c.Response) {
		return errors.New("complete payment op: the response is not JSON")
	}
	args := pgx.NamedArgs{"merchant": l.MerchantID, "key": l.IdempotencyKey, "holder": l.Holder, "attempt": int32(l.Attempt),
		"status": c.Status, "received": c.AmountReceived, "reason": c.Reason, "response_status": int32(c.ResponseStatus),
		"response": []byte(c.Response), "now": s.db.Now()}
	return s.completeOpUnderLease(ctx, "complete payment op", completePaymentOpSQL, args, l, c.Status,
		func() (string, string, int, error) {
			o, err := s.GetPaymentOp(ctx, l.MerchantID, l.IdempotencyKey)
			return o.Status, o.LockedBy, o.Attempts, err
		})
}

// ReleasePaymentOp gives up the lease of an operation whose call's outcome
// is unknown: the row becomes unknown, still holding the payment (no other
// capture or cancel of it may be claimed), and is looked up before any
// re-call. With a lost lease it is ledger.ErrLeaseLost.
func (s *Store) ReleasePaymentOp(ctx context.Context, l ledger.Lease, reason string) error {
	return s.releaseOpLease(ctx, "release payment op", paymentOpsTable, l, reason)
}

// GetPaymentOp returns the capture or cancel (merchantID, key);
// ledger.ErrNotFound when there is none.
func (s *Store) GetPaymentOp(ctx context.Context, merchantID, key string) (ledger.PaymentOp, error) {
	return getOp(ctx, s, "get payment op", paymentOpsTable, paymentOpColumns, scanPaymentOp, merchantID, key)
}

// acquireStuckPaymentOpsSQL leases the captures and cancels that may
// have been made and that no one resolves (acquireStuckOpsSQL).
var acquireStuckPaymentOpsSQL = acquireStuckOpsSQL(paymentOpsTable, "o", paymentOpColumnsOf("o"))

// AcquireStuckPaymentOps leases, for holder, up to limit captures and
// cancels that may have been made and that neither a redelivery nor
// another reconciler resolves: each is looked up (RetrieveIntent), never
// re-called, and recorded under its lease (CompletePaymentOp) or given
// back unknown (ReleasePaymentOp).
func (s *Store) AcquireStuckPaymentOps(ctx context.Context, holder string, grace, lease time.Duration, limit int) ([]ledger.PaymentOp, error) {
	return acquireStuckOps(ctx, s, "acquire stuck payment ops", acquireStuckPaymentOpsSQL, scanPaymentOp, holder, grace, lease, limit)
}
