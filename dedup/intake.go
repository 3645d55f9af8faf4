package dedup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Intake is the HTTP gateway's guard row for one (merchant, key): it makes
// one request out of many concurrent first requests the publisher of the
// command. The worker's claim in idempotency_keys comes later, after the
// message is consumed, so until then this row is what concurrent requests
// meet. It is not a claim: the worker never reads it, and a command
// published twice is still charged once (the claim decides).
type Intake struct {
	MerchantID     string
	IdempotencyKey string
	RequestHash    []byte
	Amount         int64
	Currency       string
	// Attempt fences publishers: each takeover adds one.
	Attempt int
	// LockedUntil is, while publishing, the end of the publisher's lease;
	// once published, when a retry that still finds no idempotency record
	// may publish again.
	LockedUntil time.Time
	PublishedAt time.Time // zero until the PubAck was received
	CreatedAt   time.Time
	ExpiresAt   time.Time
}

// IntakeOutcome is what AcquireIntake found.
type IntakeOutcome int

// Intake outcomes.
const (
	// IntakeAcquired: the caller is the publisher (the row was new, expired,
	// or its lock had passed).
	IntakeAcquired IntakeOutcome = iota + 1
	// IntakeHeld: another request is publishing, or published recently.
	IntakeHeld
	// IntakeMismatch: the key is held for a different request fingerprint.
	IntakeMismatch
)

func (o IntakeOutcome) String() string {
	switch o {
	case IntakeAcquired:
		return "acquired"
	case IntakeHeld:
		return "held"
	case IntakeMismatch:
		return "mismatch"
	}
	return "unknown"
}

// IntakeResult is the result of AcquireIntake.
type IntakeResult struct {
	Outcome IntakeOutcome
	Intake  Intake
}

const intakeColumns = `merchant_id, idempotency_key, request_hash, amount, currency, attempt, locked_until,
	published_at, created_at, expires_at`

func scanIntake(row pgx.Row) (Intake, error) {
	var (
		in        Intake
		attempt   int32
		published *time.Time
	)
	if err := row.Scan(&in.MerchantID, &in.IdempotencyKey, &in.RequestHash, &in.Amount, &in.Currency, &attempt,
		&in.LockedUntil, &published, &in.CreatedAt, &in.ExpiresAt); err != nil {
		return Intake{}, err
	}
	in.Attempt = int(attempt)
	if published != nil {
		in.PublishedAt = *published
	}
	return in, nil
}

// acquireIntakeSQL inserts the guard row, or takes it over when it expired
// (any fingerprint) or when its lock passed (same fingerprint). Concurrent
// callers serialise on the row: exactly one gets a row back.
const acquireIntakeSQL = `
INSERT INTO gateway_intake AS g (merchant_id, idempotency_key, request_hash, amount, currency, attempt,
    locked_until, created_at, expires_at)
VALUES (@merchant, @key, @hash, @amount, @currency, 1, ` + dbNow + ` + @lease::interval, ` + dbNow + `,
    ` + dbNow + ` + @retention::interval)
ON CONFLICT (merchant_id, idempotency_key) DO UPDATE
SET request_hash = excluded.request_hash, amount = excluded.amount, currency = excluded.currency,
    attempt = g.attempt + 1, locked_until = excluded.locked_until,
    published_at = CASE WHEN g.expires_at <= ` + dbNow + ` THEN NULL ELSE g.published_at END,
    created_at = CASE WHEN g.expires_at <= ` + dbNow + ` THEN excluded.created_at ELSE g.created_at END,
    expires_at = excluded.expires_at
WHERE g.expires_at <= ` + dbNow + ` OR (g.request_hash = excluded.request_hash AND g.locked_until <= ` + dbNow + `)
RETURNING ` + intakeColumns

// AcquireIntake tries to make the caller the publisher of req for lease.
// The row is kept for retention. Only IntakeAcquired lets the caller
// publish; it must then call IntakePublished or AbandonIntake.
func (s *Store) AcquireIntake(ctx context.Context, req ClaimRequest, lease, retention time.Duration) (IntakeResult, error) {
	if err := req.validate(); err != nil {
		return IntakeResult{}, fmt.Errorf("acquire intake: %w", err)
	}
	if lease <= 0 || retention <= lease {
		return IntakeResult{}, fmt.Errorf("acquire intake: need 0 < lease (%v) < retention (%v)", lease, retention)
	}
	// A row purged between the two statements below is simply retried.
	for range 3 {
		args := pgx.NamedArgs{
			"merchant": req.MerchantID, "key": req.IdempotencyKey, "hash": req.RequestHash,
			"amount": req.Amount, "currency": req.Currency,
			"now": s.now(), "lease": lease, "retention": retention,
		}
		var in Intake
		err := s.withRetry(ctx, func(ctx context.Context) error {
			var err error
			in, err = scanIntake(s.pool.QueryRow(ctx, acquireIntakeSQL, args))
			return err
		})
		if err == nil {
			return IntakeResult{Outcome: IntakeAcquired, Intake: in}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return IntakeResult{}, interpretError("acquire intake", err)
		}
		in, err = s.GetIntake(ctx, req.MerchantID, req.IdempotencyKey)
		switch {
		case errors.Is(err, ErrNotFound):
			continue
		case err != nil:
			return IntakeResult{}, fmt.Errorf("acquire intake: %w", err)
		case !bytes.Equal(in.RequestHash, req.RequestHash):
			return IntakeResult{Outcome: IntakeMismatch, Intake: in}, nil
		default:
			return IntakeResult{Outcome: IntakeHeld, Intake: in}, nil
		}
	}
	return IntakeResult{}, fmt.Errorf("acquire intake: %w: the row kept disappearing", ErrUnavailable)
}

// GetIntake returns the guard row for a key, or ErrNotFound.
func (s *Store) GetIntake(ctx context.Context, merchantID, key string) (Intake, error) {
	var in Intake
	err := s.withRetry(ctx, func(ctx context.Context) error {
		var err error
		in, err = scanIntake(s.pool.QueryRow(ctx, `SELECT `+intakeColumns+` FROM gateway_intake
			WHERE merchant_id = $1 AND idempotency_key = $2`, merchantID, key))
		return err
	})
	if err != nil {
		return Intake{}, interpretError("get intake", err)
	}
	return in, nil
}

// IntakePublished records that the command was published (PubAck received)
// and holds the row for holdFor: until then a retry finding no idempotency
// record answers "in flight" instead of publishing again. ErrLeaseLost
// means another request took the row over; its publish stands.
func (s *Store) IntakePublished(ctx context.Context, in Intake, holdFor time.Duration) error {
	var one int
	err := s.withRetry(ctx, func(ctx context.Context) error {
		return s.pool.QueryRow(ctx, `UPDATE gateway_intake SET published_at = coalesce($4::timestamptz, now()),
			    locked_until = coalesce($4::timestamptz, now()) + $5::interval
			WHERE merchant_id = $1 AND idempotency_key = $2 AND attempt = $3 RETURNING 1`,
			in.MerchantID, in.IdempotencyKey, int32(in.Attempt), s.now(), holdFor).Scan(&one)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("mark intake published: %w", ErrLeaseLost)
	}
	return interpretError("mark intake published", err)
}

// AbandonIntake gives the row up after a failed publish, so the client's
// retry may publish at once. ErrLeaseLost means it was taken over already.
func (s *Store) AbandonIntake(ctx context.Context, in Intake) error {
	var one int
	err := s.withRetry(ctx, func(ctx context.Context) error {
		return s.pool.QueryRow(ctx, `UPDATE gateway_intake SET locked_until = least(locked_until, coalesce($4::timestamptz, now()))
			WHERE merchant_id = $1 AND idempotency_key = $2 AND attempt = $3 RETURNING 1`,
			in.MerchantID, in.IdempotencyKey, int32(in.Attempt), s.now()).Scan(&one)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("abandon intake: %w", ErrLeaseLost)
	}
	return interpretError("abandon intake", err)
}

// PurgeIntakes deletes up to limit expired guard rows and returns how many.
func (s *Store) PurgeIntakes(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("purge intakes: limit must be positive, got %d", limit)
	}
	var n int64
	err := s.withRetry(ctx, func(ctx context.Context) error {
		tag, err := s.pool.Exec(ctx, `DELETE FROM gateway_intake AS g USING (
				SELECT merchant_id, idempotency_key FROM gateway_intake WHERE expires_at <= coalesce($1::timestamptz, now())
				ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED) AS s
			WHERE g.merchant_id = s.merchant_id AND g.idempotency_key = s.idempotency_key
			  AND g.expires_at <= coalesce($1::timestamptz, now())`,
			s.now(), int32(limit))
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, interpretError("purge intakes", err)
	}
	return int(n), nil
}
