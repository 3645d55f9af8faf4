package intake_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/intake"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/outbox"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/stream"
)

// world is one test's: its own schema (migrated, with an orders table
// standing for the publisher's own rows), its own payments stream.
type world struct {
	t     testing.TB
	ctx   context.Context
	url   string
	pool  *pgxpool.Pool
	store *intake.Store
	nc    *nats.Conn
	js    jetstream.JetStream
	cfg   stream.Config
	pub   *stream.CommandPublisher
}

func setup(t testing.TB) *world {
	t.Helper()
	return setupWith(t, func(*stream.Config) {})
}

// setupWith is setup with the stream's configuration changed by edit.
func setupWith(t testing.TB, edit func(*stream.Config)) *world {
	t.Helper()
	ctx := context.Background()
	u := testenv.PostgresURL(t)
	pool, err := pg.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, total bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	store, err := intake.NewStore(pool, 0)
	if err != nil {
		t.Fatal(err)
	}
	nc := testenv.NATSConn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testenv.Streams(t, js)
	cfg.AckWait, cfg.MaxDeliver = 5*time.Second, 6
	edit(&cfg)
	if _, _, err := stream.EnsureStreams(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	pub, err := stream.NewCommandPublisher(nc, cfg, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return &world{t: t, ctx: ctx, url: u, pool: pool, store: store, nc: nc, js: js, cfg: cfg, pub: pub}
}

// command is a valid card payment of key for merchant m_1.
func command(key string, amount int64) payment.Command {
	return payment.Command{MerchantID: "m_1", IdempotencyKey: key, Amount: amount, Currency: "usd", PaymentMethod: "pm_card_visa",
		Metadata: map[string]string{"order_id": key}}
}

// order inserts an order and its payment command in one transaction of
// the publisher, committed or rolled back.
func (w *world) order(key string, amount int64, commit bool) error {
	w.t.Helper()
	tx, err := w.pool.Begin(w.ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(w.ctx) }()
	if _, err := tx.Exec(w.ctx, `INSERT INTO orders (id, total) VALUES ($1, $2)`, key, amount); err != nil {
		w.t.Fatal(err)
	}
	if err := intake.Enqueue(w.ctx, tx, command(key, amount)); err != nil {
		return err
	}
	if !commit {
		return tx.Rollback(w.ctx)
	}
	return tx.Commit(w.ctx)
}

// source is the intake's relay source publishing with pub.
func (w *world) source(pub intake.Publisher) *intake.Source {
	w.t.Helper()
	s, err := intake.NewSource(w.store, pub, payment.Limits{})
	if err != nil {
		w.t.Fatal(err)
	}
	return s
}

func (w *world) relay(pub intake.Publisher) *outbox.Relay {
	w.t.Helper()
	r, err := outbox.New(outbox.Config{BatchSize: 64, Interval: 10 * time.Millisecond}, w.source(pub))
	if err != nil {
		w.t.Fatal(err)
	}
	return r
}

// drain runs passes of r until nothing waits.
func (w *world) drain(r *outbox.Relay) {
	w.t.Helper()
	for range 1000 {
		if _, err := r.RunOnce(w.ctx); err != nil {
			w.t.Fatal(err)
		}
		if w.backlog().Waiting == 0 {
			return
		}
	}
	w.t.Fatal("the intake did not empty")
}

func (w *world) backlog() intake.Backlog {
	w.t.Helper()
	b, err := w.store.Backlog(w.ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	return b
}

// stored is what the payments stream holds: Nats-Msg-Id → sequences.
func (w *world) stored() map[string][]uint64 {
	w.t.Helper()
	s, err := w.js.Stream(w.ctx, w.cfg.Name)
	if err != nil {
		w.t.Fatal(err)
	}
	info, err := s.Info(w.ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	out := map[string][]uint64{}
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(w.ctx, seq)
		if err != nil {
			continue
		}
		if _, err := stream.DecodeCommand(w.cfg, m.Subject, m.Header, m.Data); err != nil {
			w.t.Errorf("message %d is not a valid command: %v", seq, err)
		}
		id := m.Header.Get(nats.MsgIdHdr)
		out[id] = append(out[id], seq)
	}
	return out
}

// onceEach checks the stream holds each key's command exactly once, and
// nothing else, and that each key's row holds its message's sequence.
func (w *world) onceEach(keys ...string) {
	w.t.Helper()
	got := w.stored()
	for _, k := range keys {
		id := stream.MsgID("m_1", k)
		if len(got[id]) != 1 {
			w.t.Errorf("command %s stored %d times, want once", id, len(got[id]))
			continue
		}
		var seq *int64
		if err := w.pool.QueryRow(w.ctx, `SELECT stream_seq FROM intake_commands WHERE merchant_id = 'm_1' AND idempotency_key = $1`, k).Scan(&seq); err != nil {
			w.t.Fatal(err)
		}
		if seq == nil || uint64(*seq) != got[id][0] {
			w.t.Errorf("command %s: row's stream_seq %v, the stream holds it at %d", id, seq, got[id][0])
		}
	}
	if len(got) != len(keys) {
		w.t.Errorf("the stream holds %d commands, want %d", len(got), len(keys))
	}
}

func (w *world) count(sql string, args ...any) int {
	w.t.Helper()
	var n int
	if err := w.pool.QueryRow(w.ctx, sql, args...).Scan(&n); err != nil {
		w.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (w *world) eventually(what string, cond func() bool) {
	w.t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			w.t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// worker runs a paydedup worker on the world's schema and stream, charging
// the returned simulator, until the test ends.
func (w *world) worker() *stripesim.Simulator {
	w.t.Helper()
	store, err := dedup.New(w.pool, dedup.Config{})
	if err != nil {
		w.t.Fatal(err)
	}
	sim, adapter := testenv.Provider(w.t, 7, 2*time.Second)
	cfg := consumer.Config{Stream: w.cfg, Holder: "w1"}
	cfg.Lease = 3 * time.Second
	cfg.ProviderTry = provider.RetryPolicy{MaxTries: 2, AttemptTimeout: 800 * time.Millisecond, InitialInterval: 50 * time.Millisecond, MaxInterval: 100 * time.Millisecond}
	cfg.RetryBase, cfg.RetryMax = 50*time.Millisecond, 500*time.Millisecond
	cfg.DrainTimeout, cfg.Concurrency, cfg.FetchBatch = 2*time.Second, 16, 50
	proc := consumer.NewProcessor(store, adapter, cfg, nil)
	wk, err := consumer.NewWorker(w.nc, proc, cfg, nil, nil, nil)
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- wk.Run(ctx) }()
	var once sync.Once
	w.t.Cleanup(func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				w.t.Errorf("worker: %v", err)
			}
		})
	})
	return sim
}

// messages reads every message the named stream holds.
func (w *world) messages(name string) []*jetstream.RawStreamMsg {
	w.t.Helper()
	s, err := w.js.Stream(w.ctx, name)
	if err != nil {
		return nil
	}
	info, err := s.Info(w.ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		if m, err := s.GetMsg(w.ctx, seq); err == nil {
			out = append(out, m)
		}
	}
	return out
}
