package pgstore

import (
	"context"
	"errors"
	"time"

	"github.com/paydedup/paydedup/ledger"
)

// PauseFresh is how long a worker's pause row counts after its last
// write: a paused worker writes it every few seconds (consumer's
// PauseNoteEvery), so an older row is a worker that was killed paused.
const PauseFresh = 30 * time.Second

// NotePause records that the worker holder is paused for cause since
// since and tries again at retryAt (migration 00018's worker_pauses, and
// 00019's retry_at; a zero retryAt is stored NULL); an empty cause deletes
// its row.
// The worker calls it every few seconds while paused, and once more when
// it works again.
func (s *Store) NotePause(ctx context.Context, holder, cause string, since, retryAt time.Time) error {
	if holder == "" {
		return errors.New("note worker pause: empty holder")
	}
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		var err error
		if cause == "" {
			_, err = s.db.Pool.Exec(ctx, `DELETE FROM worker_pauses WHERE holder = $1`, holder)
			return err
		}
		var retry *time.Time
		if !retryAt.IsZero() {
			retry = &retryAt
		}
		_, err = s.db.Pool.Exec(ctx, `INSERT INTO worker_pauses (holder, cause, since, seen_at, retry_at)
			VALUES ($1, $2, $3, coalesce($4::timestamptz, now()), $5)
			ON CONFLICT (holder) DO UPDATE SET cause = excluded.cause, since = excluded.since, seen_at = excluded.seen_at, retry_at = excluded.retry_at`,
			holder, cause, since, s.db.Now(), retry)
		return err
	})
	if err != nil {
		return interpretError("note worker pause", err)
	}
	return nil
}

// WorkerPauses returns the pause the workers report now (rows written
// within PauseFresh); ok is false when none is paused.
func (s *Store) WorkerPauses(ctx context.Context) (p ledger.WorkerPause, ok bool, err error) {
	err = s.db.Retry(ctx, func(ctx context.Context) error {
		var retry *time.Time
		err := s.db.Pool.QueryRow(ctx, `SELECT cause, min(since), count(*), min(retry_at) FROM worker_pauses
			WHERE seen_at > coalesce($1::timestamptz, now()) - $2::interval
			GROUP BY cause ORDER BY count(*) DESC, min(since) LIMIT 1`, s.db.Now(), PauseFresh).Scan(&p.Cause, &p.Since, &p.Workers, &retry)
		if retry != nil {
			p.RetryAt = retry.UTC()
		}
		return err
	})
	if err != nil {
		err = interpretError("read worker pauses", err)
		if errors.Is(err, ledger.ErrNotFound) {
			return ledger.WorkerPause{}, false, nil
		}
		return ledger.WorkerPause{}, false, err
	}
	p.Since = p.Since.UTC()
	return p, true, nil
}
