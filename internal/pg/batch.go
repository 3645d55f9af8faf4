package pg

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// PinPlans turns off sequential scans and custom plans for the rest of a
// pipelined batch's implicit transaction: the only plans that stay cheap as
// the tables grow probe an index once per key, and left to itself the
// planner picks a hash join over a sequential scan of the whole table when
// its statistics are older than the table.
const PinPlans = `SELECT set_config('enable_seqscan', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)`

// Batch is statements that one or more stores queue and send in one round
// trip, a pipelined batch run as one implicit transaction. It is the seam
// through which a store queues its reads into another store's round trip
// (the gateway's batched intake reads the worker's records beside its own
// statements) without the driver in either store's API. A batch is pinned
// from its first statement (PinPlans), so the order in which stores queue
// on it does not matter.
type Batch struct{ b pgx.Batch }

// NewBatch returns an empty, pinned batch.
func NewBatch() *Batch {
	b := &Batch{}
	b.b.Queue(PinPlans)
	return b
}

// Query queues sql with args (positional, or one pgx.NamedArgs); each
// reads its rows when the batch is sent.
func (b *Batch) Query(sql string, each func(pgx.Rows) error, args ...any) {
	b.b.Queue(sql, args...).Query(each)
}

// Queued reports whether anything beyond the pin is queued.
func (b *Batch) Queued() bool { return b.b.Len() > 1 }

// Send sends b on d's pool and reads every result; nothing is sent when
// only the pin is queued.
func (d DB) Send(ctx context.Context, b *Batch) error {
	if !b.Queued() {
		return nil
	}
	return d.Pool.SendBatch(ctx, &b.b).Close()
}
