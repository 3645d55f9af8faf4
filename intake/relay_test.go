package intake_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/intake"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/localpg"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// TestRolledBackPublishesNothing: the publisher's transaction rolls back
// (its order with it): the relay finds nothing and the stream holds
// nothing.
func TestRolledBackPublishesNothing(t *testing.T) {
	t.Parallel()
	w := setup(t)
	if err := w.order("o1", 500, false); err != nil {
		t.Fatal(err)
	}
	w.drain(w.relay(w.pub))
	if n := w.count(`SELECT count(*) FROM intake_commands`); n != 0 {
		t.Errorf("%d intake rows after the rollback", n)
	}
	w.onceEach()
}

// TestCommittedChargedOnce: the order and its payment commit together; a
// relay publishes the command once under its own Nats-Msg-Id, and the
// worker charges it once. The same command sent by another path (the
// gateway's publisher) before the relay is stored once too.
func TestCommittedChargedOnce(t *testing.T) {
	t.Parallel()
	w := setup(t)
	sim := w.worker()
	if err := w.order("o1", 500, true); err != nil {
		t.Fatal(err)
	}
	if err := w.order("o2", 700, true); err != nil {
		t.Fatal(err)
	}
	o2 := command("o2", 700)
	if _, err := w.pub.Publish(w.ctx, &o2, nil, 0); err != nil {
		t.Fatal(err)
	}
	r := w.relay(w.pub)
	if err := r.Start(w.ctx); err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	w.eventually("both orders charged", func() bool {
		return w.count(`SELECT count(*) FROM payments WHERE merchant_id = 'm_1'`) == 2
	})
	w.eventually("the intake empty", func() bool { return w.backlog().Waiting == 0 })
	w.onceEach("o1", "o2")
	for _, k := range []string{"o1", "o2"} {
		if n := sim.ChargesByKey()["m_1:"+k]; n != 1 {
			t.Errorf("order %s charged %d times", k, n)
		}
	}
}

// failBefore is a relay killed after the publisher's commit and before
// its publish: it never sends.
type failBefore struct{}

func (failBefore) PublishCommands(_ context.Context, cmds []*payment.Command) ([]uint64, []error) {
	errs := make([]error, len(cmds))
	for i := range errs {
		errs[i] = errors.New("killed before the publish")
	}
	return make([]uint64, len(cmds)), errs
}

// holding takes its batch and never publishes: it waits until its relay
// is abandoned (its context cancelled).
type holding struct{ held chan<- int }

func (h holding) PublishCommands(ctx context.Context, cmds []*payment.Command) ([]uint64, []error) {
	h.held <- len(cmds)
	<-ctx.Done()
	errs := make([]error, len(cmds))
	for i := range errs {
		errs[i] = ctx.Err()
	}
	return make([]uint64, len(cmds)), errs
}

// TestRelayKilledBetweenCommitAndPublish: the publisher committed; the
// relay dies before its publish (an error, or abandoned while it holds the
// rows): the commands stay waiting, nothing is stored, and the next relay
// publishes each exactly once. A publisher that published after its own
// commit would have lost them.
func TestRelayKilledBetweenCommitAndPublish(t *testing.T) {
	t.Parallel()
	w := setup(t)
	for _, k := range []string{"o1", "o2", "o3"} {
		if err := w.order(k, 500, true); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := w.relay(failBefore{}).RunOnce(w.ctx); err == nil || res.Relayed != 0 {
		t.Fatalf("the killed relay: %+v %v", res, err)
	}
	held := make(chan int, 1)
	rctx, cancel := context.WithCancel(w.ctx)
	dead := make(chan error, 1)
	go func() {
		_, err := w.relay(holding{held}).RunOnce(rctx)
		dead <- err
	}()
	if n := <-held; n != 3 {
		t.Fatalf("the abandoned relay took %d commands, want 3", n)
	}
	if res, err := w.relay(w.pub).RunOnce(w.ctx); err != nil || res.Relayed != 0 {
		t.Fatalf("while another relay holds the rows: %+v %v, want nothing taken", res, err)
	}
	cancel()
	if err := <-dead; err == nil {
		t.Fatal("the abandoned relay reported success")
	}
	if b := w.backlog(); b.Waiting != 3 || b.Oldest.IsZero() {
		t.Fatalf("backlog %+v, want the three commands waiting", b)
	}
	w.onceEach()
	w.drain(w.relay(w.pub))
	w.onceEach("o1", "o2", "o3")
}

// lostAck publishes, and the answer is lost after the stream stored the
// commands.
type lostAck struct{ pub intake.Publisher }

func (l lostAck) PublishCommands(ctx context.Context, cmds []*payment.Command) ([]uint64, []error) {
	seqs, errs := l.pub.PublishCommands(ctx, cmds)
	for i := range seqs {
		if errs[i] == nil {
			seqs[i], errs[i] = 0, errors.New("no PubAck: the answer was lost")
		}
	}
	return seqs, errs
}

// TestRelayLosesPubAck: the stream stored the commands and the relay lost
// the PubAcks: nothing is marked, the next relay publishes them again
// under the same Nats-Msg-Id and the stream keeps one copy of each; each
// row holds the sequence of that copy.
func TestRelayLosesPubAck(t *testing.T) {
	t.Parallel()
	w := setup(t)
	for _, k := range []string{"o1", "o2"} {
		if err := w.order(k, 500, true); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := w.relay(lostAck{w.pub}).RunOnce(w.ctx); err == nil || res.Relayed != 0 {
		t.Fatalf("relay without PubAcks: %+v %v", res, err)
	}
	if b := w.backlog(); b.Waiting != 2 {
		t.Fatalf("backlog %+v, want both commands still waiting", b)
	}
	if n := len(w.stored()); n != 2 {
		t.Fatalf("the stream holds %d commands, want the two published", n)
	}
	w.drain(w.relay(w.pub))
	w.onceEach("o1", "o2")
}

// counting counts each command's publishes.
type counting struct {
	pub intake.Publisher
	mu  sync.Mutex
	n   map[string]int
}

func (c *counting) PublishCommands(ctx context.Context, cmds []*payment.Command) ([]uint64, []error) {
	c.mu.Lock()
	for _, cmd := range cmds {
		c.n[cmd.IdempotencyKey]++
	}
	c.mu.Unlock()
	return c.pub.PublishCommands(ctx, cmds)
}

// TestTwoRelaysRace: two relays on one intake publish every command once
// (each publish counted) and mark it once, with its stream sequence.
func TestTwoRelaysRace(t *testing.T) {
	t.Parallel()
	w := setup(t)
	var keys []string
	for i := range 300 {
		k := fmt.Sprintf("o%03d", i)
		keys = append(keys, k)
		if err := w.order(k, 100+int64(i), true); err != nil {
			t.Fatal(err)
		}
	}
	c := &counting{pub: w.pub, n: map[string]int{}}
	a, b := w.relay(c), w.relay(c)
	if err := a.Start(w.ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(w.ctx); err != nil {
		t.Fatal(err)
	}
	w.eventually("the intake empty", func() bool { return w.backlog().Waiting == 0 })
	a.Stop()
	b.Stop()
	for _, k := range keys {
		if c.n[k] != 1 {
			t.Errorf("command %s published %d times", k, c.n[k])
		}
	}
	w.onceEach(keys...)
}

// TestInvalidRowsRejectedNotBlocking: rows inserted by hand, past
// Enqueue's checks, are marked rejected with their reason, kept (a card
// number masked) and counted; the valid rows before and after them are
// published. Nothing is lost and nothing waits behind them.
func TestInvalidRowsRejectedNotBlocking(t *testing.T) {
	t.Parallel()
	w := setup(t)
	if err := w.order("o1", 500, true); err != nil {
		t.Fatal(err)
	}
	bad := []struct{ key, body, reason string }{
		{"b1", `{"merchant_id":"m_1","idempotency_key":"b1","amount":`, "malformed_json"},
		{"b2", `{"merchant_id":"m_1","idempotency_key":"b2","amount":100,"currency":"usd","payment_method":"pm_card_visa","description":"card 4242424242424242"}`, "card_data"},
		{"b3", `{"merchant_id":"m_2","idempotency_key":"b3","amount":100,"currency":"usd","payment_method":"pm_card_visa"}`, "merchant_mismatch"},
		{"b4", `{"merchant_id":"m_1","idempotency_key":"b4","amount":-5,"currency":"usd","payment_method":"pm_card_visa"}`, "invalid_amount"},
	}
	for _, b := range bad {
		if _, err := w.pool.Exec(w.ctx, `INSERT INTO intake_commands (merchant_id, idempotency_key, body) VALUES ('m_1', $1, $2)`, b.key, b.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.order("o2", 600, true); err != nil {
		t.Fatal(err)
	}
	r := w.relay(w.pub)
	res, err := r.RunOnce(w.ctx)
	if err != nil || res.Relayed != 6 {
		t.Fatalf("one pass: %+v %v, want all six rows settled", res, err)
	}
	w.onceEach("o1", "o2")
	for _, b := range bad {
		var reason, msg, body string
		if err := w.pool.QueryRow(w.ctx, `SELECT reject_reason, reject_error, body FROM intake_commands
			WHERE idempotency_key = $1 AND rejected_at IS NOT NULL AND relayed_at IS NULL`, b.key).Scan(&reason, &msg, &body); err != nil {
			t.Fatalf("row %s: %v", b.key, err)
		}
		if reason != b.reason || msg == "" {
			t.Errorf("row %s rejected as %q (%s), want %s", b.key, reason, msg, b.reason)
		}
		if b.reason == "card_data" && strings.Contains(body, "4242424242424242") {
			t.Errorf("the card number is kept in the rejected row: %s", body)
		}
	}
	if bl := w.backlog(); bl.Waiting != 0 || bl.Rejected != int64(len(bad)) {
		t.Errorf("backlog %+v, want none waiting and %d rejected", bl, len(bad))
	}
	// The retention purges relayed rows only.
	time.Sleep(5 * time.Millisecond)
	n, err := w.source(w.pub).Purge(w.ctx, time.Millisecond, 100)
	if err != nil || n != 2 {
		t.Fatalf("purge: %d %v, want the two relayed rows", n, err)
	}
	if left := w.count(`SELECT count(*) FROM intake_commands WHERE rejected_at IS NOT NULL`); left != len(bad) {
		t.Errorf("%d rejected rows left after the purge, want %d", left, len(bad))
	}
}

// TestPublisherRole: paydedup_publisher inserts commands and reads its own
// rows' fate, nothing else; paydedup_worker relays them.
func TestPublisherRole(t *testing.T) {
	t.Parallel()
	w := setup(t)
	if _, err := w.pool.Exec(w.ctx, `GRANT INSERT ON orders TO paydedup_publisher`); err != nil {
		t.Fatal(err)
	}
	pubPool := testenv.AsRole(t, w.url, "paydedup_publisher")
	tx, err := pubPool.Begin(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(w.ctx, `INSERT INTO orders (id, total) VALUES ('o1', 500)`); err != nil {
		t.Fatal(err)
	}
	if err := intake.Enqueue(w.ctx, tx, command("o1", 500)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(w.ctx); err != nil {
		t.Fatal(err)
	}
	// Another role's row: the publisher does not see it, and cannot
	// take its key.
	if _, err := w.pool.Exec(w.ctx, `INSERT INTO intake_commands (merchant_id, idempotency_key, body) VALUES ('m_1', 'other', '{}')`); err != nil {
		t.Fatal(err)
	}
	var seen int
	if err := pubPool.QueryRow(w.ctx, `SELECT count(*) FROM intake_commands`).Scan(&seen); err != nil || seen != 1 {
		t.Errorf("the publisher sees %d rows (%v), want its own one", seen, err)
	}
	tx, err = pubPool.Begin(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := intake.Enqueue(w.ctx, tx, command("other", 500)); !errors.Is(err, intake.ErrNotVisible) {
		t.Errorf("enqueue under another publisher's key: %v, want ErrNotVisible", err)
	}
	_ = tx.Rollback(w.ctx)
	testenv.Denied(t, pubPool, `UPDATE intake_commands SET relayed_at = now(), stream_seq = 1`)
	testenv.Denied(t, pubPool, `DELETE FROM intake_commands`)
	testenv.Denied(t, pubPool, `INSERT INTO intake_commands (merchant_id, idempotency_key, body, relayed_at, stream_seq) VALUES ('m_1', 'x', '{}', now(), 1)`)
	testenv.Denied(t, pubPool, `INSERT INTO intake_commands (merchant_id, idempotency_key, body, publisher) VALUES ('m_1', 'y', '{}', 'someone')`)
	testenv.Denied(t, pubPool, `SELECT count(*) FROM idempotency_keys`)

	workerStore, err := intake.NewStore(testenv.AsRole(t, w.url, "paydedup_worker"), 0)
	if err != nil {
		t.Fatal(err)
	}
	src, err := intake.NewSource(workerStore, w.pub, payment.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := src.Relay(w.ctx, 10); err != nil || n != 2 {
		t.Fatalf("the worker's relay: %d %v, want the command relayed and the other row rejected", n, err)
	}
	if _, err := src.Purge(w.ctx, time.Hour, 10); err != nil {
		t.Fatalf("the worker's purge: %v", err)
	}
	var seq *int64
	if err := pubPool.QueryRow(w.ctx, `SELECT stream_seq FROM intake_commands WHERE idempotency_key = 'o1'`).Scan(&seq); err != nil || seq == nil {
		t.Errorf("the publisher reads its command's fate: %v %v", seq, err)
	}
}

// TestRelayProcessKilledHoldingRows: a relay took the commands (their row
// locks held) and its process died before publishing: its database
// session is terminated, as when the process is killed. While it held
// them another relay skipped them; once it is gone, the other relay
// publishes each exactly once.
func TestRelayProcessKilledHoldingRows(t *testing.T) {
	t.Parallel()
	w := setup(t)
	for _, k := range []string{"o1", "o2"} {
		if err := w.order(k, 500, true); err != nil {
			t.Fatal(err)
		}
	}
	victimApp := "relay-" + testenv.Unique(t)
	u, err := localpg.WithAppName(w.url, victimApp)
	if err != nil {
		t.Fatal(err)
	}
	vpool, err := pg.Connect(w.ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer vpool.Close()
	victim, err := intake.NewStore(vpool, 0)
	if err != nil {
		t.Fatal(err)
	}
	vsrc, err := intake.NewSource(victim, nil, payment.Limits{})
	if err == nil || vsrc != nil {
		t.Fatal("a source without a publisher was made")
	}
	held := make(chan int, 1)
	rctx, cancel := context.WithCancel(w.ctx)
	defer cancel()
	dead := make(chan error, 1)
	go func() {
		src, err := intake.NewSource(victim, holding{held}, payment.Limits{})
		if err != nil {
			dead <- err
			return
		}
		_, err = src.Relay(rctx, 16)
		dead <- err
	}()
	if n := <-held; n != 2 {
		t.Fatalf("the first relay took %d commands, want 2", n)
	}
	survivor := w.relay(w.pub)
	if res, err := survivor.RunOnce(w.ctx); err != nil || res.Relayed != 0 {
		t.Fatalf("while the first relay holds the rows: %+v %v, want nothing taken", res, err)
	}
	// The timeout makes pg_terminate_backend wait for the backend's exit:
	// its row locks go with it, as a killed process's do.
	var killed int
	if err := w.pool.QueryRow(w.ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 30000)) FROM pg_stat_activity
		WHERE application_name = $1 AND state LIKE 'idle in transaction%'`, victimApp).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminate the first relay's session: %d %v", killed, err)
	}
	w.drain(survivor)
	cancel()
	if err := <-dead; err == nil {
		t.Fatal("the killed relay reported success")
	}
	w.onceEach("o1", "o2")
}

// TestReusedKeyInTheWindow: the gateway published another command under
// the key an intake row holds: the stream's duplicate window drops the
// relay's copy (it is not the stored command), so the row stays waiting;
// once the window has passed the relay publishes it, and the worker's
// claim dead-letters it as key_reused. The key's first command is charged,
// once; the intake's is never lost.
func TestReusedKeyInTheWindow(t *testing.T) {
	t.Parallel()
	w := setupWith(t, func(c *stream.Config) { c.DuplicateWindow = 9 * time.Second })
	sim := w.worker()
	first := command("o1", 500)
	if _, err := w.pub.Publish(w.ctx, &first, nil, 0); err != nil {
		t.Fatal(err)
	}
	if err := w.order("o1", 700, true); err != nil {
		t.Fatal(err)
	}
	r := w.relay(w.pub)
	if res, err := r.RunOnce(w.ctx); err == nil || !errors.Is(err, stream.ErrMsgIDTaken) || res.Relayed != 0 {
		t.Fatalf("relay of a key the window holds for another command: %+v %v", res, err)
	}
	if b := w.backlog(); b.Waiting != 1 {
		t.Fatalf("backlog %+v, want the row waiting", b)
	}
	w.eventually("the row relayed past the window", func() bool {
		_, _ = r.RunOnce(w.ctx)
		return w.backlog().Waiting == 0
	})
	w.eventually("the second command dead-lettered key_reused", func() bool {
		for _, m := range w.messages(w.cfg.DLQStream) {
			if m.Header.Get(stream.HeaderDLQReason) == stream.ReasonKeyReused {
				return true
			}
		}
		return false
	})
	if n := sim.ChargesByKey()["m_1:o1"]; n != 1 {
		t.Errorf("key charged %d times, want once", n)
	}
	var amount int64
	if err := w.pool.QueryRow(w.ctx, `SELECT amount FROM payments WHERE idempotency_key = 'o1'`).Scan(&amount); err != nil || amount != 500 {
		t.Errorf("ledger amount %d (%v), want the first command's 500", amount, err)
	}
}

// TestRejectedRowKeepsNoCardNumber: a row inserted by SQL whose key and
// merchant hold card numbers is rejected card_data, and nothing of the
// row (key, merchant, body, error) keeps the number.
func TestRejectedRowKeepsNoCardNumber(t *testing.T) {
	t.Parallel()
	w := setup(t)
	const pan = "4242424242424242"
	if _, err := w.pool.Exec(w.ctx, `INSERT INTO intake_commands (merchant_id, idempotency_key, body) VALUES ($1, $1, $2)`,
		pan, `{"merchant_id":"`+pan+`","idempotency_key":"`+pan+`","amount":5,"currency":"usd","payment_method":"pm_card_visa"}`); err != nil {
		t.Fatal(err)
	}
	w.drain(w.relay(w.pub))
	if n := w.count(`SELECT count(*) FROM intake_commands WHERE rejected_at IS NOT NULL`); n != 1 {
		t.Fatalf("%d rejected rows, want 1", n)
	}
	if n := w.count(`SELECT count(*) FROM intake_commands WHERE strpos(idempotency_key || merchant_id || body || coalesce(reject_error, ''), $1) > 0`, pan); n != 0 {
		t.Fatalf("%d rejected intake rows still hold the card number", n)
	}
}
