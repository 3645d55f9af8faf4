package dedup_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
)

// byteKeyColumns are the text columns that the hot path's indexes and
// sorts order by, by table (migration 00015).
var byteKeyColumns = map[string][]string{
	"idempotency_keys": {"merchant_id", "idempotency_key"},
	"pending_keys":     {"merchant_id", "idempotency_key"},
	"payments":         {"merchant_id", "idempotency_key", "charge_id"},
	"gateway_intake":   {"merchant_id", "idempotency_key"},
	"http_idempotency": {"scope", "idempotency_key"},
}

// keyCollation is the collation of one key column, in a relation or in one
// of its indexes.
type keyCollation struct {
	index     bool
	name      string // relation.column
	collation string
}

// collations returns the collation of each of columns in every relation of
// table's partition tree (the table itself when it has none), and the
// collation each index of those relations uses for each of them.
func collations(t *testing.T, pool *pgxpool.Pool, table string, columns []string) []keyCollation {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
WITH rels AS (
    SELECT relid FROM pg_partition_tree(to_regclass($1))
    UNION SELECT to_regclass($1) -- a table that is not partitioned has no tree
)
SELECT false, c.relname || '.' || a.attname, coll.collname
FROM rels r JOIN pg_class c ON c.oid = r.relid
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = ANY($2) AND NOT a.attisdropped
JOIN pg_collation coll ON coll.oid = a.attcollation
UNION ALL
SELECT true, ic.relname || '.' || a.attname, coll.collname
FROM rels r JOIN pg_index i ON i.indrelid = r.relid
JOIN pg_class ic ON ic.oid = i.indexrelid
CROSS JOIN LATERAL generate_subscripts(i.indkey, 1) AS s(n)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[s.n] AND a.attname = ANY($2)
JOIN pg_collation coll ON coll.oid = i.indcollation[s.n]`, table, columns)
	if err != nil {
		t.Fatal(err)
	}
	var out []keyCollation
	for rows.Next() {
		var c keyCollation
		if err := rows.Scan(&c.index, &c.name, &c.collation); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// assertCollation checks that every key column of every table, partition
// and index has collation want, and that the check saw each table's
// columns and at least one index on them.
func assertCollation(t *testing.T, pool *pgxpool.Pool, want string) {
	t.Helper()
	for table, cols := range byteKeyColumns {
		var columns, indexed int
		for _, c := range collations(t, pool, table, cols) {
			if c.index {
				indexed++
			} else {
				columns++
			}
			if c.collation != want {
				t.Errorf("%s: collation %q, want %q", c.name, c.collation, want)
			}
		}
		if columns < len(cols) || indexed == 0 {
			t.Errorf("%s: %d key columns and %d index columns found: the table or its indexes are missing", table, columns, indexed)
		}
	}
}

// TestKeyColumnsCompareBytewise checks that the key columns, in every
// partition of the keys table (the day partitions Purge creates too) and
// in every index on them, use the "C" collation: their comparisons are
// memcmp(), not strcoll() under the database's locale (migration 00015).
func TestKeyColumnsCompareBytewise(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The coming days' partitions, created as the reconciler's purge step
	// creates them, take the parent's collation.
	if _, err := b.store.Purge(b.ctx, 10); err != nil {
		t.Fatal(err)
	}
	var days int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_partition_tree('idempotency_keys')
		WHERE relid::text LIKE 'idempotency_keys_p%'`).Scan(&days); err != nil {
		t.Fatal(err)
	}
	if days == 0 {
		t.Fatal("Purge created no day partition")
	}
	assertCollation(t, b.pool, "C")
}

// relfilenodes returns the storage file of each table's heap (each
// partition's for the keys table), by relation name.
func relfilenodes(t *testing.T, pool *pgxpool.Pool) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for table := range byteKeyColumns {
		rows, err := pool.Query(context.Background(), `
SELECT c.relname, c.relfilenode::bigint FROM pg_class c
WHERE c.oid IN (SELECT relid FROM pg_partition_tree(to_regclass($1)) UNION SELECT to_regclass($1))
  AND c.relkind = 'r'`, table)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var name string
			var node int64
			if err := rows.Scan(&name, &node); err != nil {
				t.Fatal(err)
			}
			out[name] = node
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestKeyCollationMigration migrates a schema holding claimed, completed
// and pending keys from 00014 to 00015 and back, with a store open across
// it as a running worker's is: the heaps are not rewritten (the same
// files), every row stays, the unique constraints still hold, the store's
// claims and completions go on through the change of their statements'
// result types, and the columns end in "C" and then in the default again.
func TestKeyCollationMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, m := migrator(t, testenv.PostgresURL(t))
	downTo(t, m, 14)
	assertCollation(t, owner, "default")

	store, err := dedup.New(owner, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	reqs := make([]ledger.ClaimRequest, 20)
	for i := range reqs {
		reqs[i] = req("m_1", fmt.Sprintf("key-%02d", i), 1000)
	}
	res, err := store.ClaimBatch(ctx, "w1", lease, reqs)
	if err != nil {
		t.Fatal(err)
	}
	var items []ledger.CompleteItem
	for i, r := range res[:10] { // ten completed, ten left pending
		if r.Outcome != ledger.Claimed {
			t.Fatalf("claim %d: %v", i, r.Outcome)
		}
		items = append(items, ledger.CompleteItem{Lease: *r.Lease, Completion: charged(fmt.Sprintf("pi_%02d", i))})
	}
	if _, err := store.CompleteBatch(ctx, items); err != nil {
		t.Fatal(err)
	}
	counts := func() string {
		return fmt.Sprint(count(t, owner, `SELECT count(*) FROM idempotency_keys`),
			count(t, owner, `SELECT count(*) FROM pending_keys`),
			count(t, owner, `SELECT count(*) FROM payments`))
	}
	before, files := counts(), relfilenodes(t, owner)
	if before != "20 10 10" {
		t.Fatalf("keys, pending names, ledger rows = %s before the migration, want 20 10 10", before)
	}

	if _, err := m.UpTo(ctx, 15); err != nil {
		t.Fatal(err)
	}
	if v := appliedVersion(t, m); v != 15 {
		t.Fatalf("version %d after up, want 15", v)
	}
	assertCollation(t, owner, "C")
	if after := counts(); after != before {
		t.Errorf("keys, pending names, ledger rows = %s after the migration, want %s", after, before)
	}
	for rel, node := range relfilenodes(t, owner) {
		if files[rel] != node {
			t.Errorf("%s was rewritten (file %d → %d)", rel, files[rel], node)
		}
	}
	// The unique constraints hold over the rebuilt indexes, and the claim
	// finds the keys it wrote before the migration.
	if _, err := owner.Exec(ctx, `INSERT INTO pending_keys (merchant_id, idempotency_key) VALUES ('m_1', 'key-15')`); err == nil {
		t.Error("a second name for a pending key was inserted after the migration")
	}
	again, err := store.ClaimBatch(ctx, "w2", lease, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range again {
		want := ledger.Duplicate
		if i >= 10 {
			want = ledger.InFlight
		}
		if r.Outcome != want {
			t.Errorf("claim of key-%02d after the migration: %v, want %v", i, r.Outcome, want)
		}
	}
	// The leases taken before it complete after it, through the plans the
	// pool prepared before it (each connection's is stale once: pg.Retry
	// prepares it again).
	items = items[:0]
	for i, r := range res[10:] {
		items = append(items, ledger.CompleteItem{Lease: *r.Lease, Completion: charged(fmt.Sprintf("pi_%02d", 10+i))})
	}
	errs, err := store.CompleteBatch(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Errorf("complete key-%02d after the migration: %v", 10+i, e)
		}
	}
	before = "20 0 20"
	if after := counts(); after != before {
		t.Errorf("keys, pending names, ledger rows = %s after completing the rest, want %s", after, before)
	}

	if _, err := m.Down(ctx); err != nil {
		t.Fatal(err)
	}
	assertCollation(t, owner, "default")
	if after := counts(); after != before {
		t.Errorf("keys, pending names, ledger rows = %s after down, want %s", after, before)
	}
}
