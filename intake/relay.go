package intake

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/payment"
)

// DefaultStatementTimeout bounds each of the relay's statements.
const DefaultStatementTimeout = 5 * time.Second

// Store is the intake's table as the workers read it: the relay's batches,
// their marks, the retention's purge and the backlog.
type Store struct {
	db pg.DB
}

// NewStore returns the intake store on pool (the worker's);
// timeout bounds each statement (DefaultStatementTimeout when zero).
func NewStore(pool *pgxpool.Pool, timeout time.Duration) (*Store, error) {
	db, err := pg.NewDB("intake store", pool, nil, timeout, DefaultStatementTimeout)
	if err != nil {
		return nil, err
	}
	return &Store{db: db}, nil
}

// Publisher publishes commands to the payments stream and reports, for
// each, its stream sequence once the stream acknowledged it or why not: a
// *payment.ValidationError in the error's chain means the stream will
// never take it (stream.CommandPublisher).
type Publisher interface {
	PublishCommands(ctx context.Context, cmds []*payment.Command) (seqs []uint64, errs []error)
}

// Source is the intake as a source of the workers' relay (outbox.Relay).
type Source struct {
	store  *Store
	pub    Publisher
	limits payment.Limits
}

// NewSource returns the relay of store's commands to pub; limits are the
// worker's, so that a command the worker would dead-letter is marked
// rejected here instead.
func NewSource(store *Store, pub Publisher, limits payment.Limits) (*Source, error) {
	if store == nil || pub == nil {
		return nil, errors.New("intake source: needs a store and a publisher")
	}
	return &Source{store: store, pub: pub, limits: limits}, nil
}

// Name names the source in the relay's logs.
func (*Source) Name() string { return "intake commands" }

// takeSQL locks up to $1 waiting commands no other relay holds, oldest
// first.
const takeSQL = `SELECT id, merchant_id, idempotency_key, body FROM intake_commands
WHERE relayed_at IS NULL AND rejected_at IS NULL
ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`

// markRelayedSQL marks commands relayed with their PubAck's sequence.
const markRelayedSQL = `UPDATE intake_commands c SET relayed_at = ` + pg.DBNow + `, stream_seq = u.seq
FROM unnest(@ids::bigint[], @seqs::bigint[]) AS u(id, seq)
WHERE c.id = u.id AND c.relayed_at IS NULL AND c.rejected_at IS NULL`

// markRejectedSQL marks commands the stream will never take, with the
// reason; a body holding card data is kept masked.
const markRejectedSQL = `UPDATE intake_commands c SET rejected_at = ` + pg.DBNow + `, reject_reason = u.reason,
    reject_error = u.error, body = u.body, merchant_id = u.merchant, idempotency_key = u.key
FROM unnest(@ids::bigint[], @reasons::text[], @errors::text[], @bodies::text[], @merchants::text[], @keys::text[])
    AS u(id, reason, error, body, merchant, key)
WHERE c.id = u.id AND c.relayed_at IS NULL AND c.rejected_at IS NULL`

// row is a waiting command as the relay took it.
type row struct {
	id            int64
	merchant, key string
	body          string
}

// Relay takes up to limit waiting commands, in one transaction that holds
// their row locks while it publishes (two relays never hold one command),
// publishes the valid ones, and marks each relayed with its stream
// sequence only once the stream acknowledged it. A command that is not
// valid (a row inserted by hand), or that the stream refuses for good, is
// marked rejected with its reason. A command without a PubAck stays
// waiting for the next pass, published again under the same Nats-Msg-Id
// (the stream's duplicate window stores it once); the error then says
// how many. It returns how many commands it marked.
func (s *Source) Relay(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("relay intake: limit must be positive, got %d", limit)
	}
	tx, err := s.store.db.Pool.Begin(ctx)
	if err != nil {
		return 0, interpret("relay intake", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := s.store.take(ctx, tx, limit)
	if err != nil || len(rows) == 0 {
		return 0, interpret("relay intake", err)
	}
	var (
		rej      rejected
		cmds     []*payment.Command
		sent     []int64
		relayIDs []int64
		seqs     []int64
	)
	for _, r := range rows {
		cmd, err := payment.Decode([]byte(r.body), payment.Envelope{SubjectMerchant: r.merchant, HeaderKey: r.key, HeaderKeySet: true}, s.limits)
		if err != nil {
			rej.add(r, err)
			continue
		}
		cmds = append(cmds, cmd)
		sent = append(sent, r.id)
	}
	var unacked error
	missing := 0
	if len(cmds) > 0 {
		got, errs := s.pub.PublishCommands(ctx, cmds)
		if len(got) != len(cmds) || len(errs) != len(cmds) {
			return 0, fmt.Errorf("relay intake: publish reported %d and %d commands of %d", len(got), len(errs), len(cmds))
		}
		byID := make(map[int64]row, len(rows))
		for _, r := range rows {
			byID[r.id] = r
		}
		for i, id := range sent {
			var verr *payment.ValidationError
			switch {
			case errs[i] == nil && got[i] > 0:
				relayIDs = append(relayIDs, id)
				seqs = append(seqs, int64(got[i]))
			case errors.As(errs[i], &verr):
				rej.add(byID[id], verr)
			default:
				missing++
				if unacked == nil {
					unacked = errs[i]
				}
			}
		}
	}
	qctx, cancel := context.WithTimeout(ctx, s.store.db.Timeout)
	defer cancel()
	n := 0
	if len(relayIDs) > 0 {
		tag, err := tx.Exec(qctx, markRelayedSQL, pgx.NamedArgs{"ids": relayIDs, "seqs": seqs, "now": s.store.db.Now()})
		if err != nil {
			return 0, interpret("relay intake: mark relayed", err)
		}
		n += int(tag.RowsAffected())
	}
	if len(rej.ids) > 0 {
		tag, err := tx.Exec(qctx, markRejectedSQL, pgx.NamedArgs{"ids": rej.ids, "reasons": rej.reasons,
			"errors": rej.errors, "bodies": rej.bodies, "merchants": rej.merchants, "keys": rej.keys, "now": s.store.db.Now()})
		if err != nil {
			return 0, interpret("relay intake: mark rejected", err)
		}
		n += int(tag.RowsAffected())
	}
	if n > 0 {
		if err := tx.Commit(qctx); err != nil {
			return 0, interpret("relay intake: commit", err)
		}
	}
	if missing > 0 {
		return n, fmt.Errorf("relay intake: %d of %d commands not acknowledged, left for the next pass: %w", missing, len(cmds), unacked)
	}
	return n, nil
}

// rejected collects the commands a pass marks rejected.
type rejected struct {
	ids                                      []int64
	reasons, errors, bodies, merchants, keys []string
}

func (r *rejected) add(w row, err error) {
	reason, msg := "invalid", err.Error()
	var verr *payment.ValidationError
	if errors.As(err, &verr) {
		reason = string(verr.Reason)
	}
	r.ids = append(r.ids, w.id)
	r.reasons = append(r.reasons, reason)
	r.errors = append(r.errors, redact.PANs(msg))
	r.bodies = append(r.bodies, redact.PANs(w.body))
	r.merchants = append(r.merchants, maskedColumn(w.merchant, w.id))
	r.keys = append(r.keys, maskedColumn(w.key, w.id))
}

// maskedColumn is a rejected row's merchant or key as it is kept: itself,
// or, when it holds what looks like a card number, masked and made unique
// by the row's id (the pair stays unique; nothing matches it again).
func maskedColumn(v string, id int64) string {
	if !redact.ContainsPAN(v) {
		return v
	}
	return redact.PANs(v) + ":rejected:" + strconv.FormatInt(id, 10)
}

func (s *Store) take(ctx context.Context, tx pgx.Tx, limit int) ([]row, error) {
	qctx, cancel := context.WithTimeout(ctx, s.db.Timeout)
	defer cancel()
	rows, err := tx.Query(qctx, takeSQL, int32(limit))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.id, &r.merchant, &r.key, &r.body); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Purge deletes up to limit commands relayed more than retention ago and
// returns how many. Waiting and rejected commands are never removed.
func (s *Source) Purge(ctx context.Context, retention time.Duration, limit int) (int, error) {
	if limit <= 0 || retention <= 0 {
		return 0, errors.New("purge intake: needs a positive retention and limit")
	}
	var n int64
	err := s.store.db.Retry(ctx, func(ctx context.Context) error {
		return s.store.db.Pool.QueryRow(ctx, `WITH gone AS (
			DELETE FROM intake_commands WHERE id IN (
				SELECT id FROM intake_commands WHERE relayed_at < `+pg.DBNow+` - @retention::interval
				ORDER BY relayed_at LIMIT @limit FOR UPDATE SKIP LOCKED)
			RETURNING 1)
			SELECT count(*) FROM gone`, pgx.NamedArgs{"now": s.store.db.Now(), "retention": retention, "limit": int32(limit)}).Scan(&n)
	})
	if err != nil {
		return 0, interpret("purge intake", err)
	}
	return int(n), nil
}

// Backlog is what the intake holds that the relay has not settled.
type Backlog struct {
	// Waiting counts the committed commands not yet published.
	Waiting int64
	// Oldest is when the oldest waiting command was inserted; zero when
	// none.
	Oldest time.Time
	// Rejected counts the commands the relay refused (kept until an
	// operator deletes them).
	Rejected int64
	// Now is the database's clock when it counted, to measure Oldest's age.
	Now time.Time
}

// Backlog counts the waiting and rejected commands and finds the oldest
// waiting one.
func (s *Store) Backlog(ctx context.Context) (Backlog, error) {
	var (
		b      Backlog
		oldest *time.Time
	)
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		return s.db.Pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM intake_commands WHERE relayed_at IS NULL AND rejected_at IS NULL),
			(SELECT created_at FROM intake_commands WHERE relayed_at IS NULL AND rejected_at IS NULL ORDER BY id LIMIT 1),
			(SELECT count(*) FROM intake_commands WHERE rejected_at IS NOT NULL),
			`+pg.DBNow, pgx.NamedArgs{"now": s.db.Now()}).Scan(&b.Waiting, &oldest, &b.Rejected, &b.Now)
	})
	if err != nil {
		return Backlog{}, interpret("count the intake's backlog", err)
	}
	if oldest != nil {
		b.Oldest = *oldest
	}
	return b, nil
}

// interpret maps pgx errors to the pg package's; pgx types do not leave
// the relay's side.
func interpret(op string, err error) error { return pg.Interpret(op, err, pg.Errors{}) }
