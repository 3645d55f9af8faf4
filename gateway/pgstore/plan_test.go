package pgstore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/gateway/apikey"
	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
)

// TestIntakeBatchReadsBoundedByBatch checks that the batched intake's
// statements read rows in proportion to their batch, not to the tables:
// the reads of records and ledger, the acquisition, the read of the keys
// it could not take in, the publish mark, and the first statement of a
// batch (AcquireNewIntakes: API key, record and ledger probes, the
// acquisition of the new keys) probe each key through an
// index, with no sequential scan, on tables that grew since they were
// last analysed (a young deployment, or one whose traffic outgrew its
// statistics). Left to the planner, the publish mark was a hash join over
// a sequential scan of every intake row: each batch of the gateway bench
// read the whole table, and its cost grew with the run.
func TestIntakeBatchReadsBoundedByBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// One connection: the statistics flushed are the backend's that ran
	// the statements.
	pool, _ := testenv.OneConn(t, b.pool)
	worker, err := dedup.New(pool, dedup.Config{Clock: b.clock})
	if err != nil {
		t.Fatal(err)
	}
	store, err := pgstore.New(pool, pgstore.Config{Clock: b.clock, Records: worker})
	if err != nil {
		t.Fatal(err)
	}
	key0, _, err := store.CreateAPIKey(b.ctx, "m_1", "")
	if err != nil {
		t.Fatal(err)
	}
	apiKey := apikey.Hash(key0)
	const existing, size = 10000, 128
	key := func(i int) string { return fmt.Sprintf("plan-%d-0123456789abcdef0123456789abcdef", i) }
	var seq uint64
	// intake acquires and marks published keys [lo, hi), and returns the
	// outcomes of the acquisition.
	intake := func(lo, hi int) []ledger.IntakeResult {
		t.Helper()
		reqs := make([]ledger.ClaimRequest, 0, hi-lo)
		for i := lo; i < hi; i++ {
			reqs = append(reqs, req("m_1", key(i), 1999))
		}
		res, err := store.AcquireIntakes(b.ctx, reqs, 10*time.Second, 24*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		var pubs []ledger.Published
		for _, r := range res {
			if r.Outcome == ledger.IntakeAcquired {
				seq++
				pubs = append(pubs, ledger.Published{Intake: r.Intake, Seq: seq})
			}
		}
		if len(pubs) > 0 {
			ok, err := store.IntakesPublished(b.ctx, pubs, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			for i, o := range ok {
				if !o {
					t.Fatalf("publish %d of keys %d..%d not marked", i, lo, hi)
				}
			}
		}
		return res
	}

	// 10,000 intakes published, and as many keys the worker charged (records
	// and ledger rows).
	for lo := 0; lo < existing; lo += 500 {
		intake(lo, lo+500)
		reqs := make([]ledger.ClaimRequest, 0, 500)
		for i := lo; i < lo+500; i++ {
			reqs = append(reqs, req("m_1", key(i), 1999))
		}
		res, err := worker.ClaimBatch(b.ctx, "plan", lease, reqs)
		if err != nil {
			t.Fatal(err)
		}
		items := make([]ledger.CompleteItem, 0, len(res))
		for i, r := range res {
			if r.Lease == nil {
				t.Fatalf("claim of key %d: %v", lo+i, r.Outcome)
			}
			items = append(items, ledger.CompleteItem{Lease: *r.Lease, Completion: charged(fmt.Sprintf("pi_%d", lo+i))})
		}
		if _, err := worker.CompleteBatch(b.ctx, items); err != nil {
			t.Fatal(err)
		}
	}

	tables := []string{"gateway_intake", "idempotency_keys", "payments"}
	next := existing
	for round := range 8 {
		// New keys, and keys published already (held: read back).
		first := next
		if round%2 == 1 {
			first = round * 797 % existing
		} else {
			next += size
		}
		refs := make([]ledger.KeyRef, size)
		for i := range refs {
			refs[i] = ledger.KeyRef{MerchantID: "m_1", IdempotencyKey: key(first + i)}
		}
		before := testenv.TableReads(t, b.ctx, pool, tables...)
		reads, err := store.ReadBatch(b.ctx, nil, refs)
		if err != nil {
			t.Fatal(err)
		}
		res := intake(first, first+size)
		after := testenv.TableReads(t, b.ctx, pool, tables...)

		wantHeld, wantRecords := 0, 0
		if round%2 == 1 {
			wantHeld, wantRecords = size, size
		}
		held := 0
		for _, r := range res {
			if r.Outcome == ledger.IntakeHeld {
				held++
			}
		}
		if held != wantHeld || len(reads.Records) != wantRecords || len(reads.Payments) != wantRecords {
			t.Fatalf("round %d: %d held, %d records, %d ledger rows; want %d, %d, %d",
				round, held, len(reads.Records), len(reads.Payments), wantHeld, wantRecords, wantRecords)
		}
		for _, table := range tables {
			seq := after[table][0] - before[table][0]
			idx := after[table][1] - before[table][1]
			if seq != 0 || idx > int64(8*size) {
				t.Errorf("round %d: %s: %d rows read by sequential scans and %d through indexes for a batch of %d",
					round, table, seq, idx, size)
			}
		}

		// The first statement of a batch: keys the worker charged (all left
		// to be read) or new ones (all taken in).
		reqs, keys := make([]ledger.ClaimRequest, size), make([][]byte, size)
		for i := range reqs {
			k := refs[i].IdempotencyKey
			if round%2 == 0 {
				k = fmt.Sprintf("new-%d-%d", round, i)
			}
			reqs[i], keys[i] = req("m_1", k, 1999), apiKey
		}
		before = testenv.TableReads(t, b.ctx, pool, append(tables, "api_keys")...)
		fresh, err := store.AcquireNewIntakes(b.ctx, reqs, keys, 10*time.Second, 24*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		after = testenv.TableReads(t, b.ctx, pool, append(tables, "api_keys")...)
		want := ledger.IntakeAcquired
		if round%2 == 1 {
			want = ledger.IntakeReadFirst
		}
		for i, r := range fresh {
			if r.Outcome != want {
				t.Fatalf("round %d: first statement: %s: %v, want %v", round, reqs[i].IdempotencyKey, r.Outcome, want)
			}
		}
		for _, table := range append(tables, "api_keys") {
			seq := after[table][0] - before[table][0]
			idx := after[table][1] - before[table][1]
			if seq != 0 || idx > int64(4*size) {
				t.Errorf("round %d: first statement: %s: %d rows read by sequential scans and %d through indexes for a batch of %d",
					round, table, seq, idx, size)
			}
		}
	}
}
