package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/ledger"
)

const intakeColumns = `merchant_id, idempotency_key, request_hash, amount, currency, attempt, locked_until,
	published_at, created_at, expires_at, stream_seq, dead_letter_reason, dead_letter_error, dead_lettered_at,
	operator_reason, operator_error, operator_at`

// scanIntake scans one row of intakeColumns.
func scanIntake(row pgx.Row) (ledger.Intake, error) { return newIntakeScanner().scan(row) }

// intakeScanner holds the destinations of intakeColumns (then any extra
// ones), so that a statement reading many rows makes them once rather than
// once per row, as dedup's recordScanner does; the nullable columns are
// scanned in place rather than through pointers, one allocation each.
type intakeScanner struct {
	dest                        []any
	in                          ledger.Intake
	attempt                     int32
	published, deadAt, opAt     pgtype.Timestamptz
	seq                         pgtype.Int8
	deadReason, dlqErr          pgtype.Text
	operatorReason, operatorErr pgtype.Text
}

func newIntakeScanner(extra ...any) *intakeScanner {
	s := &intakeScanner{}
	in := &s.in
	s.dest = append([]any{&in.MerchantID, &in.IdempotencyKey, &in.RequestHash, &in.Amount, &in.Currency, &s.attempt,
		&in.LockedUntil, &s.published, &in.CreatedAt, &in.ExpiresAt, &s.seq, &s.deadReason, &s.dlqErr, &s.deadAt,
		&s.operatorReason, &s.operatorErr, &s.opAt}, extra...)
	return s
}

// scan reads one row. Every destination is written by each Scan (NULL
// included), and the Intake returned is a copy: what it holds (strings,
// new byte slices) is the row's own.
func (s *intakeScanner) scan(row pgx.Row) (ledger.Intake, error) {
	if err := row.Scan(s.dest...); err != nil {
		return ledger.Intake{}, err
	}
	in := s.in
	in.Attempt = int(s.attempt)
	var err error
	if in.PublishedAt, err = pg.Finite(s.published); err != nil {
		return ledger.Intake{}, err
	}
	if in.DeadLetteredAt, err = pg.Finite(s.deadAt); err != nil {
		return ledger.Intake{}, err
	}
	if in.OperatorAt, err = pg.Finite(s.opAt); err != nil {
		return ledger.Intake{}, err
	}
	in.OperatorReason, in.OperatorError = s.operatorReason.String, s.operatorErr.String
	if s.seq.Valid {
		in.StreamSeq = uint64(s.seq.Int64)
	}
	in.DeadLetterReason, in.DeadLetterError = s.deadReason.String, s.dlqErr.String
	return in, nil
}

// acquireIntakesSQL inserts the guard rows of a batch of distinct keys, or
// takes each over when it expired (any fingerprint), or when its lock
// passed and it is not terminal, with the same fingerprint only: a row
// binds its key to the first payload that may have been published under
// it, marked published or not (its publisher died, its PubAck or its mark
// was lost), until it expires or a refusal abandons it (AbandonIntake). A
// row taken over afresh forgets its publish and its dead letter.
// Concurrent callers serialise on each row: exactly one gets it back. The
// keys are taken in key order so that concurrent batches lock rows in the
// same order: byte order, the primary key's (migration 00015), whatever
// the database's default collation (a release sorting by another order
// beside this one can deadlock with it: PostgreSQL breaks the deadlock and
// the batch is retried, as any deadlock is).
const acquireIntakesSQL = `
INSERT INTO gateway_intake AS g (merchant_id, idempotency_key, request_hash, amount, currency, kind, attempt,
    locked_until, created_at, expires_at)
SELECT i.merchant_id, i.idempotency_key, i.request_hash, i.amount, i.currency, nullif(i.kind, ''), 1,
    ` + dbNow + ` + @lease::interval, ` + dbNow + `, ` + dbNow + ` + @retention::interval
FROM ` + intakeRequests + `
ORDER BY i.merchant_id COLLATE "C", i.idempotency_key COLLATE "C"
` + acquireIntakeConflict

// intakeRequests is the batch of requests the acquisition takes in, as the
// relation i.
const intakeRequests = `unnest(@merchants::text[], @keys::text[], @hashes::bytea[], @amounts::bigint[], @currencies::text[], @kinds::text[])
    AS i(merchant_id, idempotency_key, request_hash, amount, currency, kind)`

// acquireOrReadIntakesSQL is acquireIntakesSQL followed by the rows of the
// keys it did not take over, in one statement: each row with whether this
// statement acquired it. The read shares the statement's snapshot, so a
// row that a concurrent batch committed after the statement began (the
// insert waited for it) is not in it; the caller reads those again.
var acquireOrReadIntakesSQL = acquireOrRead("", acquireIntakesSQL,
	`unnest(@merchants::text[], @keys::text[]) AS u(merchant_id, idempotency_key)`)

// acquireNewIntakesSQL is acquireOrReadIntakesSQL for the requests whose
// API key (@api_keys, apikey.Hash, one per request) is active for their
// merchant and whose key has neither a record nor a ledger row
// (dedup.UnknownKeySQL), all in the statement's snapshot; the others are
// neither taken in nor read. A request it acquires is one that the reads
// of its API key, record and ledger row would have left to the
// acquisition.
var acquireNewIntakesSQL = acquireOrRead(`new AS MATERIALIZED (
    SELECT i.* FROM unnest(@merchants::text[], @keys::text[], @hashes::bytea[], @amounts::bigint[], @currencies::text[], @kinds::text[],
            @api_keys::bytea[])
        AS i(merchant_id, idempotency_key, request_hash, amount, currency, kind, api_key)
    WHERE EXISTS (SELECT FROM api_keys a
            WHERE a.key_hash = i.api_key AND a.merchant_id = i.merchant_id AND a.revoked_at IS NULL)
      AND `+dedup.UnknownKeySQL("i")+`),
`, strings.Replace(acquireIntakesSQL, intakeRequests, `new AS i`, 1), `new AS u`)

// acquireOrRead is the statement that runs acquire (after the common table
// expressions with, if any) and reads the rows of the keys of requests
// (the relation u) that it did not take over.
func acquireOrRead(with, acquire, requests string) string {
	return `
WITH ` + with + `acquired AS (` + acquire + `)
SELECT ` + intakeColumns + `, true FROM acquired
UNION ALL
SELECT ` + intakeColumns + `, false FROM gateway_intake
WHERE (merchant_id, idempotency_key) IN (
    SELECT u.merchant_id, u.idempotency_key FROM ` + requests + `
    WHERE NOT EXISTS (SELECT FROM acquired a WHERE a.merchant_id = u.merchant_id AND a.idempotency_key = u.idempotency_key))`
}

// acquireIntakeConflict is the takeover rule both acquire statements share
// (acquireIntakesSQL).
const acquireIntakeConflict = `ON CONFLICT (merchant_id, idempotency_key) DO UPDATE
SET request_hash = excluded.request_hash, amount = excluded.amount, currency = excluded.currency, kind = excluded.kind,
    attempt = g.attempt + 1, locked_until = excluded.locked_until,
    published_at = CASE WHEN g.expires_at <= ` + dbNow + ` THEN NULL ELSE g.published_at END,
    stream_seq = CASE WHEN g.expires_at <= ` + dbNow + ` OR g.published_at IS NULL THEN NULL ELSE g.stream_seq END,
    dead_letter_reason = CASE WHEN g.expires_at <= ` + dbNow + ` OR g.published_at IS NULL THEN NULL ELSE g.dead_letter_reason END,
    dead_letter_error = CASE WHEN g.expires_at <= ` + dbNow + ` OR g.published_at IS NULL THEN NULL ELSE g.dead_letter_error END,
    dead_lettered_at = CASE WHEN g.expires_at <= ` + dbNow + ` OR g.published_at IS NULL THEN NULL ELSE g.dead_lettered_at END,
    operator_reason = CASE WHEN g.expires_at <= ` + dbNow + ` THEN NULL ELSE g.operator_reason END,
    operator_error = CASE WHEN g.expires_at <= ` + dbNow + ` THEN NULL ELSE g.operator_error END,
    operator_at = CASE WHEN g.expires_at <= ` + dbNow + ` THEN NULL ELSE g.operator_at END,
    created_at = CASE WHEN g.expires_at <= ` + dbNow + ` THEN excluded.created_at ELSE g.created_at END,
    expires_at = excluded.expires_at
WHERE g.expires_at <= ` + dbNow + `
   OR (g.locked_until <= ` + dbNow + ` AND g.dead_lettered_at IS NULL AND g.request_hash = excluded.request_hash)
RETURNING ` + intakeColumns

// IntakeKind returns the kind of the operation (a refund, a capture or a
// cancel) whose guard row holds a key (migration 00031); "" for a
// payment's, or for an operation's taken in before that migration.
// ledger.ErrNotFound when the key has no guard row.
func (s *Store) IntakeKind(ctx context.Context, merchantID, key string) (string, error) {
	var kind string
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, `SELECT coalesce(kind, '') FROM gateway_intake
			WHERE merchant_id = $1 AND idempotency_key = $2`, merchantID, key).Scan(&kind)
	})
	if err != nil {
		return "", interpretError("get intake's kind", err)
	}
	return kind, nil
}

// GetIntake returns the guard row for a key, or ledger.ErrNotFound.
func (s *Store) GetIntake(ctx context.Context, merchantID, key string) (ledger.Intake, error) {
	var in ledger.Intake
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		var err error
		in, err = scanIntake(s.db.Pool.QueryRow(ctx, `SELECT `+intakeColumns+` FROM gateway_intake
			WHERE merchant_id = $1 AND idempotency_key = $2`, merchantID, key))
		return err
	})
	if err != nil {
		return ledger.Intake{}, interpretError("get intake", err)
	}
	return in, nil
}

// IntakePublished records that the command was published (PubAck received)
// as stream sequence seq, and holds the row for holdFor: until then a retry
// finding no idempotency record answers "in flight" instead of publishing
// again. A dead letter recorded before this call (the worker was faster
// than the gateway) is kept only if it is of this very sequence.
// ledger.ErrLeaseLost means another request took the row over; its publish
// stands.
func (s *Store) IntakePublished(ctx context.Context, in ledger.Intake, seq uint64, holdFor time.Duration) error {
	if seq == 0 || seq > math.MaxInt64 {
		return fmt.Errorf("mark intake published: invalid stream sequence %d", seq)
	}
	var one int
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, `UPDATE gateway_intake SET published_at = coalesce($4::timestamptz, now()),
				locked_until = coalesce($4::timestamptz, now()) + $5::interval, stream_seq = $6,
				dead_letter_reason = CASE WHEN stream_seq = $6 THEN dead_letter_reason END,
				dead_letter_error = CASE WHEN stream_seq = $6 THEN dead_letter_error END,
				dead_lettered_at = CASE WHEN stream_seq = $6 THEN dead_lettered_at END
			WHERE merchant_id = $1 AND idempotency_key = $2 AND attempt = $3 RETURNING 1`,
			in.MerchantID, in.IdempotencyKey, int32(in.Attempt), s.db.Now(), holdFor, int64(seq)).Scan(&one)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("mark intake published: %w", ledger.ErrLeaseLost)
	}
	return interpretError("mark intake published", err)
}

// AbandonIntake gives the row up after a publish the stream refused
// (provably nothing stored), so the client's retry may publish at once. A
// row that was never published is deleted: nothing was accepted under the
// key, so a corrected retry is new. A row published before (a refused
// republish) keeps its publish and only releases its lock.
// ledger.ErrLeaseLost means it was taken over already.
func (s *Store) AbandonIntake(ctx context.Context, in ledger.Intake) error {
	var one int
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, `WITH gone AS (
				DELETE FROM gateway_intake
				WHERE merchant_id = $1 AND idempotency_key = $2 AND attempt = $3 AND published_at IS NULL
				RETURNING 1
			), released AS (
				UPDATE gateway_intake SET locked_until = least(locked_until, coalesce($4::timestamptz, now()))
				WHERE merchant_id = $1 AND idempotency_key = $2 AND attempt = $3 AND published_at IS NOT NULL
				RETURNING 1
			)
			SELECT 1 FROM gone UNION ALL SELECT 1 FROM released`,
			in.MerchantID, in.IdempotencyKey, int32(in.Attempt), s.db.Now()).Scan(&one)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("abandon intake: %w", ledger.ErrLeaseLost)
	}
	return interpretError("abandon intake", err)
}

// ReleaseIntake ends the publish lease of a row whose publish has an
// unknown outcome (no PubAck: the command may be stored), keeping the row
// and its fingerprint: the client's retry with the same payload takes it
// over at once and publishes again under the same Nats-Msg-Id, and
// another payload is IntakeMismatch. ledger.ErrLeaseLost means it was
// taken over already.
func (s *Store) ReleaseIntake(ctx context.Context, in ledger.Intake) error {
	var one int
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, `UPDATE gateway_intake SET locked_until = least(locked_until, coalesce($4::timestamptz, now()))
			WHERE merchant_id = $1 AND idempotency_key = $2 AND attempt = $3 RETURNING 1`,
			in.MerchantID, in.IdempotencyKey, int32(in.Attempt), s.db.Now()).Scan(&one)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("release intake: %w", ledger.ErrLeaseLost)
	}
	return interpretError("release intake", err)
}

// MarkIntakeDeadLettered records that the worker dead-lettered the copy of
// (merchant, key) stored at stream sequence seq, with its reason and error
// text. Only the intake that published that very copy is marked: a command
// published straight on the queue, or another copy of the key, has no
// intake row with that sequence, and nothing happens (false, nil). An
// intake whose first publish has no recorded PubAck yet is marked with seq
// too; IntakePublished keeps the mark only if its PubAck has that seq. (A
// republish whose copy is dead-lettered before its PubAck is recorded is
// not marked: the retry finds the copy in the stream and answers 409.)
func (s *Store) MarkIntakeDeadLettered(ctx context.Context, merchantID, key string, seq uint64, reason, errText string) (bool, error) {
	if reason == "" {
		return false, errors.New("mark intake dead-lettered: empty reason")
	}
	if seq == 0 || seq > math.MaxInt64 {
		return false, nil
	}
	return s.markDeadLettered(ctx, merchantID, key, nil, seq, reason, errText)
}

// MarkOperationDeadLettered is MarkIntakeDeadLettered for a refund, a
// capture or a cancel the worker refused (the ledger's rules, or its
// input): it marks only the door's intake of that very operation, a row
// with no currency and the command's fingerprint. An operation's key may
// be a payment's too (published straight on the queue): a payment's
// intake, or another operation's, is never marked by its letter.
func (s *Store) MarkOperationDeadLettered(ctx context.Context, merchantID, key string, fingerprint []byte, seq uint64, reason, errText string) (bool, error) {
	if len(fingerprint) == 0 {
		return false, errors.New("mark operation's intake dead-lettered: no fingerprint")
	}
	if reason == "" {
		return false, errors.New("mark operation's intake dead-lettered: empty reason")
	}
	if seq == 0 || seq > math.MaxInt64 {
		return false, nil
	}
	return s.markDeadLettered(ctx, merchantID, key, fingerprint, seq, reason, errText)
}

// markDeadLettered runs markIntakeDeadLetteredSQL: fingerprint nil marks
// a payment's intake, else the operation's of that fingerprint.
func (s *Store) markDeadLettered(ctx context.Context, merchantID, key string, fingerprint []byte, seq uint64, reason, errText string) (bool, error) {
	errText = clipErrText(errText)
	var n int64
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, markIntakeDeadLetteredSQL,
			merchantID, key, int64(seq), reason, errText, s.db.Now(), fingerprint).Scan(&n)
	})
	if err != nil {
		return false, interpretError("mark intake dead-lettered", err)
	}
	return n > 0, nil
}

// intakeOfLetter matches the intake a letter may mark, its fingerprint
// the SQL parameter fp: a payment's (fp NULL: a row with a currency), or
// the operation's of that fingerprint (no currency: migration 00030).
func intakeOfLetter(fp string) string {
	return `(CASE WHEN ` + fp + `::bytea IS NULL THEN currency <> '' ELSE currency = '' AND request_hash = ` + fp + `::bytea END)`
}

// markIntakeDeadLetteredSQL marks the intake and, at commit, wakes the
// gateway requests waiting on the key (Prefer: wait) with the completion
// channel's payload: they re-read the key and answer the dead letter.
var markIntakeDeadLetteredSQL = `
WITH marked AS (
    UPDATE gateway_intake
    SET dead_letter_reason = $4, dead_letter_error = $5, dead_lettered_at = coalesce($6::timestamptz, now()), stream_seq = $3
    WHERE merchant_id = $1 AND idempotency_key = $2 AND dead_letter_reason IS NULL
      AND (stream_seq = $3 OR (stream_seq IS NULL AND published_at IS NULL)) AND ` + intakeOfLetter("$7") + `
    RETURNING merchant_id, idempotency_key
` + notifyMarkedSQL

// MarkIntakeForOperator records that the worker dead-lettered a copy of
// (merchant, key) for an operator (a reason a replay may still charge:
// provider_rejected, max_deliveries...), with its reason and error text,
// and wakes the requests waiting on the key. Unlike MarkIntakeDeadLettered
// it matches any copy of the key, the gateway's publish or an operator's
// replay: the letter says what the key's payment waits for, not that
// the gateway's publish is settled, and nothing final is derived from it
// (the gateway compares it with the record: Intake.WaitsForOperator). A
// key without an intake row (published straight on the queue), or with a
// final dead letter, is left alone (false, nil).
func (s *Store) MarkIntakeForOperator(ctx context.Context, merchantID, key string, reason, errText string) (bool, error) {
	if reason == "" {
		return false, errors.New("mark intake waiting for an operator: empty reason")
	}
	return s.markForOperator(ctx, merchantID, key, nil, reason, errText)
}

// MarkOperationForOperator is MarkIntakeForOperator for a refund, a
// capture or a cancel: only the door's intake of that very operation (no
// currency, the command's fingerprint) is marked, never a payment's or
// another operation's under the same key.
func (s *Store) MarkOperationForOperator(ctx context.Context, merchantID, key string, fingerprint []byte, reason, errText string) (bool, error) {
	if len(fingerprint) == 0 {
		return false, errors.New("mark operation's intake waiting for an operator: no fingerprint")
	}
	if reason == "" {
		return false, errors.New("mark operation's intake waiting for an operator: empty reason")
	}
	return s.markForOperator(ctx, merchantID, key, fingerprint, reason, errText)
}

// markForOperator runs markIntakeForOperatorSQL (fingerprint as
// markDeadLettered's).
func (s *Store) markForOperator(ctx context.Context, merchantID, key string, fingerprint []byte, reason, errText string) (bool, error) {
	errText = clipErrText(errText)
	var n int64
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, markIntakeForOperatorSQL, merchantID, key, reason, errText, s.db.Now(), fingerprint).Scan(&n)
	})
	if err != nil {
		return false, interpretError("mark intake waiting for an operator", err)
	}
	return n > 0, nil
}

// markIntakeForOperatorSQL is markIntakeDeadLetteredSQL for a letter that
// waits for an operator.
var markIntakeForOperatorSQL = `
WITH marked AS (
    UPDATE gateway_intake
    SET operator_reason = $3, operator_error = $4, operator_at = coalesce($5::timestamptz, now())
    WHERE merchant_id = $1 AND idempotency_key = $2 AND dead_letter_reason IS NULL AND expires_at > coalesce($5::timestamptz, now())
      AND ` + intakeOfLetter("$6") + `
    RETURNING merchant_id, idempotency_key
` + notifyMarkedSQL

// notifyMarkedSQL ends a statement whose CTE "marked" returns the intakes
// it marked: at commit, it wakes the gateway requests waiting on those keys
// (the completion channel's payload), and it returns how many it marked.
const notifyMarkedSQL = `
), notified AS (
    SELECT pg_notify('` + dedup.CompletedChannel + `', json_build_object('s', (SELECT n.nspname FROM pg_namespace n
               WHERE n.oid = (SELECT c.relnamespace FROM pg_class c WHERE c.oid = 'gateway_intake'::regclass)),
           'm', m.merchant_id, 'k', m.idempotency_key)::text)
    FROM marked m
)
SELECT count(*) FROM marked WHERE (SELECT count(*) FROM notified) >= 0`

// maxDeadLetterErrorLen bounds the stored dead-letter error text.
const maxDeadLetterErrorLen = 1024

// PurgeIntakes deletes up to limit expired guard rows and returns how many.
func (s *Store) PurgeIntakes(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("purge intakes: limit must be positive, got %d", limit)
	}
	var n int64
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		tag, err := s.db.Pool.Exec(ctx, `DELETE FROM gateway_intake AS g USING (
				SELECT merchant_id, idempotency_key FROM gateway_intake WHERE expires_at <= coalesce($1::timestamptz, now())
				ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED) AS s
			WHERE g.merchant_id = s.merchant_id AND g.idempotency_key = s.idempotency_key
			  AND g.expires_at <= coalesce($1::timestamptz, now())`,
			s.db.Now(), int32(limit))
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, interpretError("purge intakes", err)
	}
	return int(n), nil
}

// clipErrText bounds the error stored with an intake row (the status
// endpoint returns it), card numbers masked before the cut.
func clipErrText(s string) string {
	s, _ = redact.Cut(s, maxDeadLetterErrorLen)
	return strings.ToValidUTF8(s, "")
}
