package dedup

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/ledger"
)

// statsSQL reads every figure in one statement. Counting by status scans the
// table (it is an operator's query, not the hot path); the pending figures
// walk pending_keys (the keys in flight or stuck), the windows the ledger's index on
// created_at (a ledger row is written in the transaction that completes the
// key, with the same time).
const statsSQL = `
SELECT
    ` + dbNow + `,
    (SELECT count(*) FROM idempotency_keys WHERE status = 'pending'),
    (SELECT count(*) FROM idempotency_keys WHERE status = 'completed'),
    (SELECT count(*) FROM idempotency_keys WHERE status = 'failed'),
    (SELECT min(k.pending_since) FROM pending_keys p JOIN idempotency_keys k USING (merchant_id, idempotency_key) WHERE k.status = 'pending'),
    (SELECT count(*) FROM pending_keys p JOIN idempotency_keys k USING (merchant_id, idempotency_key) WHERE k.status = 'pending' AND k.pending_since < ` + dbNow + ` - @grace::interval),
    (SELECT count(*) FROM pending_keys p JOIN idempotency_keys k USING (merchant_id, idempotency_key) WHERE k.status = 'pending' AND k.lookup_failures > 0),
    (SELECT count(*) FROM pending_keys p JOIN idempotency_keys k USING (merchant_id, idempotency_key) WHERE k.status = 'pending' AND k.maybe_charged),
    (SELECT count(*) FROM payments WHERE created_at > ` + dbNow + ` - interval '1 minute' AND created_at <= ` + dbNow + `),
    (SELECT count(*) FROM payments WHERE created_at > ` + dbNow + ` - interval '1 hour' AND created_at <= ` + dbNow + `),
    (SELECT count(*) FROM payments WHERE created_at > ` + dbNow + ` - interval '1 hour' AND created_at <= ` + dbNow + `
        AND status = 'declined')`

// Stats reads the store's figures as of the store's time (the database's
// clock in production). A row counts as stuck when it has been pending for
// longer than grace.
func (s *Store) Stats(ctx context.Context, grace time.Duration) (ledger.Stats, error) {
	var (
		st     ledger.Stats
		oldest *time.Time
	)
	args := pgx.NamedArgs{"now": s.db.Now(), "grace": grace}
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, statsSQL, args).Scan(&st.Now, &st.Pending, &st.Completed, &st.Failed, &oldest,
			&st.Stuck, &st.LookupBackedOff, &st.MaybeCharged, &st.CompletedLastMinute, &st.CompletedLastHour, &st.DeclinedLastHour)
	})
	if err != nil {
		return ledger.Stats{}, interpretError("read store stats", err)
	}
	if oldest != nil {
		st.OldestPending = *oldest
	}
	return st, nil
}

// refColumns splits refs into the two arrays a statement unnests.
func refColumns(refs []ledger.KeyRef) (merchants, keys []string) {
	merchants, keys = make([]string, len(refs)), make([]string, len(refs))
	for i, r := range refs {
		merchants[i], keys[i] = r.MerchantID, r.IdempotencyKey
	}
	return merchants, keys
}

// UnknownKeySQL is a predicate that holds when the key in the columns
// merchant_id and idempotency_key of the relation alias has neither a
// record nor a ledger row, in the snapshot of the statement it is part of:
// for a statement of another store on this database (the gateway's
// intake) that acts at once on keys the worker has never seen and leaves
// the others to be decided by reading them (GetMany, PaymentsFor). Each
// key is one probe of each table's unique key, under the plan settings of
// the statement's batch (planGeneric or the gateway's own).
func UnknownKeySQL(alias string) string {
	return `NOT EXISTS (SELECT FROM idempotency_keys k
	    WHERE k.merchant_id = ` + alias + `.merchant_id AND k.idempotency_key = ` + alias + `.idempotency_key)
	AND NOT EXISTS (SELECT FROM payments p
	    WHERE p.merchant_id = ` + alias + `.merchant_id AND p.idempotency_key = ` + alias + `.idempotency_key)`
}

// lookupBatch bounds the keys one GetMany statement asks for.
const lookupBatch = 5000

// getManySQL reads the records of a batch of keys, like the claim: probed
// one by one under the pinned plan (planGeneric), whatever the table's size
// or statistics.
var getManySQL = `SELECT ` + qualified("k") + `
	FROM idempotency_keys k
	JOIN unnest(@merchants::text[], @keys::text[]) AS i(merchant_id, idempotency_key)
	  ON k.merchant_id = i.merchant_id AND k.idempotency_key = i.idempotency_key`

// GetMany returns the records of the keys that exist, once each, in no
// particular order; keys without a row are simply absent. It takes one round
// trip.
func (s *Store) GetMany(ctx context.Context, refs []ledger.KeyRef) ([]ledger.Record, error) {
	return sendQueued(ctx, s, "get keys", func(b *pg.Batch) func() []ledger.Record { return s.QueueGetMany(b, refs) })
}

// sendQueued sends, in one round trip, what queue puts on a batch, and
// returns what its reader gives once the batch is closed.
func sendQueued[T any](ctx context.Context, s *Store, what string, queue func(*pg.Batch) func() T) (T, error) {
	var out T
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		b := pg.NewBatch()
		got := queue(b)
		if err := s.db.Send(ctx, b); err != nil {
			return err
		}
		out = got()
		return nil
	})
	if err != nil {
		var zero T
		return zero, interpretError(what, err)
	}
	return out, nil
}

// QueueGetMany queues GetMany's read of refs on b, for a store that sends
// it in one round trip with statements of its own (the gateway's batched
// intake), and returns the function that gives its records once b is sent
// without error. b must be sent on this store's database.
func (s *Store) QueueGetMany(b *pg.Batch, refs []ledger.KeyRef) func() []ledger.Record {
	seen := make(map[ledger.KeyRef]bool, len(refs))
	uniq := make([]ledger.KeyRef, 0, len(refs))
	for _, r := range refs {
		if !seen[r] {
			seen[r] = true
			uniq = append(uniq, r)
		}
	}
	out := make([]ledger.Record, 0, len(uniq))
	if len(uniq) == 0 {
		return func() []ledger.Record { return out }
	}
	for start := 0; start < len(uniq); start += lookupBatch {
		merchants, keys := refColumns(uniq[start:min(start+lookupBatch, len(uniq))])
		b.Query(getManySQL, func(rows pgx.Rows) error {
			for rows.Next() {
				rec, err := scanRecord(rows)
				if err != nil {
					return err
				}
				out = append(out, rec)
			}
			return rows.Err()
		}, pgx.NamedArgs{"merchants": merchants, "keys": keys})
	}
	return func() []ledger.Record { return out }
}
