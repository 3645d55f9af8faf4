package pgstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// The batched intake: the gateway takes in a whole batch of
// concurrent POSTs with a few statements instead of a few per request. Both
// acquire statements take rows over under the same rule
// (acquireIntakeConflict).

// AcquireIntakes tries to make the caller the publisher of each of a batch
// of requests with distinct (merchant, key), for lease; each row is kept
// for retention. Only IntakeAcquired lets the caller publish; it must then
// mark the row published (IntakesPublished) or give it up (AbandonIntake).
// One statement takes in every key it can and reads the rows it could not
// take over; only a row that a concurrent batch committed while it ran is
// read with one more. results[i] answers reqs[i]. An error fails the whole
// batch: nothing was acquired by it that the caller must give up (the
// statement is atomic).
func (s *Store) AcquireIntakes(ctx context.Context, reqs []ledger.ClaimRequest, lease, retention time.Duration) ([]ledger.IntakeResult, error) {
	seen, err := checkIntakeBatch(reqs, lease, retention)
	if err != nil {
		return nil, fmt.Errorf("acquire intakes: %w", err)
	}
	results := make([]ledger.IntakeResult, len(reqs))
	todo := reqs
	// A row purged between the two statements is simply retried.
	for range 3 {
		args := intakeArgs(todo, lease, retention)
		args["now"] = s.db.Now()
		acquired, met, err := s.acquireOrRead(ctx, acquireOrReadIntakesSQL, args)
		if err != nil {
			return nil, interpretError("acquire intakes", err)
		}
		var rest []ledger.ClaimRequest
		for _, r := range todo {
			k := rowKey{r.MerchantID, r.IdempotencyKey}
			if in, ok := acquired[k]; ok {
				results[seen[k]] = ledger.IntakeResult{Outcome: ledger.IntakeAcquired, Intake: in}
			} else if in, ok := met[k]; ok {
				results[seen[k]] = ledger.IntakeResult{Outcome: heldOutcome(in, r.RequestHash), Intake: in}
			} else {
				rest = append(rest, r)
			}
		}
		if len(rest) == 0 {
			return results, nil
		}
		// Rows committed by a concurrent batch while the statement ran.
		found, err := s.GetIntakes(ctx, rest)
		if err != nil {
			return nil, fmt.Errorf("acquire intakes: %w", err)
		}
		todo = todo[:0:0]
		for _, r := range rest {
			in, ok := found[ledger.KeyRef{MerchantID: r.MerchantID, IdempotencyKey: r.IdempotencyKey}]
			if !ok {
				todo = append(todo, r)
				continue
			}
			results[seen[rowKey{r.MerchantID, r.IdempotencyKey}]] = ledger.IntakeResult{Outcome: heldOutcome(in, r.RequestHash), Intake: in}
		}
		if len(todo) == 0 {
			return results, nil
		}
	}
	return nil, fmt.Errorf("acquire intakes: %w: rows kept disappearing", ledger.ErrUnavailable)
}

// AcquireNewIntakes is AcquireIntakes for the requests that nothing but
// their intake row can decide, in one round trip: those whose API key
// (apiKeys[i], apikey.Hash, is the key reqs[i] came with) is active for
// their merchant and whose key has neither a record nor a ledger row. The
// others are IntakeReadFirst and untouched, as is a request whose row a
// concurrent batch committed while the statement ran: the caller decides
// them by their reads (ReadBatch) and AcquireIntakes. Every other outcome
// is AcquireIntakes' own, and each one says the API key was active.
//
// It is the batched intake's first statement: for a batch of new
// payments, the reads that would find nothing are not made, and the
// acquisition is its only round trip before the publish.
func (s *Store) AcquireNewIntakes(ctx context.Context, reqs []ledger.ClaimRequest, apiKeys [][]byte, lease, retention time.Duration) ([]ledger.IntakeResult, error) {
	if len(apiKeys) != len(reqs) {
		return nil, fmt.Errorf("acquire new intakes: %d API keys for %d requests", len(apiKeys), len(reqs))
	}
	if _, err := checkIntakeBatch(reqs, lease, retention); err != nil {
		return nil, fmt.Errorf("acquire new intakes: %w", err)
	}
	args := intakeArgs(reqs, lease, retention)
	args["now"], args["api_keys"] = s.db.Now(), apiKeys
	acquired, met, err := s.acquireOrRead(ctx, acquireNewIntakesSQL, args)
	if err != nil {
		return nil, interpretError("acquire new intakes", err)
	}
	results := make([]ledger.IntakeResult, len(reqs))
	for i, r := range reqs {
		k := rowKey{r.MerchantID, r.IdempotencyKey}
		if in, ok := acquired[k]; ok {
			results[i] = ledger.IntakeResult{Outcome: ledger.IntakeAcquired, Intake: in}
		} else if in, ok := met[k]; ok {
			results[i] = ledger.IntakeResult{Outcome: heldOutcome(in, r.RequestHash), Intake: in}
		} else {
			results[i] = ledger.IntakeResult{Outcome: ledger.IntakeReadFirst}
		}
	}
	return results, nil
}

// checkIntakeBatch validates a batch of requests to take in and returns
// the index of each (merchant, key): they must be distinct.
func checkIntakeBatch(reqs []ledger.ClaimRequest, lease, retention time.Duration) (map[rowKey]int, error) {
	if lease <= 0 || retention <= lease {
		return nil, fmt.Errorf("need 0 < lease (%v) < retention (%v)", lease, retention)
	}
	seen := make(map[rowKey]int, len(reqs))
	for i, r := range reqs {
		if err := validateIntake(r); err != nil {
			return nil, err
		}
		k := rowKey{r.MerchantID, r.IdempotencyKey}
		if _, dup := seen[k]; dup {
			return nil, fmt.Errorf("key %s/%s twice in one batch", r.MerchantID, r.IdempotencyKey)
		}
		seen[k] = i
	}
	return seen, nil
}

// validateIntake checks one request to take in: a payment's is a claim
// request (ledger.ClaimRequest.Validate); an operation on a payment
// (refund, capture, cancel), which the worker claims
// elsewhere, has its key, its fingerprint, no currency and an amount that
// may be 0 (the rest, the whole: migration 00030).
func validateIntake(r ledger.ClaimRequest) error {
	if r.Kind != payment.KindRefund && r.Kind != payment.KindCapture && r.Kind != payment.KindCancel {
		return r.Validate()
	}
	if err := payment.ValidateMerchant(r.MerchantID); err != nil {
		return err
	}
	if err := payment.ValidateKey(r.IdempotencyKey); err != nil {
		return err
	}
	switch {
	case len(r.RequestHash) != sha256.Size:
		return &payment.ValidationError{Reason: payment.ReasonMalformedJSON, Field: "request_hash", Msg: "must be a SHA-256 digest"}
	case r.Amount < 0:
		return &payment.ValidationError{Reason: payment.ReasonInvalidAmount, Field: "amount", Msg: "must not be negative"}
	case r.Currency != "":
		return &payment.ValidationError{Reason: payment.ReasonInvalidCurrency, Field: "currency", Msg: "an operation's intake has none"}
	}
	return nil
}

// intakeArgs are the arguments of an acquisition of reqs (intakeRequests),
// but for now.
func intakeArgs(reqs []ledger.ClaimRequest, lease, retention time.Duration) pgx.NamedArgs {
	n := len(reqs)
	merchants, keys := make([]string, n), make([]string, n)
	hashes, amounts, currencies, kinds := make([][]byte, n), make([]int64, n), make([]string, n), make([]string, n)
	for i, r := range reqs {
		merchants[i], keys[i], hashes[i], amounts[i], currencies[i] = r.MerchantID, r.IdempotencyKey, r.RequestHash, r.Amount, r.Currency
		if r.Kind == payment.KindRefund || r.Kind == payment.KindCapture || r.Kind == payment.KindCancel {
			kinds[i] = r.Kind // an operation's, shown on its own route only
		}
	}
	return pgx.NamedArgs{"merchants": merchants, "keys": keys, "hashes": hashes, "amounts": amounts,
		"currencies": currencies, "kinds": kinds, "lease": lease, "retention": retention}
}

// acquireOrRead runs an acquireOrRead statement under pinPlans, in one
// round trip, and returns the rows it acquired and the rows it met.
func (s *Store) acquireOrRead(ctx context.Context, sql string, args pgx.NamedArgs) (acquired, met map[rowKey]ledger.Intake, err error) {
	acquired, met = make(map[rowKey]ledger.Intake), make(map[rowKey]ledger.Intake)
	err = s.db.Retry(ctx, func(ctx context.Context) error {
		clear(acquired)
		clear(met)
		b := &pgx.Batch{}
		b.Queue(pinPlans)
		b.Queue(sql, args).Query(func(rows pgx.Rows) error {
			var took bool
			sc := newIntakeScanner(&took)
			for rows.Next() {
				in, err := sc.scan(rows)
				if err != nil {
					return err
				}
				if k := (rowKey{in.MerchantID, in.IdempotencyKey}); took {
					acquired[k] = in
				} else {
					met[k] = in
				}
			}
			return rows.Err()
		})
		return s.db.Pool.SendBatch(ctx, b).Close()
	})
	return acquired, met, err
}

// heldOutcome is what a row the caller could not take over means for a
// request with fingerprint hash.
func heldOutcome(in ledger.Intake, hash []byte) ledger.IntakeOutcome {
	switch {
	case !bytes.Equal(in.RequestHash, hash):
		return ledger.IntakeMismatch
	case in.DeadLettered():
		return ledger.IntakeDeadLettered
	default:
		return ledger.IntakeHeld
	}
}

// GetIntakes returns the guard rows of the requests' keys that have one.
func (s *Store) GetIntakes(ctx context.Context, reqs []ledger.ClaimRequest) (map[ledger.KeyRef]ledger.Intake, error) {
	merchants, keys := make([]string, len(reqs)), make([]string, len(reqs))
	for i, r := range reqs {
		merchants[i], keys[i] = r.MerchantID, r.IdempotencyKey
	}
	out := make(map[ledger.KeyRef]ledger.Intake, len(reqs))
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		clear(out)
		return s.eachIntake(ctx, `SELECT `+intakeColumns+` FROM gateway_intake
			WHERE (merchant_id, idempotency_key) IN (SELECT * FROM unnest(@merchants::text[], @keys::text[]))`,
			pgx.NamedArgs{"merchants": merchants, "keys": keys}, func(in ledger.Intake) {
				out[ledger.KeyRef{MerchantID: in.MerchantID, IdempotencyKey: in.IdempotencyKey}] = in
			})
	})
	if err != nil {
		return nil, interpretError("get intakes", err)
	}
	return out, nil
}

// eachIntake runs a statement over a batch of keys under pinPlans, in one
// round trip, and calls each for every intake row it returns.
func (s *Store) eachIntake(ctx context.Context, sql string, args pgx.NamedArgs, each func(ledger.Intake)) error {
	b := &pgx.Batch{}
	b.Queue(pinPlans)
	b.Queue(sql, args).Query(func(rows pgx.Rows) error {
		sc := newIntakeScanner()
		for rows.Next() {
			in, err := sc.scan(rows)
			if err != nil {
				return err
			}
			each(in)
		}
		return rows.Err()
	})
	return s.db.Pool.SendBatch(ctx, b).Close()
}

// IntakesPublished is IntakePublished for a batch, in one statement; it
// returns, in the order given, whether each row was still held by its
// attempt (false: another request took it over, as ledger.ErrLeaseLost
// from IntakePublished).
func (s *Store) IntakesPublished(ctx context.Context, pubs []ledger.Published, holdFor time.Duration) ([]bool, error) {
	n := len(pubs)
	merchants, keys := make([]string, n), make([]string, n)
	attempts, seqs := make([]int32, n), make([]int64, n)
	for i, p := range pubs {
		if p.Seq == 0 || p.Seq > math.MaxInt64 {
			return nil, fmt.Errorf("mark intakes published: invalid stream sequence %d", p.Seq)
		}
		merchants[i], keys[i], attempts[i], seqs[i] = p.Intake.MerchantID, p.Intake.IdempotencyKey, int32(p.Intake.Attempt), int64(p.Seq)
	}
	marked := make(map[rowKey]bool, n)
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		clear(marked)
		// Pipelined after a setting that makes this one transaction commit
		// without waiting for its WAL flush: a crash may lose the mark, and
		// a lost mark is what a failed IntakePublished already is (a retry
		// after the publish lease publishes again; the worker's claim makes
		// the copy harmless). The request does not wait for a second fsync.
		// The plan is pinned to a probe per key (pinPlans).
		b := &pgx.Batch{}
		b.Queue(pinPlans + `, set_config('synchronous_commit', 'off', true)`)
		b.Queue(`UPDATE gateway_intake g SET published_at = `+dbNow+`,
				locked_until = `+dbNow+` + @hold::interval, stream_seq = i.seq,
				dead_letter_reason = CASE WHEN g.stream_seq = i.seq THEN g.dead_letter_reason END,
				dead_letter_error = CASE WHEN g.stream_seq = i.seq THEN g.dead_letter_error END,
				dead_lettered_at = CASE WHEN g.stream_seq = i.seq THEN g.dead_lettered_at END
			FROM (SELECT * FROM unnest(@merchants::text[], @keys::text[], @attempts::int[], @seqs::bigint[])
			      AS u(merchant_id, idempotency_key, attempt, seq)
			      ORDER BY merchant_id COLLATE "C", idempotency_key COLLATE "C") AS i
			WHERE g.merchant_id = i.merchant_id AND g.idempotency_key = i.idempotency_key AND g.attempt = i.attempt
			RETURNING g.merchant_id, g.idempotency_key`,
			pgx.NamedArgs{"merchants": merchants, "keys": keys, "attempts": attempts, "seqs": seqs, "now": s.db.Now(), "hold": holdFor})
		br := s.db.Pool.SendBatch(ctx, b)
		defer br.Close()
		if _, err := br.Exec(); err != nil {
			return err
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		for rows.Next() {
			var k rowKey
			if err := rows.Scan(&k.merchant, &k.key); err != nil {
				rows.Close()
				return err
			}
			marked[k] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		return br.Close()
	})
	if err != nil {
		return nil, interpretError("mark intakes published", err)
	}
	out := make([]bool, n)
	for i, p := range pubs {
		out[i] = marked[rowKey{p.Intake.MerchantID, p.Intake.IdempotencyKey}]
	}
	return out, nil
}

// queueActiveAPIKeys queues on b the read of which of the given key hashes
// (apikey.Hash) belong to an active key, and the merchant of each, and
// returns the function that gives its answer once b is sent. It runs in
// every batch's reads, so that a key revoked a moment ago is refused by
// the next batch whatever a cache still says.
func queueActiveAPIKeys(b *pg.Batch, hashes [][]byte) func() map[string]string {
	out := make(map[string]string, len(hashes))
	b.Query(`SELECT key_hash, merchant_id FROM api_keys
		WHERE key_hash = ANY($1::bytea[]) AND revoked_at IS NULL`, func(rows pgx.Rows) error {
		for rows.Next() {
			var h []byte
			var m string
			if err := rows.Scan(&h, &m); err != nil {
				return err
			}
			out[string(h)] = m
		}
		return rows.Err()
	}, hashes)
	return func() map[string]string { return out }
}

// RecordReads is what ReadBatch reads of the worker's records
// (*dedup.Store), queued on its batch.
type RecordReads interface {
	QueueGetMany(b *pg.Batch, refs []ledger.KeyRef) func() []ledger.Record
	QueuePaymentsFor(b *pg.Batch, refs []ledger.KeyRef) func() []ledger.Payment
}

// ReadBatch reads, in one round trip (one pipelined batch), which of hashes
// are active API keys and the records and ledger rows of refs, the latter
// from the store's Records (Config.Records).
func (s *Store) ReadBatch(ctx context.Context, hashes [][]byte, refs []ledger.KeyRef) (ledger.BatchReads, error) {
	records := s.records
	if records == nil {
		return ledger.BatchReads{}, errors.New("read batch: the gateway store has no Records (Config.Records)")
	}
	var out ledger.BatchReads
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		b := pg.NewBatch() // pinned: every read below probes its index per key
		pays := records.QueuePaymentsFor(b, refs)
		recs := records.QueueGetMany(b, refs)
		active := queueActiveAPIKeys(b, hashes)
		if err := s.db.Send(ctx, b); err != nil {
			return err
		}
		out = ledger.BatchReads{Active: active(), Records: recs(), Payments: pays()}
		return nil
	})
	if err != nil {
		return ledger.BatchReads{}, interpretError("read API keys, records and ledger", err)
	}
	return out, nil
}
