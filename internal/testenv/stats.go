package testenv

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// OneConn is a pool of one connection on pool's database and schema, and
// that connection's backend pid: statistics and CPU read through it are
// the backend's that ran the test's statements. Closed at the test's end.
func OneConn(t testing.TB, pool *pgxpool.Pool) (*pgxpool.Pool, int32) {
	t.Helper()
	cfg := pool.Config().Copy()
	cfg.MaxConns, cfg.MinConns = 1, 0
	one, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(one.Close)
	var pid int32
	if err := one.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return one, pid
}

// Updates flushes the statistics of pool's backend (a OneConn pool) and
// returns how many rows of table, or of its partitions, were updated, and
// how many of those were HOT updates (pg_stat_user_tables).
func Updates(t testing.TB, pool *pgxpool.Pool, table string) (n, hot int64) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0) FROM pg_stat_user_tables
		WHERE relid = $1::regclass OR relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = $1::regclass)`, table).Scan(&n, &hot); err != nil {
		t.Fatal(err)
	}
	return n, hot
}
