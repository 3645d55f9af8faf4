package dedup_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
)

// intentResponse is a completion's response the size of a Stripe
// PaymentIntent as the adapter stores it (about 700 bytes).
func intentResponse(id string) json.RawMessage {
	return json.RawMessage(`{"id":"` + id + `","object":"payment_intent","amount":1999,"amount_capturable":0,` +
		`"amount_received":1999,"capture_method":"automatic","client_secret":"` + id + `_secret_` + strings.Repeat("x", 24) + `",` +
		`"confirmation_method":"automatic","created":1764590400,"currency":"usd","description":"order 42",` +
		`"latest_charge":"ch_` + strings.Repeat("0", 24) + `","livemode":false,"metadata":{"idempotency_key":"` +
		strings.Repeat("k", 36) + `","merchant_id":"m_1","traceparent":"00-` + strings.Repeat("a", 32) + `-` +
		strings.Repeat("b", 16) + `-01"},"payment_method":"pm_card_visa","payment_method_types":["card"],` +
		`"status":"succeeded","transfer_data":null,"transfer_group":null}`)
}

// TestCompletionIsHeapOnlyUpdate checks that completing keys, as the
// worker does (claims and group commits of 200), is a HOT update: no index
// of idempotency_keys covers a column the completion changes, and the page
// has room for the completed version (migration 00012). Before it, every
// completion changed `status`, which two partial indexes test, and none was
// HOT.
func TestCompletionIsHeapOnlyUpdate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, _ := testenv.OneConn(t, b.pool)
	store, err := dedup.New(pool, dedup.Config{Clock: b.clock})
	if err != nil {
		t.Fatal(err)
	}
	// The table's own row, or its partitions' (migration 00013).
	updates := func() (n, hot int64) { return testenv.Updates(t, pool, "idempotency_keys") }

	const batches, size = 5, 200
	var completed int64
	for batch := range batches {
		reqs := make([]ledger.ClaimRequest, size)
		for i := range reqs {
			reqs[i] = req("m_1", fmt.Sprintf("hot-%d-%d", batch, i), 1999)
		}
		res, err := store.ClaimBatch(b.ctx, "hot", lease, reqs)
		if err != nil {
			t.Fatal(err)
		}
		items := make([]ledger.CompleteItem, 0, size)
		for i, r := range res {
			if r.Outcome != ledger.Claimed {
				t.Fatalf("claim %d: %v", i, r.Outcome)
			}
			id := fmt.Sprintf("pi_%d_%d", batch, i)
			items = append(items, ledger.CompleteItem{Lease: *r.Lease,
				Completion: ledger.Completion{ChargeID: id, ResponseStatus: 200, Response: intentResponse(id)}})
		}
		n0, hot0 := updates()
		errs, err := store.CompleteBatch(b.ctx, items)
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range errs {
			if e != nil {
				t.Fatalf("complete %d: %v", i, e)
			}
		}
		n1, hot1 := updates()
		if n1-n0 != size {
			t.Fatalf("batch %d: %d rows updated, want %d", batch, n1-n0, size)
		}
		completed += hot1 - hot0
		t.Logf("batch %d: %d of %d completions were HOT updates", batch, hot1-hot0, n1-n0)
	}
	// Every completion must be HOT but for the odd page the claim filled
	// past its share (a batch straddling pages); in practice all of them.
	if total := int64(batches * size); completed < total*95/100 {
		t.Fatalf("%d of %d completions were HOT updates (pg_stat_user_tables.n_tup_hot_upd), want at least 95%%", completed, total)
	}

	// A completed row is read back intact: the response is replayed byte
	// for byte.
	rec, err := store.Get(b.ctx, "m_1", "hot-0-7")
	if err != nil {
		t.Fatal(err)
	}
	if want := intentResponse("pi_0_7"); string(rec.Response) != string(want) {
		t.Fatalf("stored response %s, want %s", rec.Response, want)
	}
	if n := b.count(t, `SELECT count(*) FROM pending_keys`); n != 0 {
		t.Fatalf("%d keys still named pending after their completion", n)
	}
}
