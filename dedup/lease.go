package dedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/ledger"
)

// fenced is the condition every write after the claim carries: the row is
// still pending under this holder at this attempt.
const fenced = `merchant_id = @merchant AND idempotency_key = @key AND status = 'pending'
	AND locked_by = @holder AND attempts = @attempt`

// errNoClaimTime is the error of a completion whose lease does not say when
// its key was claimed (Lease.CreatedAt): every lease the Store hands out
// does, and without it the row could not be found in its partition.
func errNoClaimTime(op string) error {
	return fmt.Errorf("%s: the lease carries no claim time (Lease.CreatedAt): leases come from Claim, ClaimBatch or AcquireStuck", op)
}

func leaseArgs(l ledger.Lease) pgx.NamedArgs {
	return pgx.NamedArgs{"merchant": l.MerchantID, "key": l.IdempotencyKey, "holder": l.Holder, "attempt": int32(l.Attempt)}
}

// Heartbeat extends a held lease to now+d and returns it. ErrLeaseLost means
// another holder took the row: the caller must stop and not record anything.
func (s *Store) Heartbeat(ctx context.Context, l ledger.Lease, d time.Duration) (ledger.Lease, error) {
	args := leaseArgs(l)
	args["now"], args["lease"] = s.db.Now(), d
	var until time.Time
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, `UPDATE idempotency_keys SET locked_until = `+dbNow+` + @lease::interval, updated_at = `+dbNow+`
			WHERE `+fenced+` RETURNING locked_until`, args).Scan(&until)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return l, fmt.Errorf("heartbeat lease: %w", ledger.ErrLeaseLost)
	}
	if err != nil {
		return l, interpretError("heartbeat lease", err)
	}
	l.Until = until
	return l, nil
}

// unpendDone is the CTE that takes the keys of a statement's CTE `done`
// (merchant_id, idempotency_key, status) that are no longer pending out of
// pending_keys (migration 00012), in the statement that finished them.
const unpendDone = `unpend AS (
    DELETE FROM pending_keys p USING done d
    WHERE p.merchant_id = d.merchant_id AND p.idempotency_key = d.idempotency_key AND d.status <> 'pending'
)`

// completeSQL finishes the key and writes the ledger row in one statement
// (one transaction): both or neither. The row is looked for in the day
// partition its created_at (the lease's) names, not in every live one.
const completeSQL = `
WITH done AS (
    UPDATE idempotency_keys
    SET status = 'completed', response_status = @response_status, response = @response, charge_id = @charge_id,
        completed_at = ` + dbNow + `, updated_at = ` + dbNow + `, expires_at = ` + dbNow + ` + @retention::interval,
        locked_until = NULL, last_error = NULL
    WHERE ` + fenced + ` AND created_at = @created_at
    RETURNING merchant_id, idempotency_key, provider_key, amount, currency, status
), ledger AS (
    INSERT INTO payments (merchant_id, idempotency_key, provider_key, charge_id, status, amount, currency, created_at)
    SELECT merchant_id, idempotency_key, provider_key, @charge_id, @payment_status, amount, currency, ` + dbNow + ` FROM done
    RETURNING 1
), ` + unpendDone + `
SELECT count(*) FROM done`

// Complete records a definitive outcome: the key becomes `completed` with
// its response, and the ledger gets its row, in one transaction. Completing
// again with the same lease is a no-op; with a lost lease it is ErrLeaseLost
// and changes nothing.
func (s *Store) Complete(ctx context.Context, l ledger.Lease, c ledger.Completion) error {
	if len(c.Response) == 0 {
		return errors.New("complete key: empty response")
	}
	if !json.Valid(c.Response) {
		return errors.New("complete key: the response is not JSON")
	}
	if !c.Declined && c.ChargeID == "" {
		return errors.New("complete key: a charge needs its provider charge id")
	}
	if c.Declined && c.Processing {
		return errors.New("complete key: a completion is declined or processing, not both")
	}
	if c.ResponseStatus < 100 || c.ResponseStatus > 599 {
		return fmt.Errorf("complete key: response status %d is not an HTTP status", c.ResponseStatus)
	}
	if l.CreatedAt.IsZero() {
		return errNoClaimTime("complete key")
	}
	args := leaseArgs(l)
	paymentStatus := c.PaymentStatus()
	args["now"], args["retention"], args["created_at"] = s.db.Now(), s.retention, l.CreatedAt
	args["response_status"], args["response"], args["charge_id"] = int32(c.ResponseStatus), []byte(c.Response), nullable(c.ChargeID)
	args["payment_status"] = paymentStatus
	var n int64
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, completeSQL, args).Scan(&n)
	})
	if err != nil {
		return interpretError("complete key", err)
	}
	if n == 1 {
		return nil
	}
	rec, err := s.Get(ctx, l.MerchantID, l.IdempotencyKey)
	if err != nil {
		return fmt.Errorf("complete key: %w", err)
	}
	if rec.Status == ledger.StatusCompleted && rec.LockedBy == l.Holder && rec.Attempts == l.Attempt {
		return nil // already completed by this very lease: a retried call
	}
	return fmt.Errorf("complete key: %w", ledger.ErrLeaseLost)
}

// Fail records a provider answer that proves this call was not executed
// (provider.ClassRetryable: a 429, a refused dial; never a 409 or any
// unknown outcome, which are Release). The row becomes `failed`
// (re-acquirable by the next delivery inside its key window) unless a call
// under the key may have charged (maybe_charged): then this answer proves
// nothing about that call, and the row stays pending with its lease
// released so a redelivery or the reconciler resolves it. It returns the
// row's new status.
func (s *Store) Fail(ctx context.Context, l ledger.Lease, reason string) (ledger.Status, error) {
	args := leaseArgs(l)
	args["now"], args["reason"] = s.db.Now(), clipError(reason)
	var status string
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, `WITH done AS (UPDATE idempotency_keys
			SET status = CASE WHEN maybe_charged THEN 'pending' ELSE 'failed' END,
			    locked_until = CASE WHEN maybe_charged THEN `+dbNow+` ELSE NULL END,
			    last_error = @reason, updated_at = `+dbNow+`
			WHERE `+fenced+` RETURNING merchant_id, idempotency_key, status), `+unpendDone+`
			SELECT status FROM done`, args).Scan(&status)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("fail key: %w", ledger.ErrLeaseLost)
	}
	if err != nil {
		return "", interpretError("fail key", err)
	}
	return ledger.Status(status), nil
}

// Release gives up a held lease without an outcome: the provider call's
// result is unknown, or the worker is shutting down. The row stays pending,
// is marked maybe_charged, and can be re-acquired at once by a redelivery
// (which re-calls with the same provider key) or resolved by the reconciler.
func (s *Store) Release(ctx context.Context, l ledger.Lease, reason string) error {
	args := leaseArgs(l)
	args["now"], args["reason"] = s.db.Now(), clipError(reason)
	var one int
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, `UPDATE idempotency_keys
			SET locked_until = least(locked_until, `+dbNow+`), maybe_charged = true, last_error = @reason, updated_at = `+dbNow+`
			WHERE `+fenced+` RETURNING 1`, args).Scan(&one)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("release key: %w", ledger.ErrLeaseLost)
	}
	return interpretError("release key", err)
}

// AcquireStuck leases up to limit pending rows whose lease expired more than
// grace ago, oldest first, for holder, skipping rows whose lookups are backed
// off (DeferLookup) until their next lookup is due. Rows another reconciler is leasing at
// the same moment are skipped (FOR UPDATE SKIP LOCKED), and the new lease
// (attempts+1) fences out both them and any late worker.
func (s *Store) AcquireStuck(ctx context.Context, holder string, grace, lease time.Duration, limit int) ([]ledger.Stuck, error) {
	if holder == "" || lease <= 0 || limit <= 0 || grace < 0 {
		return nil, fmt.Errorf("acquire stuck keys: need a holder, a positive lease and limit, and a non-negative grace")
	}
	args := pgx.NamedArgs{"holder": holder, "now": s.db.Now(), "lease": lease, "grace": grace, "limit": int32(limit)}
	var out []ledger.Stuck
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		out = out[:0]
		rows, err := s.db.Pool.Query(ctx, `UPDATE idempotency_keys AS k
			SET locked_by = @holder, locked_until = `+dbNow+` + @lease::interval, attempts = k.attempts + 1,
			    maybe_charged = true, updated_at = `+dbNow+`
			FROM (SELECT r.merchant_id, r.idempotency_key FROM pending_keys p
			      JOIN idempotency_keys r ON r.merchant_id = p.merchant_id AND r.idempotency_key = p.idempotency_key
			      WHERE r.status = 'pending' AND r.locked_until < `+dbNow+` - @grace::interval
			        AND (r.next_lookup_at IS NULL OR r.next_lookup_at <= `+dbNow+`)
			      ORDER BY r.locked_until LIMIT @limit FOR UPDATE OF r SKIP LOCKED) AS s
			WHERE k.merchant_id = s.merchant_id AND k.idempotency_key = s.idempotency_key
			RETURNING `+qualified("k"), args)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			rec, err := scanRecord(rows)
			if err != nil {
				return err
			}
			out = append(out, ledger.Stuck{Record: rec, Lease: ledger.Lease{
				MerchantID: rec.MerchantID, IdempotencyKey: rec.IdempotencyKey, ProviderKey: rec.ProviderKey,
				Holder: holder, Attempt: rec.Attempts, Until: rec.LockedUntil, MaybeCharged: true, TraceID: rec.TraceID,
				CreatedAt: rec.CreatedAt,
			}})
		}
		return rows.Err()
	})
	if err != nil {
		return nil, interpretError("acquire stuck keys", err)
	}
	return out, nil
}

// ResolveNotCharged marks a leased row `failed` after a provider lookup
// proved nothing was charged under its key; it clears maybe_charged and
// starts a fresh key window, so the next delivery may call the provider
// again (blind, under the same key, for one more window).
func (s *Store) ResolveNotCharged(ctx context.Context, l ledger.Lease, reason string) error {
	args := leaseArgs(l)
	args["now"], args["reason"] = s.db.Now(), clipError(reason)
	var one int
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, `WITH done AS (UPDATE idempotency_keys
			SET status = 'failed', locked_until = NULL, maybe_charged = false, key_window_start = `+dbNow+`,
			    last_error = @reason, updated_at = `+dbNow+`, lookup_failures = 0, next_lookup_at = NULL
			WHERE `+fenced+` RETURNING merchant_id, idempotency_key, status), `+unpendDone+`
			SELECT 1 FROM done`, args).Scan(&one)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("resolve key: %w", ledger.ErrLeaseLost)
	}
	return interpretError("resolve key", err)
}

// DeferLookup releases a row the reconciler leased after its provider
// lookup failed, like Release, and backs the row's lookups off: it counts
// the failure and sets when AcquireStuck may take the row again. It returns
// the row's consecutive failed lookups and the time of its next lookup (on
// the store's clock). The row's pending_since is kept: its stuck age keeps
// growing.
func (s *Store) DeferLookup(ctx context.Context, l ledger.Lease, reason string, b ledger.Backoff) (int, time.Time, error) {
	if b.Base <= 0 || b.Max < b.Base {
		return 0, time.Time{}, fmt.Errorf("defer lookup: back-off %v..%v is not a range", b.Base, b.Max)
	}
	args := leaseArgs(l)
	args["now"], args["reason"], args["base"], args["max"] = s.db.Now(), clipError(reason), b.Base, b.Max
	var (
		failures int32
		next     time.Time
	)
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, `UPDATE idempotency_keys
			SET locked_until = least(locked_until, `+dbNow+`), maybe_charged = true, last_error = @reason,
			    updated_at = `+dbNow+`, lookup_failures = lookup_failures + 1,
			    next_lookup_at = `+dbNow+` + least(@max::interval, @base::interval * power(2, least(lookup_failures, 40)))
			WHERE `+fenced+` RETURNING lookup_failures, next_lookup_at`, args).Scan(&failures, &next)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, time.Time{}, fmt.Errorf("defer lookup: %w", ledger.ErrLeaseLost)
	}
	if err != nil {
		return 0, time.Time{}, interpretError("defer lookup", err)
	}
	return int(failures), next, nil
}

// Purge applies the key retention and returns how many rows it removed.
// The keys table is partitioned by day of created_at (migration 00013):
// Purge first runs maintain_key_partitions, which creates the coming days'
// partitions and drops, whole, every day older than the retention that
// holds no pending row (a pending row keeps its day until it is resolved;
// rows are never moved). Then it deletes, row by row and at most limit of
// each, the expired finished rows of the two partitions that are not days:
// the table's rows from before the partitioning, and the default
// partition's (a clock outside the days created). Pending rows are never
// removed: they are unresolved payments. Call it in a loop for more; a
// dropped day counts all its rows.
//
// The row purge walks those partitions' index on created_at up to now minus
// the store's retention: a row's expires_at is never earlier than that, and
// no index covers expires_at or status, so that completions stay HOT
// updates (migration 00012).
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("purge keys: limit must be positive, got %d", limit)
	}
	var n int64
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, purgeSQL,
			pgx.NamedArgs{"now": s.db.Now(), "limit": int32(limit), "retention": s.retention, "ahead": int32(PartitionsAhead)}).Scan(&n)
	})
	if err != nil {
		return 0, interpretError("purge keys", err)
	}
	return int(n), nil
}

// PartitionsAhead is how many days after today Purge keeps a partition of
// the keys table ready for.
const PartitionsAhead = 2

// purgeRows deletes expired finished rows of one partition (a name).
func purgeRows(part string) string {
	return `DELETE FROM ` + part + ` AS k USING (
        SELECT merchant_id, idempotency_key FROM ` + part + `
        WHERE created_at <= ` + dbNow + ` - @retention::interval AND status <> 'pending' AND expires_at <= ` + dbNow + `
        ORDER BY created_at LIMIT @limit FOR UPDATE SKIP LOCKED) AS s
    WHERE k.merchant_id = s.merchant_id AND k.idempotency_key = s.idempotency_key AND k.status <> 'pending'
    RETURNING 1`
}

// purgeSQL is Purge's one statement: the partition maintenance, then the
// row purge of the two partitions that are not days.
var purgeSQL = `
WITH days AS (
    SELECT dropped_rows FROM maintain_key_partitions(@now, @retention::interval, @ahead)
), old AS (` + purgeRows("idempotency_keys_unpartitioned") + `
), def AS (` + purgeRows("idempotency_keys_default") + `
)
SELECT (SELECT dropped_rows FROM days) + (SELECT count(*) FROM old) + (SELECT count(*) FROM def)`

// clipError bounds what is stored in last_error, card numbers masked
// before the cut (a provider's error may echo what a merchant wrote).
func clipError(s string) string {
	s, _ = redact.Cut(s, 1000)
	return s
}

// completeBatchSQL is completeSQL for many leases in one statement: a group
// commit. Rows whose lease was lost are simply not updated. Each row is
// looked for in the day partition its lease's created_at names: the plan's
// run-time partition pruning then skips every other live day's key index,
// which the probe would otherwise descend (two or three levels deep each
// once the days hold millions of keys) to find nothing.
const completeBatchSQL = `
WITH input AS (
    SELECT * FROM unnest(@merchants::text[], @keys::text[], @holders::text[], @attempts::int[],
                         @response_statuses::int[], @responses::bytea[], @charge_ids::text[], @payment_statuses::text[],
                         @created_ats::timestamptz[])
        AS t(merchant_id, idempotency_key, holder, attempt, response_status, response, charge_id, payment_status, created_at)
), done AS (
    UPDATE idempotency_keys AS k
    SET status = 'completed', response_status = i.response_status, response = i.response, charge_id = i.charge_id,
        completed_at = ` + dbNow + `, updated_at = ` + dbNow + `, expires_at = ` + dbNow + ` + @retention::interval,
        locked_until = NULL, last_error = NULL
    FROM input i
    -- locked_until IS NOT NULL is status = 'pending' (CHECK
    -- pending_has_lease), written so that no partial index on status
    -- matches: see planGeneric.
    WHERE k.merchant_id = i.merchant_id AND k.idempotency_key = i.idempotency_key AND k.locked_until IS NOT NULL
      AND k.locked_by = i.holder AND k.attempts = i.attempt AND k.created_at = i.created_at
    RETURNING k.merchant_id, k.idempotency_key, k.provider_key, k.amount, k.currency, i.charge_id, i.payment_status, k.status
), ledger AS (
    INSERT INTO payments (merchant_id, idempotency_key, provider_key, charge_id, status, amount, currency, created_at)
    SELECT merchant_id, idempotency_key, provider_key, charge_id, payment_status, amount, currency, ` + dbNow + ` FROM done
), ` + unpendDone + `, notified AS (
    -- What the completion trigger would send (migrations 00003 and 00005),
    -- for the rows a gateway request may wait on; sent at commit.
    SELECT pg_notify('` + CompletedChannel + `', json_build_object('s', (SELECT n.nspname FROM pg_namespace n
               WHERE n.oid = (SELECT c.relnamespace FROM pg_class c WHERE c.oid = 'idempotency_keys'::regclass)),
           'm', d.merchant_id, 'k', d.idempotency_key)::text)
    FROM done d
    WHERE (SELECT true FROM gateway_intake g
           WHERE g.merchant_id = d.merchant_id AND g.idempotency_key = d.idempotency_key) IS NOT NULL
)
SELECT merchant_id, idempotency_key FROM done WHERE (SELECT count(*) FROM notified) >= 0`

// CompleteBatch completes many leases in one transaction (a group commit)
// and returns one error per item: nil, or ErrLeaseLost. If the batch as a
// whole fails on a ledger conflict, it falls back to completing the items
// one by one so that one bad item cannot hold back the others.
func (s *Store) CompleteBatch(ctx context.Context, items []ledger.CompleteItem) ([]error, error) {
	n := len(items)
	if n == 0 {
		return nil, nil
	}
	merchants, keys, holders, chargeIDs, paymentStatuses := make(textArray, n), make(textArray, n), make(textArray, n), make(nullTextArray, n), make(textArray, n)
	attempts, statuses, responses := make([]int32, n), make([]int32, n), make(byteaArray, n)
	createdAts := make(timestamptzArray, n)
	for i, it := range items {
		c := it.Completion
		if len(c.Response) == 0 || !json.Valid(c.Response) || (!c.Declined && c.ChargeID == "") || (c.Declined && c.Processing) || c.ResponseStatus < 100 || c.ResponseStatus > 599 {
			return nil, fmt.Errorf("complete keys: item %d: a completion needs a JSON response, an HTTP status and, when charged, a charge id", i)
		}
		if it.Lease.CreatedAt.IsZero() {
			return nil, errNoClaimTime(fmt.Sprintf("complete keys: item %d", i))
		}
		createdAts[i] = it.Lease.CreatedAt
		merchants[i], keys[i], holders[i], attempts[i] = it.Lease.MerchantID, it.Lease.IdempotencyKey, it.Lease.Holder, int32(it.Lease.Attempt)
		statuses[i], responses[i], chargeIDs[i] = int32(c.ResponseStatus), []byte(c.Response), c.ChargeID
		paymentStatuses[i] = c.PaymentStatus()
	}
	args := pgx.NamedArgs{
		"merchants": merchants, "keys": keys, "holders": holders, "attempts": attempts,
		"response_statuses": statuses, "responses": responses, "charge_ids": chargeIDs, "payment_statuses": paymentStatuses,
		"created_ats": createdAts, "now": s.db.Now(), "retention": s.retention,
	}
	completed := make(map[rowKey]bool, n)
	var k rowKey
	dest := []any{&k.merchant, &k.key} // once per statement, not per row
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		clear(completed)
		_, err := s.queryPinned(ctx, planGenericNotified, completeBatchSQL, args, func(rows pgx.Rows) error {
			if err := rows.Scan(dest...); err != nil {
				return err
			}
			completed[k] = true
			return nil
		})
		return err
	})
	if err = interpretError("complete keys", err); errors.Is(err, ledger.ErrLedgerConflict) {
		errs := make([]error, n)
		for i, it := range items {
			errs[i] = s.Complete(ctx, it.Lease, it.Completion)
			if errs[i] != nil && !errors.Is(errs[i], ledger.ErrLeaseLost) && !errors.Is(errs[i], ledger.ErrLedgerConflict) {
				return nil, errs[i]
			}
		}
		return errs, nil
	}
	if err != nil {
		return nil, err
	}
	errs := make([]error, n)
	for i, it := range items {
		if !completed[rowKey{it.Lease.MerchantID, it.Lease.IdempotencyKey}] {
			errs[i] = s.Complete(ctx, it.Lease, it.Completion) // no-op or ErrLeaseLost: tells which
		}
	}
	return errs, nil
}
