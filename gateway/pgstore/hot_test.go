package pgstore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
)

// TestPublishMarkIsHeapOnlyUpdate checks that the gateway's publish mark
// (IntakesPublished after AcquireIntakes, in batches as the batched intake
// sends them) is a HOT update: it changes no indexed column, and the page
// its row was inserted on has room for the new version (migration 00014).
// At the default fillfactor none of them was HOT: each mark wrote its row
// again elsewhere, with new entries in both of the table's indexes.
func TestPublishMarkIsHeapOnlyUpdate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// One connection: the statistics flushed are the backend's that ran
	// the updates.
	pool, _ := testenv.OneConn(t, b.pool)
	store, err := pgstore.New(pool, pgstore.Config{Clock: b.clock})
	if err != nil {
		t.Fatal(err)
	}
	updates := func() (n, hot int64) { return testenv.Updates(t, pool, "gateway_intake") }

	const batches, size = 5, 128
	var seq uint64
	var marked int64
	for batch := range batches {
		reqs := make([]ledger.ClaimRequest, size)
		for i := range reqs {
			reqs[i] = req(fmt.Sprintf("m_%d", i%4), fmt.Sprintf("hot-%d-%d-0123456789abcdef0123456789abcdef", batch, i), 1999)
		}
		res, err := store.AcquireIntakes(b.ctx, reqs, 10*time.Second, 24*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		pubs := make([]ledger.Published, len(res))
		for i, r := range res {
			if r.Outcome != ledger.IntakeAcquired {
				t.Fatalf("intake %d: outcome %v, want acquired", i, r.Outcome)
			}
			seq++
			pubs[i] = ledger.Published{Intake: r.Intake, Seq: seq}
		}
		n0, hot0 := updates()
		ok, err := store.IntakesPublished(b.ctx, pubs, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		for i, o := range ok {
			if !o {
				t.Fatalf("publish %d not marked", i)
			}
		}
		n1, hot1 := updates()
		if n1-n0 != size {
			t.Fatalf("batch %d: %d rows updated, want %d", batch, n1-n0, size)
		}
		marked += hot1 - hot0
		t.Logf("batch %d: %d of %d publish marks were HOT updates", batch, hot1-hot0, n1-n0)
	}
	if total := int64(batches * size); marked < total*95/100 {
		t.Fatalf("%d of %d publish marks were HOT updates (pg_stat_user_tables.n_tup_hot_upd), want at least 95%%", marked, total)
	}
	// The marks are there: every row published, with its sequence.
	if n := b.count(t, `SELECT count(*) FROM gateway_intake WHERE published_at IS NOT NULL AND stream_seq IS NOT NULL`); n != batches*size {
		t.Fatalf("%d rows marked published, want %d", n, batches*size)
	}
}
