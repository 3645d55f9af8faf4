package dedup

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// kindStatsSQL counts every kind's rows by status in one statement (one
// snapshot). Like statsSQL it scans the tables: an operator's query, not
// the hot path. A payment's key is an authorize's when its provider key
// is (ledger.ProviderKeyFor: pda_), and stuck when pending for longer
// than the grace; a refund, capture or cancel is stuck when pending past
// its lease. The last rows count the ledger's authorizations: still
// authorized, captured (succeeded with an amount received), canceled.
const kindStatsSQL = `
SELECT CASE WHEN provider_key LIKE 'pda\_%' THEN 'authorize' ELSE 'charge' END, status, count(*),
       count(*) FILTER (WHERE status = 'pending' AND pending_since < ` + dbNow + ` - @grace::interval)
  FROM idempotency_keys GROUP BY 1, 2
UNION ALL
SELECT 'refund', status, count(*), count(*) FILTER (WHERE status = 'pending' AND locked_until < ` + dbNow + `)
  FROM refunds GROUP BY 2
UNION ALL
SELECT kind, status, count(*), count(*) FILTER (WHERE status = 'pending' AND locked_until < ` + dbNow + `)
  FROM payment_ops GROUP BY 1, 2
UNION ALL
SELECT 'ledger', CASE WHEN status = 'succeeded' THEN 'captured' ELSE status END, count(*), 0
  FROM payments WHERE status IN ('authorized', 'canceled') OR amount_received IS NOT NULL GROUP BY 2`

// kindStatuses are the statuses of each kind's table, each shown even at 0.
var kindStatuses = map[string][]string{
	payment.KindCharge:    {string(ledger.StatusPending), string(ledger.StatusCompleted), string(ledger.StatusFailed)},
	payment.KindAuthorize: {string(ledger.StatusPending), string(ledger.StatusCompleted), string(ledger.StatusFailed)},
	payment.KindRefund: {ledger.RefundPending, ledger.RefundUnknown, ledger.RefundProcessing, ledger.RefundSucceeded,
		ledger.RefundFailed, ledger.RefundRefused},
	payment.KindCapture: {ledger.OpPending, ledger.OpUnknown, ledger.OpSucceeded, ledger.OpRefused},
	payment.KindCancel:  {ledger.OpPending, ledger.OpUnknown, ledger.OpSucceeded, ledger.OpRefused},
}

// KindStats counts the store's rows by kind and status as of the store's
// time: payments' keys (charges and authorizations), refunds, captures
// and cancels, and the ledger's authorizations (ledger.KindStats). A
// payment's key counts as stuck when it has been pending for longer than
// grace; an operation when it is pending past its lease.
func (s *Store) KindStats(ctx context.Context, grace time.Duration) (ledger.KindStats, error) {
	var st ledger.KindStats
	args := pgx.NamedArgs{"now": s.db.Now(), "grace": grace}
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		st = ledger.KindStats{Kinds: map[string]ledger.KindCounts{}, Authorized: map[string]int64{
			"authorized": 0, "captured": 0, ledger.PaymentCanceled: 0}}
		for kind, statuses := range kindStatuses {
			kc := ledger.KindCounts{ByStatus: map[string]int64{}}
			for _, s := range statuses {
				kc.ByStatus[s] = 0
			}
			st.Kinds[kind] = kc
		}
		rows, err := s.db.Pool.Query(ctx, kindStatsSQL, args)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var kind, status string
			var n, stuck int64
			if err := rows.Scan(&kind, &status, &n, &stuck); err != nil {
				return err
			}
			if kind == "ledger" {
				st.Authorized[status] = n
				continue
			}
			kc, ok := st.Kinds[kind]
			if !ok {
				kc = ledger.KindCounts{ByStatus: map[string]int64{}}
			}
			kc.ByStatus[status] = n
			kc.Stuck += stuck
			st.Kinds[kind] = kc
		}
		return rows.Err()
	})
	if err != nil {
		return ledger.KindStats{}, interpretError("read store stats by kind", err)
	}
	return st, nil
}

// unsettledOpsSQL counts the operations pending past their lease and those
// unknown, by kind: each count walks only the rows of the partial indexes
// refunds_unsettled and payment_ops_unsettled (status pending or unknown).
const unsettledOpsSQL = `
SELECT 'refund', count(*) FILTER (WHERE status = 'pending' AND locked_until < ` + dbNow + `), count(*) FILTER (WHERE status = 'unknown')
  FROM refunds WHERE status IN ('pending', 'unknown')
UNION ALL
SELECT k.kind, count(o.*) FILTER (WHERE o.status = 'pending' AND o.locked_until < ` + dbNow + `), count(o.*) FILTER (WHERE o.status = 'unknown')
  FROM (VALUES ('capture'), ('cancel')) AS k(kind)
  LEFT JOIN payment_ops o ON o.kind = k.kind AND o.status IN ('pending', 'unknown')
 GROUP BY k.kind`

// CountUnsettledOps reads ledger.UnsettledOps of every kind of operation
// (refund, capture, cancel) as of the store's time, in one statement.
func (s *Store) CountUnsettledOps(ctx context.Context) (map[string]ledger.UnsettledOps, error) {
	out := map[string]ledger.UnsettledOps{}
	err := s.db.Retry(ctx, func(ctx context.Context) error {
		clear(out)
		rows, err := s.db.Pool.Query(ctx, unsettledOpsSQL, pgx.NamedArgs{"now": s.db.Now()})
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var kind string
			var c ledger.UnsettledOps
			if err := rows.Scan(&kind, &c.Stuck, &c.Unknown); err != nil {
				return err
			}
			out[kind] = c
		}
		return rows.Err()
	})
	if err != nil {
		return nil, interpretError("count unsettled operations", err)
	}
	return out, nil
}
