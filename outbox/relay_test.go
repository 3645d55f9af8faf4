package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/localpg"
	"github.com/paydedup/paydedup/lab/storetest"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/outbox"
	"github.com/paydedup/paydedup/stream"
)

// world is a store on its own schema and an outcomes stream of its own.
type world struct {
	ctx   context.Context
	pool  *pgxpool.Pool
	store *dedup.Store
	js    jetstream.JetStream
	cfg   stream.Config
	pub   *stream.OutcomePublisher
}

func setup(t *testing.T) *world {
	t.Helper()
	return setupOn(t, testenv.PostgresURL(t), "")
}

// setupOn is setup on the schema of dbURL, the store's sessions named app.
func setupOn(t *testing.T, dbURL, app string) *world {
	t.Helper()
	ctx := context.Background()
	pool := connect(t, dbURL, app)
	store, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(testenv.NATSConn(t))
	if err != nil {
		t.Fatal(err)
	}
	u := testenv.Unique(t)
	cfg := stream.Config{OutcomeStream: "OUTCOMES_" + strings.ToUpper(u), OutcomePrefix: "outcomes." + u}
	if _, err := stream.EnsureOutcomeStream(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), cfg.WithDefaults().OutcomeStream) })
	return &world{ctx: ctx, pool: pool, store: store, js: js, cfg: cfg, pub: stream.NewOutcomePublisher(js, cfg, 5*time.Second)}
}

// connect opens a pool on dbURL whose sessions are named app (when set).
func connect(t *testing.T, dbURL, app string) *pgxpool.Pool {
	t.Helper()
	if app != "" {
		var err error
		if dbURL, err = localpg.WithAppName(dbURL, app); err != nil {
			t.Fatal(err)
		}
	}
	pool, err := pg.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// complete records a charge for key (and, when processing, its
// settlement).
func (w *world) complete(t *testing.T, merchant, key string, processing bool) {
	t.Helper()
	cl, err := w.store.Claim(w.ctx, "w", time.Minute, storetest.Req(merchant, key, 500))
	if err != nil || cl.Lease == nil {
		t.Fatalf("claim %s: %+v %v", key, cl, err)
	}
	c := storetest.Charged("pi_" + key)
	c.Processing = processing
	if err := w.store.Complete(w.ctx, *cl.Lease, c); err != nil {
		t.Fatal(err)
	}
	if processing {
		p, err := w.store.GetPayment(w.ctx, merchant, key)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.store.SettlePayment(w.ctx, p, ledger.PaymentSucceeded, 200, json.RawMessage(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
}

func (w *world) relay(t *testing.T, pub outbox.Publisher) *outbox.Relay {
	t.Helper()
	r, err := outbox.New(outbox.Config{BatchSize: 16, Interval: 10 * time.Millisecond}, outbox.Outcomes(w.store, pub))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// drain runs passes of r until the outbox is empty.
func (w *world) drain(t *testing.T, r *outbox.Relay) {
	t.Helper()
	for range 100 {
		if _, err := r.RunOnce(w.ctx); err != nil {
			t.Fatal(err)
		}
		b, err := w.store.OutcomeBacklog(w.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if b.Unrelayed == 0 {
			return
		}
	}
	t.Fatal("the outbox did not empty")
}

// stored is what the outcomes stream holds, in its order: the event ids
// (Nats-Msg-Id) and the decoded bodies.
func (w *world) stored(t *testing.T) ([]string, []stream.OutcomeEvent) {
	t.Helper()
	s, err := w.js.Stream(w.ctx, w.cfg.WithDefaults().OutcomeStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var (
		ids    []string
		events []stream.OutcomeEvent
	)
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(w.ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		e, err := stream.DecodeOutcomeEvent(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if want := w.cfg.OutcomeSubject(e.MerchantID); m.Subject != want {
			t.Fatalf("event %s on %s, want %s", e.EventID, m.Subject, want)
		}
		ids = append(ids, m.Header.Get(nats.MsgIdHdr))
		events = append(events, e)
	}
	return ids, events
}

// onceEach checks the stream holds each of want exactly once.
func onceEach(t *testing.T, ids []string, want ...string) {
	t.Helper()
	seen := map[string]int{}
	for _, id := range ids {
		seen[id]++
	}
	for _, id := range want {
		if seen[id] != 1 {
			t.Errorf("event %s stored %d times, want once (stream: %v)", id, seen[id], ids)
		}
	}
	if len(ids) != len(want) {
		t.Errorf("the stream holds %d events, want %d: %v", len(ids), len(want), ids)
	}
}

// TestRelayPublishesEachEventOnce: the relay publishes every event under
// its id on its merchant's subject, in order per payment, marks it, and
// publishes nothing again on the next passes.
func TestRelayPublishesEachEventOnce(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.complete(t, "m_1", "a", false)
	w.complete(t, "m_2", "ach", true)
	r := w.relay(t, w.pub)
	w.drain(t, r)
	w.drain(t, r)
	ids, events := w.stored(t)
	onceEach(t, ids, "m_1:a:charged", "m_2:ach:processing", "m_2:ach:settled")
	for i, e := range events {
		if e.EventID != ids[i] || e.Schema != stream.OutcomeSchema || e.Amount != 500 || e.Currency != "usd" || e.OccurredAt.IsZero() {
			t.Errorf("event %d: %+v", i, e)
		}
	}
	if events[1].Kind != ledger.OutcomeProcessing || events[2].Kind != ledger.OutcomeSettled || events[2].Status != ledger.PaymentSucceeded {
		t.Errorf("the payment's events out of order: %+v", events[1:])
	}
}

// failBefore is a relay killed after the outcome's commit and before the
// publish: it never sends.
type failBefore struct{}

func (failBefore) PublishOutcomes(context.Context, []ledger.OutcomeEvent) ([]bool, error) {
	return nil, errors.New("killed before the publish")
}

// lostAck publishes, and then the answer is lost: the stream stored the
// events, the relay learns nothing (ackLost) or dies before its mark
// (crash).
type lostAck struct {
	pub   outbox.Publisher
	crash bool
}

func (l lostAck) PublishOutcomes(ctx context.Context, events []ledger.OutcomeEvent) ([]bool, error) {
	done, err := l.pub.PublishOutcomes(ctx, events)
	if err != nil {
		return nil, err
	}
	for i, d := range done {
		if !d {
			return nil, fmt.Errorf("event %d not stored", i)
		}
	}
	if l.crash {
		return nil, errors.New("killed after the publish, before the mark")
	}
	return make([]bool, len(events)), nil
}

// TestRelayKilledBetweenCommitAndPublish: the outcomes are committed and
// the relay dies before publishing; a new relay publishes each exactly
// once. Without the outbox (an outcome published after its commit by the
// worker that died) nothing would ever publish them.
func TestRelayKilledBetweenCommitAndPublish(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.complete(t, "m_1", "a", false)
	w.complete(t, "m_1", "b", false)
	if _, err := w.relay(t, failBefore{}).RunOnce(w.ctx); err == nil {
		t.Fatal("the killed relay reported success")
	}
	if ids, _ := w.stored(t); len(ids) != 0 {
		t.Fatalf("stored %v before any publish", ids)
	}
	w.drain(t, w.relay(t, w.pub))
	ids, _ := w.stored(t)
	onceEach(t, ids, "m_1:a:charged", "m_1:b:charged")
}

// TestRelayAnswerLostAfterStored: the stream stored the events and the
// relay lost the PubAck, or died before marking them: the events stay
// unrelayed, a relay publishes them again under the same Nats-Msg-Id, and
// the stream keeps one copy of each (its duplicate window). Without the
// stable id the stream would hold two.
func TestRelayAnswerLostAfterStored(t *testing.T) {
	t.Parallel()
	for _, crash := range []bool{false, true} {
		t.Run(fmt.Sprintf("crash=%v", crash), func(t *testing.T) {
			t.Parallel()
			w := setup(t)
			w.complete(t, "m_1", "a", false)
			w.complete(t, "m_2", "ach", true)
			r := w.relay(t, lostAck{pub: w.pub, crash: crash})
			res, err := r.RunOnce(w.ctx)
			if (err != nil) != crash || res.Relayed != 0 {
				t.Fatalf("relay with the answer lost: %+v %v", res, err)
			}
			if b, err := w.store.OutcomeBacklog(w.ctx); err != nil || b.Unrelayed != 3 {
				t.Fatalf("backlog %+v %v, want every event still unrelayed", b, err)
			}
			if ids, _ := w.stored(t); len(ids) != 2 {
				t.Fatalf("stored %v, want the two first events", ids)
			}
			w.drain(t, w.relay(t, w.pub))
			ids, _ := w.stored(t)
			onceEach(t, ids, "m_1:a:charged", "m_2:ach:processing", "m_2:ach:settled")
		})
	}
}

// counting counts each event's publishes.
type counting struct {
	pub outbox.Publisher
	mu  sync.Mutex
	n   map[string]int
}

func (c *counting) PublishOutcomes(ctx context.Context, events []ledger.OutcomeEvent) ([]bool, error) {
	c.mu.Lock()
	for _, e := range events {
		c.n[e.EventID]++
	}
	c.mu.Unlock()
	return c.pub.PublishOutcomes(ctx, events)
}

// TestTwoRelaysRace: two relays running on one outbox never publish an
// event twice (each publish is counted) and relay every event, a
// payment's events in their order.
func TestTwoRelaysRace(t *testing.T) {
	t.Parallel()
	w := setup(t)
	var want []string
	for i := range 60 {
		key := fmt.Sprintf("k%02d", i)
		processing := i%3 == 0
		w.complete(t, "m_"+fmt.Sprint(i%4), key, processing)
		if processing {
			want = append(want, fmt.Sprintf("m_%d:%s:processing", i%4, key), fmt.Sprintf("m_%d:%s:settled", i%4, key))
		} else {
			want = append(want, fmt.Sprintf("m_%d:%s:charged", i%4, key))
		}
	}
	c := &counting{pub: w.pub, n: map[string]int{}}
	a, b := w.relay(t, c), w.relay(t, c)
	if err := a.Start(w.ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(w.ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		bl, err := w.store.OutcomeBacklog(w.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if bl.Unrelayed == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("backlog %+v after 30s", bl)
		}
		time.Sleep(20 * time.Millisecond)
	}
	a.Stop()
	b.Stop()
	for id, n := range c.n {
		if n != 1 {
			t.Errorf("event %s published %d times", id, n)
		}
	}
	ids, _ := w.stored(t)
	onceEach(t, ids, want...)
	at := map[string]int{}
	for i, id := range ids {
		at[id] = i
	}
	for _, id := range want {
		if strings.HasSuffix(id, ":settled") {
			first := strings.TrimSuffix(id, ":settled") + ":processing"
			if at[first] > at[id] {
				t.Errorf("%s stored before %s", id, first)
			}
		}
	}
}

// holding is a publisher that never gets to publish: it reports that it
// holds its batch and waits until its relay is killed.
type holding struct{ held chan<- int }

func (h holding) PublishOutcomes(ctx context.Context, events []ledger.OutcomeEvent) ([]bool, error) {
	h.held <- len(events)
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestRelayProcessKilledHoldingEvents: a relay took the events (their row
// locks held) and its process died before publishing: its database
// session is terminated, as when the process is killed. While it held
// them another relay skipped them; once it is gone, the other relay
// publishes each exactly once.
func TestRelayProcessKilledHoldingEvents(t *testing.T) {
	t.Parallel()
	u := testenv.PostgresURL(t)
	ctx := context.Background()
	w := setupOn(t, u, "")
	victimApp := "relay-" + testenv.Unique(t)
	victim, err := dedup.New(connect(t, u, victimApp), dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	w.complete(t, "m_1", "a", false)
	w.complete(t, "m_1", "b", false)

	held := make(chan int, 1)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dead := make(chan error, 1)
	go func() {
		r, err := outbox.New(outbox.Config{BatchSize: 16}, outbox.Outcomes(victim, holding{held}))
		if err != nil {
			dead <- err
			return
		}
		_, err = r.RunOnce(rctx)
		dead <- err
	}()
	if n := <-held; n != 2 {
		t.Fatalf("the first relay took %d events, want 2", n)
	}
	survivor := w.relay(t, w.pub)
	if res, err := survivor.RunOnce(ctx); err != nil || res.Relayed != 0 {
		t.Fatalf("while the first relay holds the events: %+v %v, want nothing taken", res, err)
	}
	// The timeout makes pg_terminate_backend wait for the backend's exit:
	// its row locks go with it, as a killed process's do.
	var killed int
	if err := w.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 30000)) FROM pg_stat_activity
		WHERE application_name = $1 AND state LIKE 'idle in transaction%'`, victimApp).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminate the first relay's session: %d %v", killed, err)
	}
	w.drain(t, survivor)
	cancel()
	if err := <-dead; err == nil {
		t.Fatal("the killed relay reported success")
	}
	ids, _ := w.stored(t)
	onceEach(t, ids, "m_1:a:charged", "m_1:b:charged")
}

// fakeSource relays n rows a pass, or fails; it purges purged rows a
// purge, or fails with purgeErr.
type fakeSource struct {
	name     string
	n        int
	err      error
	passes   int
	purged   int
	purgeErr error
	purges   int
}

func (f *fakeSource) Name() string { return f.name }
func (f *fakeSource) Relay(context.Context, int) (int, error) {
	f.passes++
	return f.n, f.err
}
func (f *fakeSource) Purge(context.Context, time.Duration, int) (int, error) {
	f.purges++
	return f.purged, f.purgeErr
}

// TestOneRelayServesEverySource: a pass relays a batch of each source; one
// that fails does not keep the other from its batch, and the error names
// it; a full batch of any source is reported so the loop goes on at once.
func TestOneRelayServesEverySource(t *testing.T) {
	t.Parallel()
	bad := &fakeSource{name: "intake commands", err: errors.New("stream missing")}
	good := &fakeSource{name: "outcome events", n: 16}
	r, err := outbox.New(outbox.Config{BatchSize: 16}, bad, good)
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.RunOnce(context.Background())
	if err == nil || !strings.Contains(err.Error(), "relay intake commands: stream missing") {
		t.Errorf("pass error %v, want the failing source named", err)
	}
	if res.Relayed != 16 || !res.Full || good.passes != 1 || bad.passes != 1 {
		t.Errorf("pass %+v (passes %d, %d), want the other source's full batch", res, good.passes, bad.passes)
	}
	if _, err := outbox.New(outbox.Config{}); err == nil {
		t.Error("a relay of no source was made")
	}
}

// TestEachSourcePurgesOnItsOwn: a source's relayed rows are purged when
// its purge is due whatever the other sources do. A source whose relay
// fails every pass (a stream missing, a row it cannot publish) keeps
// neither its own purge nor the others' from running, and a source whose
// purge failed is retried on the next pass without purging the others
// again before their PurgeEvery.
func TestEachSourcePurgesOnItsOwn(t *testing.T) {
	t.Parallel()
	bad := &fakeSource{name: "intake commands", n: 3, err: errors.New("stream missing"), purged: 2}
	good := &fakeSource{name: "outcome events", n: 1, purged: 5, purgeErr: errors.New("statement timeout")}
	r, err := outbox.New(outbox.Config{BatchSize: 16, PurgeEvery: time.Hour}, bad, good)
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.RunOnce(context.Background())
	if err == nil || !strings.Contains(err.Error(), "relay intake commands: stream missing") ||
		!strings.Contains(err.Error(), "purge outcome events: statement timeout") {
		t.Errorf("pass error %v, want the failing relay and the failing purge named", err)
	}
	if bad.purges != 1 || good.purges != 1 || res.Purged != 7 {
		t.Fatalf("first pass purged %d rows (purges %d, %d), want each source's purge run beside a failing relay", res.Purged, bad.purges, good.purges)
	}
	good.purgeErr = nil
	res, _ = r.RunOnce(context.Background())
	if bad.purges != 1 || good.purges != 2 || res.Purged != 5 {
		t.Fatalf("second pass purged %d rows (purges %d, %d), want only the failed purge retried", res.Purged, bad.purges, good.purges)
	}
	res, _ = r.RunOnce(context.Background())
	if bad.purges != 1 || good.purges != 2 || res.Purged != 0 {
		t.Fatalf("third pass purged %d rows (purges %d, %d), want no purge before PurgeEvery", res.Purged, bad.purges, good.purges)
	}
}
