package bench

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// TestPreloadedRowsAreReal preloads a schema and hands its keys to the
// worker's processor: a key with its row is a duplicate, a key whose row
// is gone but whose payment is in the ledger is a duplicate from the
// ledger, and a new key is charged once. The rows' provider keys and
// fingerprints are the Go code's, and every key row is in a day partition.
func TestPreloadedRowsAreReal(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := testenv.Pool(t)
	db := DB{
		Exec: func(ctx context.Context, sql string, args ...any) error {
			_, err := pool.Exec(ctx, sql, args...)
			return err
		},
		Scan: func(ctx context.Context, sql string, dest []any, args ...any) error {
			return pool.QueryRow(ctx, sql, args...).Scan(dest...)
		},
	}
	const rows, keys = 1200, 700
	st, err := PreloadFill(ctx, db, Preload{Rows: rows, Keys: keys, Vacuum: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.Rows != rows || st.Keys != keys || st.Partitions < 3 {
		t.Errorf("preload stats %+v: want %d rows, %d keys, at least 3 day partitions", st, rows, keys)
	}

	var ledgerRows, keyRows, inDays, notDone, pending int
	err = pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM payments),
        (SELECT count(*) FROM idempotency_keys),
        (SELECT count(*) FROM idempotency_keys k JOIN pg_class c ON c.oid = k.tableoid
         WHERE c.relname ~ '^idempotency_keys_p[0-9]{8}$'),
        (SELECT count(*) FROM idempotency_keys WHERE status <> 'completed' OR expires_at <> completed_at + $1::interval),
        (SELECT count(*) FROM pending_keys)`, KeyRetention).Scan(&ledgerRows, &keyRows, &inDays, &notDone, &pending)
	if err != nil {
		t.Fatal(err)
	}
	if ledgerRows != rows || keyRows != keys || inDays != keys || notDone != 0 || pending != 0 {
		t.Errorf("%d ledger rows, %d key rows (%d in day partitions, %d not completed or not kept for the retention), %d pending names; want %d, %d (all), 0, 0",
			ledgerRows, keyRows, inDays, notDone, pending, rows, keys)
	}
	var oldest, newest time.Time
	if err := pool.QueryRow(ctx, `SELECT min(created_at), max(created_at) FROM idempotency_keys`).Scan(&oldest, &newest); err != nil {
		t.Fatal(err)
	}
	if since := time.Since(oldest); since > KeyRetention+time.Minute || since < KeyRetention-time.Hour || time.Since(newest) > time.Hour {
		t.Errorf("keys created from %v to %v: want the last %v", oldest, newest, KeyRetention)
	}

	newest1 := PreloadCommand(rows - 1)
	var hash []byte
	var providerKey string
	if err := pool.QueryRow(ctx, `SELECT request_hash, provider_key FROM idempotency_keys WHERE merchant_id = $1 AND idempotency_key = $2`,
		newest1.MerchantID, newest1.IdempotencyKey).Scan(&hash, &providerKey); err != nil {
		t.Fatalf("the newest preloaded key %s: %v", newest1.IdempotencyKey, err)
	}
	if want := ledger.Fingerprint(&newest1); !bytes.Equal(hash, want) {
		t.Errorf("request_hash %x, ledger.Fingerprint %x", hash, want)
	}
	if want := ledger.ProviderKey(newest1.MerchantID, newest1.IdempotencyKey); providerKey != want {
		t.Errorf("provider_key %s, ledger.ProviderKey %s", providerKey, want)
	}

	store, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sim := stripesim.New(stripesim.Config{})
	proc := consumer.NewProcessor(store, sim.Client("sk_test_preload"), consumer.Config{Holder: "preload-test"}.WithDefaults(), nil)
	fresh := PreloadCommand(rows) // the next payment: never preloaded
	cmds := []*payment.Command{&newest1, new(PreloadCommand(3)), &fresh}
	claims, err := proc.Claim(ctx, cmds)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		kind       consumer.Kind
		fromLedger bool
	}{{consumer.Duplicate, false}, {consumer.Duplicate, true}, {consumer.Completed, false}}
	for i, c := range cmds {
		res := proc.Handle(ctx, c, claims[i], func() {})
		if res.Kind != want[i].kind || claims[i].FromLedger != want[i].fromLedger {
			t.Errorf("%s: %v (claim %v, from the ledger %v), want %v (from the ledger %v)",
				c.IdempotencyKey, res.Kind, claims[i].Outcome, claims[i].FromLedger, want[i].kind, want[i].fromLedger)
		}
	}
	charges := sim.ChargesByKey()
	if len(charges) != 1 || charges[fresh.MerchantID+":"+fresh.IdempotencyKey] != 1 {
		t.Errorf("charges %v: want only the new key, once", charges)
	}
}

// TestWindowRates: each window's rate is its own payments over its own
// time, a last shorter window is reported, and no mark means one window.
func TestWindowRates(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	w := &windows{size: 100}
	w.marks = []windowMark{
		{settled: 100, at: t0.Add(time.Second), rssMB: 10},
		{settled: 200, at: t0.Add(3 * time.Second), rssMB: 11},
	}
	got := w.rates(t0, t0.Add(4*time.Second), 250)
	if len(got) != 3 {
		t.Fatalf("windows %+v: want 3", got)
	}
	for i, want := range []Window{{100, 100, 10}, {200, 50, 11}, {250, 50, 0}} {
		g := got[i]
		if g.Settled != want.Settled || g.PaymentsPerSec != want.PaymentsPerSec || (i < 2 && g.RSSMB != want.RSSMB) {
			t.Errorf("window %d: %+v, want %+v", i, g, want)
		}
	}
	if got[2].RSSMB <= 0 {
		t.Errorf("the last window's RSS %v: want this process's", got[2].RSSMB)
	}
	// A total that is a multiple of the size adds no empty window.
	if got := w.rates(t0, t0.Add(4*time.Second), 200); len(got) != 2 {
		t.Errorf("windows %+v: want 2", got)
	}
	if got := (&windows{size: 100}).rates(t0, t0.Add(2*time.Second), 50); len(got) != 1 || got[0].PaymentsPerSec != 25 {
		t.Errorf("a run shorter than a window: %+v, want one window at 25/s", got)
	}
}

// TestObserverMarksWindows: the observer marks a window each time the
// settled payments reach a multiple of its size; duplicates and naks do
// not count.
func TestObserverMarksWindows(t *testing.T) {
	t.Parallel()
	o := newBenchObserver()
	o.win = &windows{size: 3}
	ack := consumer.Action{Kind: consumer.Ack}
	for range 7 {
		o.Settled(consumer.Completed, ack)
		o.Settled(consumer.Duplicate, ack)
		o.Settled(consumer.Completed, consumer.Action{Kind: consumer.Nak})
	}
	if n := len(o.win.marks); n != 2 || o.win.marks[0].settled != 3 || o.win.marks[1].settled != 6 {
		t.Errorf("marks %+v: want at 3 and 6", o.win.marks)
	}
	if o.paid.Load() != 7 || o.acked.Load() != 14 {
		t.Errorf("paid %d, acked %d: want 7 and 14", o.paid.Load(), o.acked.Load())
	}
}

// TestWindowsMarkedOutOfOrder: two workers' goroutines reach their
// multiples in one order and record them in the other (the second is
// scheduled first): the windows still come out in order of settled, one
// per multiple, never a window that settled fewer than the one before.
func TestWindowsMarkedOutOfOrder(t *testing.T) {
	t.Parallel()
	start := time.Unix(1000, 0)
	w := &windows{size: 100}
	w.mark(100, start.Add(1*time.Second))
	w.mark(300, start.Add(3*time.Second))
	w.mark(200, start.Add(2*time.Second))
	got := w.rates(start, start.Add(3*time.Second), 300)
	if len(got) != 3 || got[0].Settled != 100 || got[1].Settled != 200 || got[2].Settled != 300 {
		t.Fatalf("windows %+v, want 100, 200, 300", got)
	}
	for i, x := range got {
		if x.PaymentsPerSec != 100 {
			t.Errorf("window %d: %.1f/s, want 100", i, x.PaymentsPerSec)
		}
	}
}
