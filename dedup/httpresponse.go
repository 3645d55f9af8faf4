package dedup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// StoredResponse is an HTTP response kept for replay, byte for byte.
type StoredResponse struct {
	Status int
	Header map[string][]string
	Body   []byte
}

// ResponseClaim is the right to run a handler for one (scope, key): the
// net/http middleware's lease. Attempt fences a holder that was taken over.
type ResponseClaim struct {
	Scope          string
	IdempotencyKey string
	Attempt        int
	Until          time.Time
}

// ResponseOutcome is what ClaimResponse found.
type ResponseOutcome int

// ClaimResponse outcomes.
const (
	// ResponseClaimed: the caller holds the claim and runs the handler.
	ResponseClaimed ResponseOutcome = iota + 1
	// ResponseReplay: a response is stored; replay it.
	ResponseReplay
	// ResponseInFlight: another request holds a live claim.
	ResponseInFlight
	// ResponseMismatch: the key was used with another request fingerprint.
	ResponseMismatch
)

func (o ResponseOutcome) String() string {
	switch o {
	case ResponseClaimed:
		return "claimed"
	case ResponseReplay:
		return "replay"
	case ResponseInFlight:
		return "in_flight"
	case ResponseMismatch:
		return "mismatch"
	}
	return "unknown"
}

// ResponseClaimResult is the result of ClaimResponse.
type ResponseClaimResult struct {
	Outcome  ResponseOutcome
	Claim    *ResponseClaim  // ResponseClaimed
	Response *StoredResponse // ResponseReplay
	RetryIn  time.Duration   // ResponseInFlight
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
func (s *Store) ClaimResponse(ctx context.Context, scope, key string, hash []byte, lease, retention time.Duration) (ResponseClaimResult, error) {
	switch {
	case key == "" || len(key) > 255:
		return ResponseClaimResult{}, errors.New("claim response: key must be 1..255 bytes")
	case len(hash) != 32:
		return ResponseClaimResult{}, errors.New("claim response: hash must be a SHA-256 digest")
	case lease <= 0 || retention <= lease:
		return ResponseClaimResult{}, fmt.Errorf("claim response: need 0 < lease (%v) < retention (%v)", lease, retention)
	}
	for range 3 {
		args := pgx.NamedArgs{"scope": scope, "key": key, "hash": hash, "now": s.now(),
			"lease": lease, "retention": retention}
		var (
			attempt int32
			until   time.Time
		)
		err := s.withRetry(ctx, func(ctx context.Context) error {
			return s.pool.QueryRow(ctx, claimResponseSQL, args).Scan(&attempt, &until)
		})
		if err == nil {
			return ResponseClaimResult{Outcome: ResponseClaimed,
				Claim: &ResponseClaim{Scope: scope, IdempotencyKey: key, Attempt: int(attempt), Until: until}}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return ResponseClaimResult{}, interpretError("claim response", err)
		}
		var (
			status                     string
			lastHash, respHeader, body []byte
			lockedUntil                *time.Time
			respStatus                 *int32
			now                        time.Time
		)
		err = s.withRetry(ctx, func(ctx context.Context) error {
			return s.pool.QueryRow(ctx, `SELECT status, request_hash, locked_until, response_status, response_header, response_body,
				    coalesce($3::timestamptz, now())
				FROM http_idempotency WHERE scope = $1 AND idempotency_key = $2`, scope, key, s.now()).
				Scan(&status, &lastHash, &lockedUntil, &respStatus, &respHeader, &body, &now)
		})
		if errors.Is(err, pgx.ErrNoRows) {
			continue // purged in between: claim again
		}
		if err != nil {
			return ResponseClaimResult{}, interpretError("claim response", err)
		}
		switch {
		case !bytes.Equal(lastHash, hash):
			return ResponseClaimResult{Outcome: ResponseMismatch}, nil
		case status == "completed" && respStatus != nil:
			resp := &StoredResponse{Status: int(*respStatus), Body: body}
			if err := json.Unmarshal(respHeader, &resp.Header); err != nil {
				return ResponseClaimResult{}, fmt.Errorf("claim response: stored header: %w", err)
			}
			if resp.Body == nil {
				resp.Body = []byte{}
			}
			return ResponseClaimResult{Outcome: ResponseReplay, Response: resp}, nil
		default:
			retry := MinRetry
			if lockedUntil != nil {
				retry = max(lockedUntil.Sub(now), MinRetry)
			}
			return ResponseClaimResult{Outcome: ResponseInFlight, RetryIn: retry}, nil
		}
	}
	return ResponseClaimResult{}, fmt.Errorf("claim response: %w: the row kept disappearing", ErrUnavailable)
}

// CompleteResponse stores the response of a held claim. ErrLeaseLost means
// the claim was taken over (its lease passed); nothing was stored.
func (s *Store) CompleteResponse(ctx context.Context, c ResponseClaim, resp StoredResponse) error {
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
	err = s.withRetry(ctx, func(ctx context.Context) error {
		return s.pool.QueryRow(ctx, `UPDATE http_idempotency
			SET status = 'completed', locked_until = NULL, response_status = $4, response_header = $5,
			    response_body = $6, completed_at = coalesce($7::timestamptz, now()),
			    updated_at = coalesce($7::timestamptz, now()), last_error = NULL
			WHERE scope = $1 AND idempotency_key = $2 AND attempt = $3 AND status = 'pending' RETURNING 1`,
			c.Scope, c.IdempotencyKey, int32(c.Attempt), int32(resp.Status), hdr, body, s.now()).Scan(&one)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("complete response: %w", ErrLeaseLost)
	}
	return interpretError("complete response", err)
}

// ReleaseResponse gives a held claim up without a stored response: the row
// becomes `failed` and the next request with the key runs the handler.
// ErrLeaseLost means it was taken over already.
func (s *Store) ReleaseResponse(ctx context.Context, c ResponseClaim, reason string) error {
	var one int
	err := s.withRetry(ctx, func(ctx context.Context) error {
		return s.pool.QueryRow(ctx, `UPDATE http_idempotency
			SET status = 'failed', locked_until = NULL, last_error = $4, updated_at = coalesce($5::timestamptz, now())
			WHERE scope = $1 AND idempotency_key = $2 AND attempt = $3 AND status = 'pending' RETURNING 1`,
			c.Scope, c.IdempotencyKey, int32(c.Attempt), clipError(reason), s.now()).Scan(&one)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("release response: %w", ErrLeaseLost)
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
	err := s.withRetry(ctx, func(ctx context.Context) error {
		tag, err := s.pool.Exec(ctx, `DELETE FROM http_idempotency AS h USING (
				SELECT scope, idempotency_key FROM http_idempotency
				WHERE status <> 'pending' AND expires_at <= coalesce($1::timestamptz, now())
				ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED) AS s
			WHERE h.scope = s.scope AND h.idempotency_key = s.idempotency_key AND h.status <> 'pending'`,
			s.now(), int32(limit))
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, interpretError("purge responses", err)
	}
	return int(n), nil
}
