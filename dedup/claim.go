package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/ledger"
)

// claimSQL claims a whole batch in one statement, one round trip:
//   - ins inserts every key that has no row (in key order, so concurrent
//     batches take index locks in the same order), unless the ledger has
//     it (below). A plain INSERT, not ON CONFLICT DO NOTHING: claimLocks
//     has serialised every claim of these keys, so a key no partition
//     shows is being inserted by nobody else, and a unique violation
//     could only mean that guard broke; it fails the claim (the batch is
//     retried, and then sees the other row) rather than being skipped.
//     The speculative insertion ON CONFLICT makes costs a second probe of
//     the unique index, a lock and a WAL record per row;
//   - existing reads, from the statement's snapshot, the row of each input
//     the insert did not take (usually none): one primary-key probe each;
//   - upd re-acquires, with one conditional UPDATE, rows that are `failed`,
//     or pending with an expired lease, still inside the provider key window,
//     when the fingerprint matches; attempts+1 fences out the old holder (a
//     `failed` row starts a new pending episode: pending_since and the
//     lookup back-off start again, but never its key window; a pending one
//     keeps its own). It
//     touches only rows the snapshot shows re-acquirable (a duplicate of a
//     completed key costs no further probe), and re-checks the condition on
//     the row's latest version;
//   - the final SELECT returns the row each input now has: inserted,
//     re-acquired, or found untouched (from the snapshot). An inserted row
//     comes without its input's ord (claimRound finds the input by the
//     key), since joining the inserted rows back to the input would hash
//     every inserted row again;
//   - a key whose row was purged after its retention but whose payment is
//     in the ledger (never purged) is not inserted again: it comes back as
//     a completed row built from the ledger row, with no fingerprint
//     (request_hash NULL). So a message of a payment that completed long
//     ago can never charge again, however late it arrives; the ledger's
//     amount and currency then tell it from another payment sent under the
//     old key (evaluate: a Mismatch).
//
// Every input has an output row; one without (which would mean a row
// committed after this statement's snapshot and invisible to it) is
// reported in flight.
//
// Every probe of a table is a scalar subquery or a join on a key, and status
// tests are CASEs: see planGeneric.
var claimSQL = `
WITH input AS (
    SELECT * FROM unnest(@merchants::text[], @keys::text[], @hashes::bytea[], @provider_keys::text[],
                         @amounts::bigint[], @currencies::text[], @trace_ids::text[], @ords::int[])
        AS t(merchant_id, idempotency_key, request_hash, provider_key, amount, currency, trace_id, ord)
),
ins AS (
    INSERT INTO idempotency_keys AS k (merchant_id, idempotency_key, request_hash, status, provider_key,
        amount, currency, attempts, locked_by, locked_until, key_window_start, created_at, updated_at, expires_at, trace_id,
        pending_since)
    SELECT merchant_id, idempotency_key, request_hash, 'pending', provider_key,
        amount, currency, 1, @holder, ` + dbNow + ` + @lease::interval, ` + dbNow + `, ` + dbNow + `, ` + dbNow + `,
        ` + dbNow + ` + @retention::interval, nullif(trace_id, ''), ` + dbNow + `
    FROM input
    WHERE (SELECT true FROM payments p
           WHERE p.merchant_id = input.merchant_id AND p.idempotency_key = input.idempotency_key) IS NULL
      -- The table is partitioned by day (migration 00013): each day's
      -- unique index catches a second claim of the same day only, so a key
      -- held by any other day is not inserted (the lock of claimLocks makes
      -- this see a concurrent claim's row).
      AND (SELECT true FROM idempotency_keys r
           WHERE r.merchant_id = input.merchant_id AND r.idempotency_key = input.idempotency_key) IS NULL
    ORDER BY merchant_id COLLATE "C", idempotency_key COLLATE "C" -- the unique index's order (migration 00015)
    RETURNING ` + recordColumns + `
),
rest AS (
    SELECT i.* FROM input i
    WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.merchant_id = i.merchant_id AND ins.idempotency_key = i.idempotency_key)
),
existing AS (
    SELECT i.ord, i.request_hash AS input_hash, ` + qualified("r") + `
    FROM rest i JOIN idempotency_keys r ON r.merchant_id = i.merchant_id AND r.idempotency_key = i.idempotency_key
),
upd AS (
    UPDATE idempotency_keys AS k
    SET status = 'pending', locked_by = @holder, locked_until = ` + dbNow + ` + @lease::interval, attempts = k.attempts + 1,
        maybe_charged = k.maybe_charged OR k.status = 'pending',
        pending_since = CASE WHEN k.status = 'failed' THEN ` + dbNow + ` ELSE k.pending_since END,
        lookup_failures = CASE WHEN k.status = 'failed' THEN 0 ELSE k.lookup_failures END,
        next_lookup_at = CASE WHEN k.status = 'failed' THEN NULL ELSE k.next_lookup_at END,
        updated_at = ` + dbNow + `, expires_at = greatest(k.expires_at, ` + dbNow + ` + @retention::interval)
    FROM existing e
    WHERE ` + reacquirable("e") + ` AND e.request_hash = e.input_hash
      AND k.merchant_id = e.merchant_id AND k.idempotency_key = e.idempotency_key
      AND k.request_hash = e.input_hash AND ` + reacquirable("k") + `
    RETURNING ` + qualified("k") + `
),
pend AS (
    -- Every row the claim leaves pending is named in pending_keys (migration
    -- 00012), the reconciler's way to it. A new key has no name there (a
    -- name lives as long as its row is pending, and the claimLocks lock
    -- keeps any other claim of the key out), so its name is inserted
    -- plainly, not speculatively (ON CONFLICT costs about 1.5 µs a row);
    -- NOT EXISTS keeps a stray name from failing the claim.
    INSERT INTO pending_keys (merchant_id, idempotency_key)
    SELECT merchant_id, idempotency_key FROM ins
    WHERE NOT EXISTS (SELECT 1 FROM pending_keys q
                      WHERE q.merchant_id = ins.merchant_id AND q.idempotency_key = ins.idempotency_key)
),
pend_again AS (
    -- A re-acquired pending key is named already.
    INSERT INTO pending_keys (merchant_id, idempotency_key)
    SELECT merchant_id, idempotency_key FROM upd
    ON CONFLICT (merchant_id, idempotency_key) DO NOTHING
)
SELECT -1, 1, ` + qualified("r") + ` FROM ins r -- claimRound finds the input by the key
UNION ALL
SELECT e.ord, 2, ` + qualified("r") + ` FROM existing e JOIN upd r USING (merchant_id, idempotency_key)
UNION ALL
SELECT e.ord, 3, ` + qualified("e") + ` FROM existing e
WHERE NOT EXISTS (SELECT 1 FROM upd WHERE upd.merchant_id = e.merchant_id AND upd.idempotency_key = e.idempotency_key)
UNION ALL
SELECT i.ord, 4, p.merchant_id, p.idempotency_key, NULL::bytea, 'completed', p.provider_key, p.amount, p.currency,
    1, NULL::text, NULL::timestamptz, false, p.created_at, p.charge_id,
    CASE p.status WHEN 'declined' THEN 402 WHEN 'failed' THEN 402 WHEN 'processing' THEN 202 ELSE 200 END,
    convert_to(jsonb_build_object('id', p.charge_id, 'status', p.status, 'note', 'idempotency key purged; outcome from the ledger')::text, 'UTF8'),
    NULL::text, p.created_at, p.created_at, p.created_at, p.created_at, NULL::text
FROM rest i JOIN payments p USING (merchant_id, idempotency_key)
WHERE NOT EXISTS (SELECT 1 FROM existing e WHERE e.ord = i.ord)`

// claimLocks runs before claimSQL, in the same implicit transaction and
// round trip (queryPinned): it takes a transaction advisory lock per key of
// the batch, in hash order so that two batches never deadlock, and holds
// them until the claim commits. claimSQL then takes its snapshot after any
// concurrent claim of the same key committed, and sees that claim's row in
// whichever day partition it went to (migration 00013): two workers racing
// one key across a day boundary cannot both insert it. The locks are
// per schema, merchant and key (a merchant id holds no ':').
const claimLocks = `SELECT now(), set_config('enable_seqscan', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true),
    (SELECT count(pg_advisory_xact_lock(h)) FROM (
        SELECT DISTINCT hashtextextended(current_schema() || '/' || m || ':' || k, 0) AS h
        FROM unnest(@merchants::text[], @keys::text[]) AS u(m, k) ORDER BY 1) AS l)`

// reacquirable is the claim's test of a row (alias a) that may be taken
// over: failed, or pending with an expired lease, and in either case inside
// the provider key window. The window counts from the first call under the
// provider key; a re-acquire never restarts it (only a lookup that proves
// nothing was charged does: ResolveNotCharged), because a row whose provider
// key may have reached the provider must never be re-called blind once the
// provider may have forgotten the key, whatever its status says. A CASE, not an OR of status tests, so that the planner cannot
// prove a partial index's predicate from it and walk every finished or
// pending key to find the few in the batch.
func reacquirable(a string) string {
	return `CASE ` + a + `.status WHEN 'failed' THEN ` + a + `.key_window_start > ` + dbNow + ` - @window::interval
        WHEN 'pending' THEN ` + a + `.locked_until <= ` + dbNow + ` AND ` + a + `.key_window_start > ` + dbNow + ` - @window::interval
        ELSE false END`
}

// Claim claims one command for holder, with a lease of the given length. The
// claim is committed before Claim returns.
func (s *Store) Claim(ctx context.Context, holder string, lease time.Duration, req ledger.ClaimRequest) (ledger.ClaimResult, error) {
	res, err := s.ClaimBatch(ctx, holder, lease, []ledger.ClaimRequest{req})
	if err != nil {
		return ledger.ClaimResult{}, err
	}
	return res[0], nil
}

// ClaimBatch claims a slice of commands in one round trip and returns one
// result per request, in order. The outcomes are those of claiming the
// requests one by one in order: a key repeated inside the batch is judged
// against the row its first occurrence left (in flight, duplicate or
// mismatch), and only when that row could still be acquired does the batch
// take a second round trip for it.
func (s *Store) ClaimBatch(ctx context.Context, holder string, lease time.Duration, reqs []ledger.ClaimRequest) ([]ledger.ClaimResult, error) {
	if holder == "" {
		return nil, errors.New("claim keys: empty holder")
	}
	if lease <= 0 {
		return nil, fmt.Errorf("claim keys: lease must be positive, got %v", lease)
	}
	for i := range reqs {
		if err := reqs[i].Validate(); err != nil {
			return nil, fmt.Errorf("claim keys: request %d: %w", i, err)
		}
	}
	results := make([]ledger.ClaimResult, len(reqs))
	pending := make([]int, len(reqs)) // indexes still to claim
	for i := range pending {
		pending[i] = i
	}
	for len(pending) > 0 {
		next, err := s.claimRound(ctx, holder, lease, reqs, pending, results)
		if err != nil {
			return nil, err
		}
		pending = next
	}
	return results, nil
}

type rowKey struct{ merchant, key string }

// claimRound claims the first occurrence of each key among idx in one
// statement, judges later occurrences against the row it left, and returns
// the indexes that need another round.
func (s *Store) claimRound(ctx context.Context, holder string, lease time.Duration, reqs []ledger.ClaimRequest, idx []int, results []ledger.ClaimResult) ([]int, error) {
	first := make(map[rowKey]int, len(idx))
	var unique, repeats []int
	for _, i := range idx {
		k := rowKey{reqs[i].MerchantID, reqs[i].IdempotencyKey}
		if _, seen := first[k]; seen {
			repeats = append(repeats, i)
			continue
		}
		first[k] = i
		unique = append(unique, i)
	}

	n := len(unique)
	merchants, keys, providerKeys, currencies := make(textArray, n), make(textArray, n), make(textArray, n), make(textArray, n)
	hashes, amounts, ords, traces := make(byteaArray, n), make(int8Array, n), make([]int32, n), make(textArray, n)
	for j, i := range unique {
		r := reqs[i]
		merchants[j], keys[j], hashes[j] = r.MerchantID, r.IdempotencyKey, r.RequestHash
		providerKeys[j], amounts[j], currencies[j], ords[j] = r.ProviderKey(), r.Amount, r.Currency, int32(i)
		traces[j] = r.TraceID
	}
	args := pgx.NamedArgs{
		"merchants": merchants, "keys": keys, "hashes": hashes, "provider_keys": providerKeys,
		"amounts": amounts, "currencies": currencies, "trace_ids": traces, "ords": ords,
		"holder": holder, "now": s.db.Now(), "lease": lease, "retention": s.retention, "window": s.window,
	}

	// A row the claim did not take is judged at the statement's own time,
	// which queryPinned reports once the rows are read: collect them first.
	type found struct {
		i   int
		rec ledger.Record
	}
	var untaken []found
	done := make(map[int]bool, n)
	var now time.Time
	var ord, kind int32
	sc := newRecordScanner(&ord, &kind)
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		clear(done)
		untaken = untaken[:0]
		var err error
		now, err = s.queryPinned(ctx, claimLocks, claimSQL, args, func(rows pgx.Rows) error {
			rec, err := sc.scan(rows)
			if err != nil {
				return err
			}
			i := int(ord)
			if kind == 1 { // an inserted row carries no ord: its key is the first occurrence's
				i = first[rowKey{rec.MerchantID, rec.IdempotencyKey}]
			}
			switch kind {
			case 1, 2:
				out := ledger.Claimed
				if kind == 2 {
					out = ledger.Reacquired
				}
				results[i] = ledger.ClaimResult{Outcome: out, Record: rec, Lease: &ledger.Lease{
					MerchantID: rec.MerchantID, IdempotencyKey: rec.IdempotencyKey, ProviderKey: rec.ProviderKey,
					Holder: holder, Attempt: rec.Attempts, Until: rec.LockedUntil, MaybeCharged: rec.MaybeCharged,
					TraceID: rec.TraceID, CreatedAt: rec.CreatedAt,
				}}
			default:
				untaken = append(untaken, found{i, rec})
			}
			done[i] = true
			return nil
		})
		return err
	})
	if err != nil {
		return nil, interpretError("claim keys", err)
	}
	for _, f := range untaken {
		results[f.i], _ = ledger.Evaluate(f.rec, reqs[f.i], now, s.window)
	}
	for _, i := range unique {
		if !done[i] {
			// A row committed after our snapshot (not expected: see claimSQL).
			results[i] = ledger.ClaimResult{Outcome: ledger.InFlight, RetryIn: max(lease, ledger.MinRetry)}
		}
	}
	if err := s.parkForLookup(ctx, holder, unique, results); err != nil {
		return nil, err
	}

	// Later occurrences of a key, in order: once one of them could still
	// acquire the row, it and every occurrence after it wait for the next
	// round, which sees the row that occurrence leaves.
	var again []int
	deferred := map[rowKey]bool{}
	for _, i := range repeats {
		k := rowKey{reqs[i].MerchantID, reqs[i].IdempotencyKey}
		f := results[first[k]]
		if deferred[k] {
			again = append(again, i)
			continue
		}
		if f.Record.MerchantID == "" { // first met an invisible concurrent claim
			results[i] = f
			continue
		}
		res, acquirable := ledger.Evaluate(f.Record, reqs[i], now, s.window)
		if acquirable && f.Outcome != ledger.InFlight {
			deferred[k] = true
			again = append(again, i)
			continue
		}
		results[i] = res
	}
	return again, nil
}

// parkSQL hands `failed` rows past their provider key window to the
// reconciler: pending with an expired lease and maybe_charged, so that its
// acquire picks them up and a lookup decides (completed if the provider has
// the charge; failed with a fresh window if it provably has none). Nobody
// calls the provider for them meanwhile. The fingerprint and the window are
// checked again on the row's latest version.
var parkSQL = `
WITH parked AS (
    UPDATE idempotency_keys AS k
    SET status = 'pending', locked_by = @holder, locked_until = ` + dbNow + `, attempts = k.attempts + 1, maybe_charged = true,
        pending_since = ` + dbNow + `, lookup_failures = 0, next_lookup_at = NULL,
        last_error = 'failed past the provider key window: only a provider lookup may resolve it', updated_at = ` + dbNow + `
    FROM unnest(@merchants::text[], @keys::text[], @hashes::bytea[]) AS i(merchant_id, idempotency_key, request_hash)
    WHERE k.merchant_id = i.merchant_id AND k.idempotency_key = i.idempotency_key AND k.request_hash = i.request_hash
      AND k.status = 'failed' AND k.key_window_start <= ` + dbNow + ` - @window::interval
    RETURNING ` + qualified("k") + `
), pend AS (
    INSERT INTO pending_keys (merchant_id, idempotency_key) SELECT merchant_id, idempotency_key FROM parked
    ON CONFLICT (merchant_id, idempotency_key) DO NOTHING
)
SELECT * FROM parked`

// parkForLookup parks the failed rows among the claim's first occurrences
// idx that evaluate sent to a lookup, and puts the parked rows in results.
// It costs a round trip only when there is such a row (rare: a failure
// proved nothing was charged, then nothing retried the key for a day).
func (s *Store) parkForLookup(ctx context.Context, holder string, idx []int, results []ledger.ClaimResult) error {
	var merchants, keys []string
	var hashes [][]byte
	at := map[rowKey]int{}
	for _, i := range idx {
		r := results[i]
		if r.Outcome != ledger.NeedsLookup || r.Record.Status != ledger.StatusFailed {
			continue
		}
		merchants, keys = append(merchants, r.Record.MerchantID), append(keys, r.Record.IdempotencyKey)
		hashes = append(hashes, r.Record.RequestHash)
		at[rowKey{r.Record.MerchantID, r.Record.IdempotencyKey}] = i
	}
	if len(keys) == 0 {
		return nil
	}
	args := pgx.NamedArgs{"merchants": merchants, "keys": keys, "hashes": hashes, "holder": holder,
		"now": s.db.Now(), "window": s.window}
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		rows, err := s.db.Pool.Query(ctx, parkSQL, args)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			rec, err := scanRecord(rows)
			if err != nil {
				return err
			}
			results[at[rowKey{rec.MerchantID, rec.IdempotencyKey}]].Record = rec
		}
		return rows.Err()
	})
	return interpretError("park keys for lookup", err)
}
