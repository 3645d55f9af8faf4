// Package pgstore is httpidem's Store on Postgres: table http_idempotency
// (migration 00003), one row per (scope, key) holding the claim's lease and
// the stored response. pgx is used only here (and in internal/pg); its
// errors never leave the package.
package pgstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/httpidem"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/internal/redact"
)

// Defaults for Config.
const (
	// DefaultStatementTimeout bounds every statement the store runs.
	DefaultStatementTimeout = 10 * time.Second
	// minRetry is the shortest RetryIn a claim reports, so a lease that is
	// about to expire is not polled in a tight loop.
	minRetry = 250 * time.Millisecond
)

// Config configures a Store. Zero values take the defaults.
type Config struct {
	StatementTimeout time.Duration
	// Clock is a test clock; leave it nil in production (see pg.Clock).
	Clock clock.Clock
}

// Store is the Postgres store of httpidem's claims and responses. It is
// safe for concurrent use.
type Store struct{ db pg.DB }

// New returns a store on pool. The schema must be migrated
// (migrations/migrate).
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	db, err := pg.NewDB("httpidem", pool, cfg.Clock, cfg.StatementTimeout, DefaultStatementTimeout)
	if err != nil {
		return nil, err
	}
	return &Store{db: db}, nil
}

const dbNow = pg.DBNow

func interpretError(op string, err error) error { return pg.Interpret(op, err, pg.Errors{}) }

// clipError bounds what is stored in last_error, card numbers masked
// before the cut (a provider's error may echo what a merchant wrote).
func clipError(s string) string {
	s, _ = redact.Cut(s, 1000)
	return s
}

// claimResponseSQL inserts a pending claim, or takes the row over when it
// expired, was released (`failed`: the request did not take effect, so a
// corrected request may reuse the key), or its lease passed with the same
// fingerprint (the holder died). Exactly one concurrent caller gets a row.
const claimResponseSQL = `
INSERT INTO http_idempotency AS h (scope, idempotency_key, request_hash, status, attempt, locked_until,
    created_at, updated_at, expires_at)
VALUES (@scope, @key, @hash, 'pending', 1, ` + dbNow + ` + @lease::interval, ` + dbNow + `, ` + dbNow + `,
    ` + dbNow + ` + @retention::interval)
ON CONFLICT (scope, idempotency_key) DO UPDATE
SET request_hash = excluded.request_hash, status = 'pending', attempt = h.attempt + 1,
    locked_until = excluded.locked_until, response_status = NULL, response_header = NULL, response_body = NULL,
    completed_at = NULL, updated_at = ` + dbNow + `, expires_at = excluded.expires_at,
    created_at = CASE WHEN h.expires_at <= ` + dbNow + ` THEN ` + dbNow + ` ELSE h.created_at END
WHERE h.expires_at <= ` + dbNow + ` OR h.status = 'failed'
   OR (h.status = 'pending' AND h.locked_until <= ` + dbNow + ` AND h.request_hash = excluded.request_hash)
RETURNING attempt, locked_until`

// ClaimResponse claims (scope, key) for a request with fingerprint hash, in
// its own committed statement, before the handler runs. Completed rows are
// kept for retention.
func (s *Store) ClaimResponse(ctx context.Context, scope, key string, hash []byte, lease, retention time.Duration) (httpidem.ResponseClaimResult, error) {
	switch {
	case key == "" || len(key) > 255:
		return httpidem.ResponseClaimResult{}, errors.New("claim response: key must be 1..255 bytes")
	case len(hash) != 32:
		return httpidem.ResponseClaimResult{}, errors.New("claim response: hash must be a SHA-256 digest")
	case lease <= 0 || retention <= lease:
		return httpidem.ResponseClaimResult{}, fmt.Errorf("claim response: need 0 < lease (%v) < retention (%v)", lease, retention)
	}
	for range 3 {
		args := pgx.NamedArgs{"scope": scope, "key": key, "hash": hash, "now": s.db.Now(),
			"lease": lease, "retention": retention}
		var (
			attempt int32
			until   time.Time
		)
		err := s.db.Retry(ctx, func(ctx context.Context) error {
			return s.db.Pool.QueryRow(ctx, claimResponseSQL, args).Scan(&attempt, &until)
		})
		if err == nil {
			return httpidem.ResponseClaimResult{Outcome: httpidem.ResponseClaimed,
				Claim: &httpidem.ResponseClaim{Scope: scope, IdempotencyKey: key, Attempt: int(attempt), Until: until}}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return httpidem.ResponseClaimResult{}, interpretError("claim response", err)
		}
		var (
			status                     string
			lastHash, respHeader, body []byte
			lockedUntil                *time.Time
			respStatus                 *int32
			now                        time.Time
		)
		err = s.db.Retry(ctx, func(ctx context.Context) error {
			return s.db.Pool.QueryRow(ctx, `SELECT status, request_hash, locked_until, response_status, response_header, response_body,
				    coalesce($3::timestamptz, now())
				FROM http_idempotency WHERE scope = $1 AND idempotency_key = $2`, scope, key, s.db.Now()).
				Scan(&status, &lastHash, &lockedUntil, &respStatus, &respHeader, &body, &now)
		})
		if errors.Is(err, pgx.ErrNoRows) {
			continue // purged in between: claim again
		}
		if err != nil {
			return httpidem.ResponseClaimResult{}, interpretError("claim response", err)
		}
		switch {
		case !bytes.Equal(lastHash, hash):
			return httpidem.ResponseClaimResult{Outcome: httpidem.ResponseMismatch}, nil
		case status == "completed" && respStatus != nil:
			resp := &httpidem.StoredResponse{Status: int(*respStatus), Body: body}
			if err := json.Unmarshal(respHeader, &resp.Header); err != nil {
				return httpidem.ResponseClaimResult{}, fmt.Errorf("claim response: stored header: %w", err)
			}
			if resp.Body == nil {
				resp.Body = []byte{}
			}
			return httpidem.ResponseClaimResult{Outcome: httpidem.ResponseReplay, Response: resp}, nil
		default:
			retry := minRetry
			if lockedUntil != nil {
				retry = max(lockedUntil.Sub(now), minRetry)
			}
			return httpidem.ResponseClaimResult{Outcome: httpidem.ResponseInFlight, RetryIn: retry}, nil
		}
	}
	return httpidem.ResponseClaimResult{}, fmt.Errorf("claim response: %w: the row kept disappearing", pg.ErrUnavailable)
}

// CompleteResponse stores the response of a held claim. httpidem.ErrLeaseLost means
// the claim was taken over (its lease passed); nothing was stored.
func (s *Store) CompleteResponse(ctx context.Context, c httpidem.ResponseClaim, resp httpidem.StoredResponse) error {
	if resp.Status < 100 || resp.Status > 599 {
		return fmt.Errorf("complete response: %d is not an HTTP status", resp.Status)
	}
	header := resp.Header
	if header == nil {
		header = map[string][]string{}
	}
	hdr, err := json.Marshal(header)
	if err != nil {
		return fmt.Errorf("complete response: %w", err)
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	var one int
	err = s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, `UPDATE http_idempotency
			SET status = 'completed', locked_until = NULL, response_status = $4, response_header = $5,
			    response_body = $6, completed_at = coalesce($7::timestamptz, now()),
			    updated_at = coalesce($7::timestamptz, now()), last_error = NULL
			WHERE scope = $1 AND idempotency_key = $2 AND attempt = $3 AND status = 'pending' RETURNING 1`,
			c.Scope, c.IdempotencyKey, int32(c.Attempt), int32(resp.Status), hdr, body, s.db.Now()).Scan(&one)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("complete response: %w", httpidem.ErrLeaseLost)
	}
	return interpretError("complete response", err)
}

// ReleaseResponse gives a held claim up without a stored response: the row
// becomes `failed` and the next request with the key runs the handler.
// httpidem.ErrLeaseLost means it was taken over already.
func (s *Store) ReleaseResponse(ctx context.Context, c httpidem.ResponseClaim, reason string) error {
	var one int
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, `UPDATE http_idempotency
			SET status = 'failed', locked_until = NULL, last_error = $4, updated_at = coalesce($5::timestamptz, now())
			WHERE scope = $1 AND idempotency_key = $2 AND attempt = $3 AND status = 'pending' RETURNING 1`,
			c.Scope, c.IdempotencyKey, int32(c.Attempt), clipError(reason), s.db.Now()).Scan(&one)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("release response: %w", httpidem.ErrLeaseLost)
	}
	return interpretError("release response", err)
}

// PurgeResponses deletes up to limit finished middleware rows past their
// retention and returns how many. Pending rows are left alone.
func (s *Store) PurgeResponses(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("purge responses: limit must be positive, got %d", limit)
	}
	var n int64
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		tag, err := s.db.Pool.Exec(ctx, `DELETE FROM http_idempotency AS h USING (
				SELECT scope, idempotency_key FROM http_idempotency
				WHERE status <> 'pending' AND expires_at <= coalesce($1::timestamptz, now())
				ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED) AS s
			WHERE h.scope = s.scope AND h.idempotency_key = s.idempotency_key AND h.status <> 'pending'`,
			s.db.Now(), int32(limit))
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, interpretError("purge responses", err)
	}
	return int(n), nil
}
