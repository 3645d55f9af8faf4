package consumer_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/storehook"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
	"github.com/paydedup/paydedup/reconciler"
)

// claimWatch records every claim outcome per key, as an after hook of the
// worker's store's ClaimBatch.
type claimWatch struct {
	mu   sync.Mutex
	seen map[string][]ledger.Outcome
}

func (w *claimWatch) record(_ context.Context, c *storehook.Call) error {
	if c.Err == nil {
		w.mu.Lock()
		for i, r := range c.Results {
			w.seen[c.Reqs[i].IdempotencyKey] = append(w.seen[c.Reqs[i].IdempotencyKey], r.Outcome)
		}
		w.mu.Unlock()
	}
	return nil
}

func (w *claimWatch) count(key string, o ledger.Outcome) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, s := range w.seen[key] {
		if s == o {
			n++
		}
	}
	return n
}

// TestResendInUseNeverFailsNorChargesTwice is the double charge a 409
// idempotency_key_in_use used to open, end to end. A front proxy closes the
// worker's kept-alive connection to the provider after the charge request
// was written; net/http resends it by itself (stripe-go sets GetBody and an
// Idempotency-Key), and the resend and every retry meet the first copy, which
// the provider holds in flight, with 409. The row must not end `failed`: it
// stays pending and maybe_charged. A day and an hour later (fake clock, for
// the store and for the provider, which has forgotten the key by then) the
// dead letter of that message is replayed and the command is sent again:
// neither may call the provider blind. A lookup resolves the row to the first
// copy's charge, and the provider's ledger holds exactly one charge.
func TestResendInUseNeverFailsNorChargesTwice(t *testing.T) {
	t.Parallel()
	const held = "k-held"
	clk := clock.NewFake(time.Now())
	pool := testenv.Pool(t)
	store, err := dedup.New(pool, dedup.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	sim := stripesim.New(stripesim.Config{Seed: 7, Now: clk.Now, OnCharge: func(c stripesim.Charge) {
		if c.IdempotencyKey == held {
			entered <- struct{}{}
			<-release
		}
	}})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	t.Cleanup(unblock) // before srv.Close: no handler stays blocked
	proxy := testenv.NewFrontProxy(t, srv.Listener.Addr().String())
	stripe, err := stripe.New(stripe.Config{SecretKey: "sk_test_paydedup", APIBase: proxy.URL(), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stripe.CloseIdleConnections)

	nc := testenv.NATSConn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := consumer.Config{Stream: testenv.Streams(t, js)}
	cfg.Lease, cfg.Stream.AckWait, cfg.Stream.MaxDeliver = 3*time.Second, 5*time.Second, 2
	cfg.ProviderTry = provider.RetryPolicy{MaxTries: 2, AttemptTimeout: 800 * time.Millisecond, InitialInterval: 50 * time.Millisecond, MaxInterval: 100 * time.Millisecond}
	cfg.RetryBase, cfg.RetryMax = 50*time.Millisecond, 200*time.Millisecond
	cfg.DrainTimeout, cfg.Concurrency, cfg.FetchBatch = 2*time.Second, 4, 10
	e := &env{t: t, ctx: context.Background(), pool: pool, store: store, nc: nc, js: js, sim: sim, stripe: stripe, cfg: cfg}
	watch := &claimWatch{seen: map[string][]ledger.Outcome{}}
	e.startWorkerOn("w1", storehook.Wrap(store).After(storehook.ClaimBatch, watch.record))

	// A first payment leaves one kept-alive connection through the proxy.
	e.publish("m_1", body("m_1", "k-warm", 100), "", nil)
	e.eventually("warm-up payment completed", func() bool { return e.charges("m_1", "k-warm") == 1 })
	e.eventually("warm-up row completed", func() bool {
		rec, err := store.Get(e.ctx, "m_1", "k-warm")
		return err == nil && rec.Status == ledger.StatusCompleted
	})

	e.publish("m_1", body("m_1", held, 100), "", nil)
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the charge never reached the provider")
	}
	if n := proxy.CutClients(); n != 1 {
		t.Fatalf("cut %d client connections, want the one the charge was written on", n)
	}

	// Both deliveries meet the held copy (409) and the message runs out of
	// deliveries: a max_deliveries dead letter.
	e.eventually("max_deliveries dead letter", func() bool { return len(e.deadLetters()) == 1 })
	rec, err := store.Get(e.ctx, "m_1", held)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status == ledger.StatusFailed || rec.Status != ledger.StatusPending || !rec.MaybeCharged {
		t.Fatalf("row after 409s = %s maybe_charged=%v (%s); want pending and maybe_charged, never failed",
			rec.Status, rec.MaybeCharged, rec.LastError)
	}
	if !strings.Contains(rec.LastError, "idempotency_key_in_use") || proxy.Accepted() < 2 {
		t.Fatalf("last error %q after %d connections: the resend never met the held copy", rec.LastError, proxy.Accepted())
	}

	// The first copy finishes: one charge, its answer lost with the
	// connection.
	unblock()
	e.eventually("first copy charged", func() bool { return e.charges("m_1", held) == 1 })

	// A day and an hour later: the provider has forgotten the key.
	clk.Advance(25 * time.Hour)
	rep, err := dlq.Replay(e.ctx, js, cfg.Stream, dlq.ReplayOptions{All: true, Now: time.Now().Add(25 * time.Hour)})
	if err != nil || rep.Replayed != 1 {
		t.Fatalf("replay: %+v %v", rep, err)
	}
	e.publish("m_1", body("m_1", held, 100), "", nil) // a client's own retry
	e.eventually("both copies claimed and sent to a lookup", func() bool { return watch.count(held, ledger.NeedsLookup) >= 2 })
	if n := e.charges("m_1", held); n != 1 {
		t.Fatalf("charges under the key = %d after the late copies, want 1", n)
	}
	if n := watch.count(held, ledger.Reacquired) + watch.count(held, ledger.Claimed); n != 2 {
		t.Fatalf("the key was handed out %d times for a call, want 2 (the first delivery and its redelivery)", n)
	}

	// Only a lookup decides: it finds the first copy's charge.
	rc, err := reconciler.New(store, stripe, reconciler.Config{Clock: clk, Grace: time.Second, SearchLag: time.Second, Holder: "rec"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rc.RunOnce(e.ctx); err != nil {
		t.Fatal(err)
	}
	rec, err = store.Get(e.ctx, "m_1", held)
	if err != nil || rec.Status != ledger.StatusCompleted || rec.ChargeID != sim.Charges()[1].ID {
		t.Fatalf("after the lookup: %+v %v, want completed with the first copy's charge", rec, err)
	}
	e.publish("m_1", body("m_1", held, 100), "", nil)
	e.eventually("a later copy is a duplicate", func() bool { return watch.count(held, ledger.Duplicate) >= 1 })
	if n := e.charges("m_1", held); n != 1 {
		t.Fatalf("charges under the key = %d, want 1", n)
	}
}
