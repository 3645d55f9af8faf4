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

// TableReads flushes the statistics of pool's backend (a OneConn pool) and
// returns, for each of tables in the current schema, how many rows were
// read by sequential scans and how many through its indexes
// (pg_stat_user_tables, pg_stat_user_indexes). A partition's reads count
// as its table's.
func TableReads(t testing.TB, ctx context.Context, pool *pgxpool.Pool, tables ...string) map[string][2]int64 {
	t.Helper()
	if _, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
		t.Fatal(err)
	}
	out := map[string][2]int64{}
	rows, err := pool.Query(ctx, `SELECT coalesce(p.inhparent::regclass::text, t.relname), sum(t.seq_tup_read),
		    sum((SELECT coalesce(sum(i.idx_tup_read), 0) FROM pg_stat_user_indexes i WHERE i.relid = t.relid))
		FROM pg_stat_user_tables t LEFT JOIN pg_inherits p ON p.inhrelid = t.relid
		WHERE t.schemaname = current_schema()
		  AND coalesce(p.inhparent::regclass::text, t.relname) = ANY($1)
		GROUP BY 1`, tables)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var seq, idx int64
		if err := rows.Scan(&name, &seq, &idx); err != nil {
			t.Fatal(err)
		}
		out[name] = [2]int64{seq, idx}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
