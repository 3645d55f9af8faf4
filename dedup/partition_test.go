package dedup_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
)

// day is a UTC day well after any day the migration created, so that the
// tests' keys land in day partitions that Purge creates (migration 00013).
var day = time.Date(2027, 3, 10, 0, 0, 0, 0, time.UTC)

func partitionExists(t *testing.T, b *bundle, name string) bool {
	t.Helper()
	var ok bool
	if err := b.pool.QueryRow(b.ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// waitInTrigger polls, with a deadline, until backend pid sleeps in a test
// trigger (pg_sleep): its statement has written its row and not committed.
func waitInTrigger(t *testing.T, b *bundle, pid int32, who string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var wait *string
		if err := b.pool.QueryRow(b.ctx, `SELECT wait_event FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&wait); err != nil {
			t.Fatal(err)
		}
		if wait != nil && *wait == "PgSleep" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never reached its write", who)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestClaimRaceAcrossDayBoundary races two claims of one key whose times
// fall on either side of midnight, so into two day partitions, whose unique
// indexes cannot see each other. The first claim is held inside its
// statement (a test trigger sleeps after its insert) while the second
// runs: the second must wait for the first's commit (the claim's advisory
// lock) and then find its row in the other day (the claim's lookup across
// partitions), and answer in flight. Without either guard both claims win
// and the key has two rows.
func TestClaimRaceAcrossDayBoundary(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.clock.Set(day.Add(12 * time.Hour))
	if _, err := b.store.Purge(b.ctx, 10); err != nil { // creates the days
		t.Fatal(err)
	}
	for _, p := range []string{"idempotency_keys_p20270310", "idempotency_keys_p20270311"} {
		if !partitionExists(t, b, p) {
			t.Fatalf("partition %s missing after Purge", p)
		}
	}
	for _, q := range []string{
		`CREATE FUNCTION test_hold_insert() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN PERFORM pg_sleep(1.5); RETURN NULL; END $$`,
		`CREATE TRIGGER test_hold_insert AFTER INSERT ON idempotency_keys_p20270310
		 FOR EACH ROW EXECUTE FUNCTION test_hold_insert()`,
	} {
		if _, err := b.pool.Exec(b.ctx, q); err != nil {
			t.Fatal(err)
		}
	}

	poolA, pidA := testenv.OneConn(t, b.pool)
	storeA, err := dedup.New(poolA, dedup.Config{Clock: clock.NewFake(day.Add(24*time.Hour - 500*time.Millisecond))})
	if err != nil {
		t.Fatal(err)
	}
	storeB, err := dedup.New(b.pool, dedup.Config{Clock: clock.NewFake(day.Add(24*time.Hour + 500*time.Millisecond))})
	if err != nil {
		t.Fatal(err)
	}
	r := req("m_1", "midnight", 1000)
	type result struct {
		res ledger.ClaimResult
		err error
	}
	first := make(chan result, 1)
	go func() {
		res, err := storeA.Claim(context.Background(), "before-midnight", lease, r)
		first <- result{res, err}
	}()
	// Wait until the first claim has inserted its row and sits in the
	// trigger, uncommitted.
	waitInTrigger(t, b, pidA, "the first claim")
	second, err := storeB.Claim(b.ctx, "after-midnight", lease, r)
	if err != nil {
		t.Fatal(err)
	}
	a := <-first
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.res.Outcome != ledger.Claimed || second.Outcome != ledger.InFlight {
		t.Fatalf("claims across midnight: first %v, second %v; want claimed and in flight", a.res.Outcome, second.Outcome)
	}
	if n := b.count(t, `SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'midnight'`); n != 1 {
		t.Fatalf("%d rows for one key across two days, want 1", n)
	}
}

// TestPurgeDropsDaysKeepsPending: a day older than the retention is dropped
// whole, but not while it holds a pending row (even one that pending_keys
// does not name): the day waits until the row is resolved. The ledger
// keeps every payment, so a redelivery of a dropped key is still a
// duplicate.
func TestPurgeDropsDaysKeepsPending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.clock.Set(day.Add(12 * time.Hour))
	if _, err := b.store.Purge(b.ctx, 10); err != nil {
		t.Fatal(err)
	}
	const part = "idempotency_keys_p20270310"
	done := b.claim(t, "w", req("m_1", "done", 1000))
	if err := b.store.Complete(b.ctx, *done.Lease, charged("pi_done")); err != nil {
		t.Fatal(err)
	}
	b.claim(t, "w", req("m_1", "open", 1000)) // stays pending: the worker died
	if n := b.count(t, `SELECT count(*) FROM `+part); n != 2 {
		t.Fatalf("%s holds %d rows, want 2", part, n)
	}

	// Past the day's end plus the retention: kept for its pending row,
	// whether pending_keys names it or not.
	b.clock.Set(day.Add(24*time.Hour + ledger.DefaultRetention + time.Hour))
	for _, step := range []string{"named", "not named"} {
		if step == "not named" {
			if _, err := b.pool.Exec(b.ctx, `DELETE FROM pending_keys`); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := b.store.Purge(b.ctx, 10); err != nil {
			t.Fatal(err)
		}
		if !partitionExists(t, b, part) {
			t.Fatalf("%s: the day was dropped with a pending row in it", step)
		}
		if rec, err := b.store.Get(b.ctx, "m_1", "open"); err != nil || rec.Status != ledger.StatusPending {
			t.Fatalf("%s: pending row after purge: %+v %v", step, rec, err)
		}
	}

	// Resolved (past its key window, only by the reconciler's lookup), the
	// day goes whole at the next purge.
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO pending_keys VALUES ('m_1', 'open')`); err != nil {
		t.Fatal(err)
	}
	stuck, err := b.store.AcquireStuck(b.ctx, "rec", time.Minute, lease, 10)
	if err != nil || len(stuck) != 1 {
		t.Fatalf("reconciler found %d stuck keys (%v), want the open one", len(stuck), err)
	}
	if err := b.store.Complete(b.ctx, stuck[0].Lease, charged("pi_open")); err != nil {
		t.Fatal(err)
	}
	n, err := b.store.Purge(b.ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if partitionExists(t, b, part) || n < 2 {
		t.Fatalf("after the pending row completed: partition kept %v, %d rows purged", partitionExists(t, b, part), n)
	}
	if got := b.count(t, `SELECT count(*) FROM payments WHERE idempotency_key IN ('done', 'open')`); got != 2 {
		t.Fatalf("ledger holds %d of the 2 payments after the day was dropped", got)
	}
	again := b.claim(t, "w3", req("m_1", "done", 1000))
	if again.Outcome != ledger.Duplicate || !again.FromLedger {
		t.Fatalf("redelivery of a dropped key: %v (from ledger %v), want a duplicate from the ledger", again.Outcome, again.FromLedger)
	}
}

// TestClaimCannotStealReconcilerLease: a claim whose snapshot shows an
// expired lease while the reconciler is taking the row (its update holds
// the row, uncommitted: a test trigger sleeps after it) must not take the
// row over once the reconciler commits: the claim re-checks the row's
// latest version, whose lease is the reconciler's and live. The claim's
// advisory lock does not serialise these two (the reconciler takes none).
func TestClaimCannotStealReconcilerLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if res := b.claim(t, "w1", req("m_1", "steal", 1000)); res.Outcome != ledger.Claimed {
		t.Fatalf("claim: %v", res.Outcome)
	}
	b.clock.Advance(lease + 2*time.Minute)
	for _, q := range []string{
		`CREATE FUNCTION test_hold_update() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN PERFORM pg_sleep(1.5); RETURN NULL; END $$`,
		`CREATE TRIGGER test_hold_update AFTER UPDATE ON idempotency_keys
		 FOR EACH ROW WHEN (NEW.locked_by = 'rec') EXECUTE FUNCTION test_hold_update()`,
	} {
		if _, err := b.pool.Exec(b.ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	pool, pid := testenv.OneConn(t, b.pool)
	rec, err := dedup.New(pool, dedup.Config{Clock: b.clock})
	if err != nil {
		t.Fatal(err)
	}
	stuck := make(chan error, 1)
	go func() {
		s, err := rec.AcquireStuck(context.Background(), "rec", time.Minute, lease, 10)
		if err == nil && len(s) != 1 {
			err = fmt.Errorf("reconciler leased %d rows, want 1", len(s))
		}
		stuck <- err
	}()
	waitInTrigger(t, b, pid, "the reconciler")
	res := b.claim(t, "w2", req("m_1", "steal", 1000))
	if err := <-stuck; err != nil {
		t.Fatal(err)
	}
	got, err := b.store.Get(b.ctx, "m_1", "steal")
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome == ledger.Reacquired || got.LockedBy != "rec" {
		t.Fatalf("claim during the reconciler's take-over: %v, row held by %q; want the reconciler to keep it", res.Outcome, got.LockedBy)
	}
}

// TestPurgeConcurrent runs the partition maintenance from several
// reconcilers at once (any number may run): one does it while the others
// find it under way and leave it (they once deadlocked, each holding the
// lock of a day it created and asking for the exclusive lock to drop one);
// none fails, and the old day is gone and the coming ones are there.
func TestPurgeConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.clock.Set(day.Add(12 * time.Hour))
	if _, err := b.store.Purge(b.ctx, 10); err != nil {
		t.Fatal(err)
	}
	done := b.claim(t, "w", req("m_1", "old", 1000))
	if err := b.store.Complete(b.ctx, *done.Lease, charged("pi_old")); err != nil {
		t.Fatal(err)
	}
	b.clock.Set(day.Add(10 * 24 * time.Hour))
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := b.store.Purge(context.Background(), 10)
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent purge: %v", err)
		}
	}
	if partitionExists(t, b, "idempotency_keys_p20270310") || !partitionExists(t, b, "idempotency_keys_p20270322") {
		t.Fatal("after concurrent purges: the old day is still there or the coming day is missing")
	}
}

// partitionOf returns the partition that holds the key row of key.
func partitionOf(t *testing.T, pool *pgxpool.Pool, key string) string {
	t.Helper()
	var part string
	if err := pool.QueryRow(context.Background(),
		`SELECT tableoid::regclass::text FROM idempotency_keys WHERE idempotency_key = $1`, key).Scan(&part); err != nil {
		t.Fatalf("row of %s: %v", key, err)
	}
	return part
}

// TestFreshInstallClaimsIntoTodaysPartition: on a fresh install the first
// day's keys go to that day's partition (dropped whole once past the
// retention), not to the partition 00013 left for the old table's rows,
// which is purged row by row and has an index more (migration 00016). An
// install whose old table holds rows keeps 00013's layout: the day's keys
// join its rows there.
func TestFreshInstallClaimsIntoTodaysPartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Fresh: migrated in one go, the database's clock.
	fresh := testenv.Pool(t)
	store, err := dedup.New(fresh, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.ClaimBatch(ctx, "w1", lease, []ledger.ClaimRequest{req("m_1", "first-day", 1000)}); err != nil {
		t.Fatal(err)
	}
	// The day of the row's own created_at (the database's clock), so that a
	// claim just after midnight is judged by its own day.
	var day string
	if err := fresh.QueryRow(ctx, `SELECT 'idempotency_keys_p' || to_char(created_at AT TIME ZONE 'UTC', 'YYYYMMDD')
		FROM idempotency_keys WHERE idempotency_key = 'first-day'`).Scan(&day); err != nil {
		t.Fatal(err)
	}
	if got := partitionOf(t, fresh, "first-day"); got != day {
		t.Errorf("a fresh install's first key went to %s, want %s", got, day)
	}

	// Rows in the old table before 00016: the layout stays.
	owner, m := migrator(t, testenv.PostgresEmptyURL(t))
	if _, err := m.UpTo(ctx, 15); err != nil {
		t.Fatal(err)
	}
	old, err := dedup.New(owner, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.ClaimBatch(ctx, "w1", lease, []ledger.ClaimRequest{req("m_1", "before", 1000)}); err != nil {
		t.Fatal(err)
	}
	if got := partitionOf(t, owner, "before"); got != "idempotency_keys_unpartitioned" {
		t.Fatalf("a key claimed at 00015 went to %s, want idempotency_keys_unpartitioned", got)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := old.ClaimBatch(ctx, "w1", lease, []ledger.ClaimRequest{req("m_1", "after", 1000)}); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"before", "after"} {
		if got := partitionOf(t, owner, key); got != "idempotency_keys_unpartitioned" {
			t.Errorf("%s: in %s, want idempotency_keys_unpartitioned (it held rows)", key, got)
		}
	}
}

// keyIndexScans flushes the statistics of pool's backend (a OneConn pool)
// and returns how many index scans each partition of idempotency_keys has
// had.
func keyIndexScans(t *testing.T, ctx context.Context, pool *pgxpool.Pool) map[string]int64 {
	t.Helper()
	if _, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT i.relname, sum(i.idx_scan)::bigint FROM pg_stat_user_indexes i
		JOIN pg_inherits p ON p.inhrelid = i.relid
		WHERE p.inhparent = 'idempotency_keys'::regclass GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	var part string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&part, &n}, func() error { out[part] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCompletionLooksInItsDayOnly: a completion finds its row in the day
// partition its lease's claim time names, and does not probe the key index
// of any other live day (at millions of keys a day, each such probe is a
// descent two or three levels deep that finds nothing). Keys claimed on two
// days, completed together and one alone: only those two days' indexes
// are scanned, and every key completes.
func TestCompletionLooksInItsDayOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.clock.Set(day.Add(12 * time.Hour))
	if _, err := b.store.Purge(b.ctx, 10); err != nil { // creates the days
		t.Fatal(err)
	}
	pool, _ := testenv.OneConn(t, b.pool)
	store, err := dedup.New(pool, dedup.Config{Clock: b.clock})
	if err != nil {
		t.Fatal(err)
	}
	var items []ledger.CompleteItem
	claimOn := func(at time.Time, keys ...string) {
		t.Helper()
		b.clock.Set(at)
		for _, k := range keys {
			res, err := store.Claim(b.ctx, "w1", time.Hour, req("m_1", k, 1000))
			if err != nil || res.Lease == nil {
				t.Fatalf("claim %s: %+v, %v", k, res, err)
			}
			items = append(items, ledger.CompleteItem{Lease: *res.Lease, Completion: charged("ch_" + k)})
		}
	}
	claimOn(day.Add(12*time.Hour), "d1-a", "d1-b", "d1-alone")
	claimOn(day.Add(36*time.Hour), "d2-a")
	if got := partitionOf(t, b.pool, "d1-a"); got != "idempotency_keys_p20270310" {
		t.Fatalf("d1-a is in %s", got)
	}
	if got := partitionOf(t, b.pool, "d2-a"); got != "idempotency_keys_p20270311" {
		t.Fatalf("d2-a is in %s", got)
	}

	scanned := func(before, after map[string]int64) []string {
		var out []string
		for part, n := range after {
			if n > before[part] {
				out = append(out, part)
			}
		}
		slices.Sort(out)
		return out
	}
	before := keyIndexScans(t, b.ctx, pool)
	errs, err := store.CompleteBatch(b.ctx, []ledger.CompleteItem{items[0], items[1], items[3]})
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("item %d: %v", i, e)
		}
	}
	after := keyIndexScans(t, b.ctx, pool)
	if got, want := scanned(before, after), []string{"idempotency_keys_p20270310", "idempotency_keys_p20270311"}; !slices.Equal(got, want) {
		t.Errorf("the group commit scanned the key indexes of %v, want those of its rows' days %v", got, want)
	}

	before = after
	if err := store.Complete(b.ctx, items[2].Lease, items[2].Completion); err != nil {
		t.Fatal(err)
	}
	after = keyIndexScans(t, b.ctx, pool)
	if got, want := scanned(before, after), []string{"idempotency_keys_p20270310"}; !slices.Equal(got, want) {
		t.Errorf("the completion scanned the key indexes of %v, want its row's day's %v", got, want)
	}
	if n := b.count(t, `SELECT count(*) FROM payments`); n != 4 {
		t.Fatalf("%d ledger rows, want the 4 completed", n)
	}
	if n := b.count(t, `SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`); n != 4 {
		t.Fatalf("%d completed keys, want 4", n)
	}
}

// TestCompletionNeedsTheClaimTime: a lease without its claim time cannot
// complete (its row's day is unknown); the completion says why, and the
// row is left as it was, so the same lease with its time completes it.
func TestCompletionNeedsTheClaimTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.claim(t, "w1", req("m_1", "no-time", 1000))
	l := *res.Lease
	if l.CreatedAt.IsZero() {
		t.Fatal("the claim's lease carries no claim time")
	}
	bare := l
	bare.CreatedAt = time.Time{}
	if err := b.store.Complete(b.ctx, bare, charged("ch_1")); err == nil || !strings.Contains(err.Error(), "Lease.CreatedAt") {
		t.Fatalf("Complete without the claim time: %v, want an error naming Lease.CreatedAt", err)
	}
	if _, err := b.store.CompleteBatch(b.ctx, []ledger.CompleteItem{{Lease: bare, Completion: charged("ch_1")}}); err == nil || !strings.Contains(err.Error(), "Lease.CreatedAt") {
		t.Fatalf("CompleteBatch without the claim time: %v, want an error naming Lease.CreatedAt", err)
	}
	if rec, err := b.store.Get(b.ctx, "m_1", "no-time"); err != nil || rec.Status != ledger.StatusPending || rec.LockedBy != "w1" {
		t.Fatalf("row after the refused completions: %+v, %v; want pending under w1", rec, err)
	}
	if err := b.store.Complete(b.ctx, l, charged("ch_1")); err != nil {
		t.Fatalf("Complete with the claim time: %v", err)
	}
	if n := b.count(t, `SELECT count(*) FROM payments WHERE idempotency_key = 'no-time'`); n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
}
