package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// flakyPublisher counts publishes and has the stream refuse the first fail
// of them (nothing stored).
type flakyPublisher struct {
	gateway.Publisher
	fail  atomic.Int64
	calls atomic.Int64
}

func (p *flakyPublisher) Publish(ctx context.Context, cmd *payment.Command, extra map[string]string, republish int) (uint64, error) {
	p.calls.Add(1)
	if p.fail.Add(-1) >= 0 {
		return 0, fmt.Errorf("injected: %w", stream.ErrRefused)
	}
	return p.Publisher.Publish(ctx, cmd, extra, republish)
}

// storedMsgs returns the stored messages of the payments stream.
func (w *world) storedMsgs() []*nats.Msg {
	w.t.Helper()
	s, err := w.js.Stream(w.ctx, w.cfg.Stream.Name)
	if err != nil {
		w.t.Fatal(err)
	}
	info, err := s.Info(w.ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	var out []*nats.Msg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		raw, err := s.GetMsg(w.ctx, seq)
		if err != nil {
			continue // deleted
		}
		out = append(out, &nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
	}
	return out
}

func (w *world) intake(key string) ledger.Intake {
	w.t.Helper()
	in, err := w.gwStore.GetIntake(w.ctx, "m_a", key)
	if err != nil {
		w.t.Fatalf("intake %s: %v", key, err)
	}
	return in
}

// TestKeyWithSurroundingSpaceRejected: NATS trims header values, so a
// quoted key with a leading or trailing space would reach the worker as
// another key (and share a Nats-Msg-Id with it). The gateway refuses it
// before anything is taken in or published.
func TestKeyWithSurroundingSpaceRejected(t *testing.T) {
	t.Parallel()
	w := setup(t, gateway.Config{})
	for _, key := range []string{`"k "`, `" k"`, `"	k"`} {
		r := w.post(key, payBody(100, "pm_card_visa"))
		wantStatus(t, r, http.StatusBadRequest)
		if p := r.problem(t); p.Reason != string(payment.ReasonInvalidKey) || p.Field != "Idempotency-Key" {
			t.Fatalf("%s: problem %+v", key, p)
		}
	}
	if n := w.count(`SELECT count(*) FROM gateway_intake`); n != 0 {
		t.Fatalf("%d intake rows", n)
	}
	if n := w.streamMsgs(); n != 0 {
		t.Fatalf("%d messages published", n)
	}
}

// TestPublishedBytesAreTheValidatedBytes: the message is encoded without
// HTML escaping, so a body full of <>& is charged rather than growing
// six-fold past the worker's limit; a body whose message would still exceed
// the worker's limit is 413 before anything is published.
func TestPublishedBytesAreTheValidatedBytes(t *testing.T) {
	t.Parallel()
	w := setup(t, gateway.Config{})
	w.startWorker()

	meta := make([]string, 0, 40)
	for i := range 40 {
		meta = append(meta, fmt.Sprintf(`"k%02d":"%s"`, i, strings.Repeat("<>&", 166)))
	}
	body := `{"amount":300,"currency":"usd","payment_method":"pm_card_visa","description":"` + strings.Repeat("&", 1000) +
		`","metadata":{` + strings.Join(meta, ",") + `}}`
	if len(body) < 20<<10 {
		t.Fatalf("body is only %d bytes", len(body))
	}
	r := w.post("html", body, "Prefer", "wait=15")
	wantStatus(t, r, http.StatusCreated)
	msgs := w.storedMsgs()
	if len(msgs) != 1 || len(msgs[0].Data) > len(body)+200 || strings.Contains(string(msgs[0].Data), `\u003c`) {
		t.Fatalf("%d messages; the published body is %d bytes for a %d-byte POST", len(msgs), len(msgs[0].Data), len(body))
	}

	// U+2028 is always escaped by encoding/json (3 bytes become 6): 33 KB
	// of it passes the HTTP limit but the message would not pass the
	// worker's.
	meta = meta[:0]
	for i := range 22 {
		meta = append(meta, fmt.Sprintf(`"k%02d":"%s"`, i, strings.Repeat("\u2028", 500)))
	}
	big := `{"amount":300,"currency":"usd","payment_method":"pm_card_visa","metadata":{` + strings.Join(meta, ",") + `}}`
	r = w.post("sep", big)
	wantStatus(t, r, http.StatusRequestEntityTooLarge)
	if p := r.problem(t); p.Reason != string(payment.ReasonBodyTooLarge) {
		t.Fatalf("problem %+v", p)
	}
	if _, err := w.gwStore.GetIntake(w.ctx, "m_a", "sep"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("intake of a refused request: %v", err)
	}
	if n := w.streamMsgs(); n != 1 {
		t.Fatalf("%d messages published, want 1", n)
	}
}

// TestDeadLetterIsTerminalAtTheGateway: a command the worker dead-letters
// (here its limit on amounts is lower than the gateway's) makes the intake
// terminal: GET and every retried POST answer the final 4xx with the
// worker's reason, and nothing is published again.
func TestDeadLetterIsTerminalAtTheGateway(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{PublishLease: time.Second, RepublishAfter: time.Second},
		options{worker: func(c *consumer.Config) { c.Stream.Limits.MaxAmount = 1000 }})
	w.startWorker()
	body := payBody(5000, "pm_card_visa")
	wantStatus(t, w.post("big", body), http.StatusAccepted)

	var last response
	w.eventually("GET answers the dead letter's reason", func() bool {
		last = w.do(http.MethodGet, "/v1/payments/big", w.keyA, "", nil)
		return last.status == http.StatusBadRequest
	})
	if p := last.problem(t); p.Reason != string(payment.ReasonAmountOverLimit) {
		t.Fatalf("GET problem %+v", p)
	}
	first := w.intake("big")
	w.eventually("past the republish hold", func() bool { return time.Now().After(first.LockedUntil.Add(100 * time.Millisecond)) })
	for range 2 {
		r := w.post("big", body)
		wantStatus(t, r, http.StatusBadRequest)
		if p := r.problem(t); p.Reason != string(payment.ReasonAmountOverLimit) {
			t.Fatalf("POST problem %+v", p)
		}
	}
	if in := w.intake("big"); in.Attempt != 1 {
		t.Fatalf("republished: attempt %d", in.Attempt)
	}
	if n := w.streamMsgs(); n != 1 {
		t.Fatalf("%d messages, want 1", n)
	}

	// A POST waiting for its outcome is woken by the dead letter.
	start := time.Now()
	r := w.post("big-wait", body, "Prefer", "wait=20")
	wantStatus(t, r, http.StatusBadRequest)
	if p := r.problem(t); p.Reason != string(payment.ReasonAmountOverLimit) {
		t.Fatalf("waiting POST problem %+v", p)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the waiting POST answered after %v, not woken by the dead letter", d)
	}
}

// TestRefusedPublishIsNotAccepted: after a publish the stream refused
// (503, nothing stored), GET says the payment was not accepted (404, at
// once even with Prefer: wait) and a corrected retry is accepted. (A
// publish with an unknown outcome keeps the key: TestLostPubAckIsUnknown.)
func TestRefusedPublishIsNotAccepted(t *testing.T) {
	t.Parallel()
	var pub *flakyPublisher
	w := setupWith(t, gateway.Config{}, options{pub: func(p gateway.Publisher) gateway.Publisher {
		pub = &flakyPublisher{Publisher: p}
		pub.fail.Store(1)
		return pub
	}})
	r := w.post("once", payBody(100, "pm_card_visa"))
	wantStatus(t, r, http.StatusServiceUnavailable)

	start := time.Now()
	g := w.do(http.MethodGet, "/v1/payments/once", w.keyA, "", map[string]string{"Prefer": "wait=5"})
	wantStatus(t, g, http.StatusNotFound)
	g.problem(t)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("GET of a payment never published waited %v", d)
	}
	r = w.post("once", payBody(150, "pm_card_visa"))
	wantStatus(t, r, http.StatusAccepted)
	if p := r.payment(t); p.Amount != 150 || p.Status != gateway.StateQueued {
		t.Fatalf("payment %+v", p)
	}
	g = w.do(http.MethodGet, "/v1/payments/once", w.keyA, "", nil)
	wantStatus(t, g, http.StatusOK)
	if n := w.streamMsgs(); n != 1 {
		t.Fatalf("%d messages, want 1", n)
	}
}

// TestRepublishOnlyWhenTheStreamLostIt: while no worker consumes, a retry
// after the republish hold finds the message still in the stream and
// publishes nothing; once the message is gone, the retry publishes again
// and the stream stores the new copy.
func TestRepublishOnlyWhenTheStreamLostIt(t *testing.T) {
	t.Parallel()
	var pub *flakyPublisher
	w := setupWith(t, gateway.Config{PublishLease: time.Second, RepublishAfter: time.Second},
		options{pub: func(p gateway.Publisher) gateway.Publisher { pub = &flakyPublisher{Publisher: p}; return pub }})
	body := payBody(100, "pm_card_visa")
	wantStatus(t, w.post("backlog", body), http.StatusAccepted)
	in := w.intake("backlog")
	w.eventually("past the republish hold", func() bool { return time.Now().After(in.LockedUntil.Add(100 * time.Millisecond)) })
	r := w.post("backlog", body)
	wantStatus(t, r, http.StatusConflict)
	if n := pub.calls.Load(); n != 1 {
		t.Fatalf("%d publishes while the first copy is in the stream, want 1", n)
	}

	s, err := w.js.Stream(w.ctx, w.cfg.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteMsg(w.ctx, 1); err != nil {
		t.Fatal(err)
	}
	in = w.intake("backlog")
	w.eventually("past the hold again", func() bool { return time.Now().After(in.LockedUntil.Add(100 * time.Millisecond)) })
	wantStatus(t, w.post("backlog", body), http.StatusAccepted)
	if n := pub.calls.Load(); n != 2 {
		t.Fatalf("%d publishes after the message was lost, want 2", n)
	}
	if n := w.streamMsgs(); n != 1 {
		t.Fatalf("the republished copy was not stored: %d messages", n)
	}
	w.startWorker()
	w.waitStatus("m_a", "backlog", ledger.StatusCompleted)
	if c := w.charges("m_a", "backlog"); c != 1 {
		t.Fatalf("%d charges", c)
	}
}

// TestReusedKeyAfterPurge422: once a key's record and intake are purged,
// the payments ledger still knows the key; a POST with another amount or
// currency is 422 before anything is published.
func TestReusedKeyAfterPurge422(t *testing.T) {
	t.Parallel()
	w, h := setupHeld(t, gateway.Config{BatchSize: 2, BatchWindow: 500 * time.Millisecond, Flushers: 1}, options{})
	w.startWorker()
	wantStatus(t, w.post("old", payBody(1000, "pm_card_visa"), "Prefer", "wait=15"), http.StatusCreated)
	// Retention purged the record and the intake; the ledger keeps the row.
	for _, q := range []string{`DELETE FROM idempotency_keys`, `DELETE FROM gateway_intake`} {
		if _, err := w.pool.Exec(w.ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for _, body := range []string{payBody(2000, "pm_card_visa"), strings.Replace(payBody(1000, "pm_card_visa"), `"usd"`, `"eur"`, 1)} {
		r := w.post("old", body)
		wantStatus(t, r, http.StatusUnprocessableEntity)
		if p := r.problem(t); p.Type != gateway.ProblemKeyReused {
			t.Fatalf("problem %+v", p)
		}
	}
	if n := w.streamMsgs(); n != 1 {
		t.Fatalf("%d messages, want 1", n)
	}
	// Decided by the ledger row, before any publish: not by the stream's
	// duplicate window refusing another payload under the key's id.
	if n := w.publishes(); n != 1 {
		t.Fatalf("%v publishes, want only the first payment's", n)
	}
	// Two POSTs of the ledger's own payload in one batch: both are decided
	// by their reads (the key has a ledger row), and of the two only the
	// one that took the intake in is 202.
	body := payBody(1000, "pm_card_visa")
	codes := map[int]int{}
	for _, r := range w.inOneBatch(h, []string{"old", "old"}, []string{body, body}, []string{w.keyA, w.keyA}) {
		codes[r.status]++
	}
	if codes[http.StatusAccepted] != 1 || codes[http.StatusConflict] != 1 {
		t.Fatalf("two POSTs of a purged key in one batch: answers %v, want one 202 and one 409", codes)
	}
}

// lostMarkStore loses every publish mark, as a gateway that crashed after
// its PubAcks (or PostgreSQL losing the mark, committed without waiting for
// its WAL flush) leaves the intake: published, but not marked so.
type lostMarkStore struct{ *pgstore.Store }

func (s lostMarkStore) IntakesPublished(context.Context, []ledger.Published, time.Duration) ([]bool, error) {
	return nil, errors.New("injected: the publish mark is lost")
}

// TestLostMarkAnotherPayloadIs422: a 202 whose publish mark was lost
// leaves an intake that looks never published. Once its lease passes it
// cannot be told from a publisher that died before or after its PubAck,
// so the key stays bound to its payload: another payload is 422 (had it
// taken the key over, its 202 would stand beside the first's, and whichever
// the worker took first, one client would read the other's amount), and a
// retry of the same payload is 202 with no second copy in the stream (the
// same Nats-Msg-Id). The first payload is charged once.
func TestLostMarkAnotherPayloadIs422(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{PublishLease: 300 * time.Millisecond, RepublishAfter: time.Second},
		options{store: func(s gateway.Store) gateway.Store { return lostMarkStore{s.(*pgstore.Store)} }})
	w.batched()
	body := payBody(100, "pm_card_visa")
	wantStatus(t, w.post("lost-mark", body), http.StatusAccepted)
	first := w.intake("lost-mark")
	w.eventually("past the publish lease", func() bool { return time.Now().After(first.LockedUntil.Add(100 * time.Millisecond)) })
	r := w.post("lost-mark", payBody(999, "pm_card_visa"))
	wantStatus(t, r, http.StatusUnprocessableEntity)
	if p := r.problem(t); p.Type != gateway.ProblemKeyReused {
		t.Fatalf("another payload after a lost mark: %+v", p)
	}
	g := w.do(http.MethodGet, "/v1/payments/lost-mark", w.keyA, "", nil)
	wantStatus(t, g, http.StatusOK)
	if p := g.payment(t); p.Amount != 100 {
		t.Fatalf("GET after a lost mark: %+v", p)
	}
	wantStatus(t, w.post("lost-mark", body), http.StatusAccepted)
	if n := w.keyMsgs("lost-mark"); n != 1 {
		t.Fatalf("%d messages for the key, want 1: the retry's copy is the first's (same Nats-Msg-Id)", n)
	}
	w.startWorker()
	w.waitStatus("m_a", "lost-mark", ledger.StatusCompleted)
	if rec, _ := w.store.Get(w.ctx, "m_a", "lost-mark"); rec.Amount != 100 {
		t.Fatalf("completed %d, want the first payload's 100", rec.Amount)
	}
	if c := w.charges("m_a", "lost-mark"); c != 1 {
		t.Fatalf("%d charges, want 1", c)
	}
}

// publishes is how many publishes the gateway attempted, whatever their
// result (paydedup_gateway_publishes_total).
func (w *world) publishes() float64 {
	w.t.Helper()
	fams, err := w.reg.Gather()
	if err != nil {
		w.t.Fatal(err)
	}
	n := 0.0
	for _, f := range fams {
		if f.GetName() == "paydedup_gateway_publishes_total" {
			for _, m := range f.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}
