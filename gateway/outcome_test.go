package gateway_test

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// swallowedWorld is a world whose gateway publishes through a
// testenv.Link, with a 2 s publish timeout: while the link loses what the
// server sends, the PUB of a command reaches the server and its PubAck is
// lost (an fsync stall, a leader committing late, a link that dropped
// after the send); Restore drops the link, and the publisher reconnects.
func swallowedWorld(t *testing.T, cfg gateway.Config) (*world, *testenv.Link, *nats.Conn) {
	t.Helper()
	var link *testenv.Link
	var pubNC *nats.Conn
	w := setupWith(t, cfg, options{pubTimeout: 2 * time.Second, pubConn: func(t *testing.T, natsURL string) *nats.Conn {
		u, err := url.Parse(natsURL)
		if err != nil {
			t.Fatal(err)
		}
		link = testenv.NewLink(t, "gateway-nats", u.Host)
		nc, err := nats.Connect(link.URL("nats"), nats.Timeout(5*time.Second),
			nats.ReconnectWait(50*time.Millisecond), nats.MaxReconnects(-1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		pubNC = nc
		return nc
	}})
	return w, link, pubNC
}

// keyMsgs counts the stream's messages for a key of m_a.
func (w *world) keyMsgs(key string) int {
	w.t.Helper()
	n := 0
	for _, m := range w.storedMsgs() {
		if m.Header.Get(stream.HeaderIdempotencyKey) == key {
			n++
		}
	}
	return n
}

// TestLostPubAckIsUnknown: the stream stored the command but its PubAck
// never reached the gateway. The POST is 503 "outcome unknown" (never
// "not accepted"), GET never says not-accepted, the key stays bound to
// its payload (another is 422), and a retry with the same body is
// accepted without a second copy in the stream: the key is charged once.
func TestLostPubAckIsUnknown(t *testing.T) {
	t.Parallel()
	w, px, pubNC := swallowedWorld(t, gateway.Config{})
	w.batched()
	c := newOpenAPIChecker(t, w) // the new answers are documented
	body := payBody(100, "pm_card_visa")
	if err := px.Lose(testenv.ServerToClient); err != nil {
		t.Fatal(err)
	}
	r := c.exchange(true, http.MethodPost, "/v1/payments", w.keyA, body, map[string]string{"Idempotency-Key": "lost-ack"})
	if err := px.Restore(); err != nil { // the link drops after the send; the publisher reconnects
		t.Fatal(err)
	}
	wantStatus(t, r, http.StatusServiceUnavailable)
	if p := r.problem(t); p.Type != gateway.ProblemPublishUnknown ||
		!strings.Contains(p.Detail, "same Idempotency-Key and the same body") {
		t.Fatalf("the 503 of a lost PubAck: %+v, want the outcome unknown", p)
	}
	if r.header.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	if n := w.keyMsgs("lost-ack"); n != 1 {
		t.Fatalf("%d messages for the key, want the 1 the stream stored", n)
	}
	g := c.exchange(false, http.MethodGet, "/v1/payments/lost-ack", w.keyA, "", nil)
	wantStatus(t, g, http.StatusOK)
	if p := g.payment(t); p.Status != gateway.StatePublishUnknown || p.Amount != 100 {
		t.Fatalf("GET after the unknown publish: %+v", p)
	}
	w.eventually("the publisher reconnected", pubNC.IsConnected)

	r = w.post("lost-ack", payBody(150, "pm_card_visa"))
	wantStatus(t, r, http.StatusUnprocessableEntity)
	if p := r.problem(t); p.Type != gateway.ProblemKeyReused {
		t.Fatalf("a corrected body: %+v", p)
	}
	wantStatus(t, w.post("lost-ack", body), http.StatusAccepted)
	if n := w.keyMsgs("lost-ack"); n != 1 {
		t.Fatalf("%d messages for the key after the retry, want 1 (same Nats-Msg-Id)", n)
	}
	// The batched intake answers 202 once the PubAck is in and marks
	// the publish just after (TestBatchAcceptsBeforeThePublishMark).
	w.eventually("the retry's publish marked", func() bool { return w.intake("lost-ack").Published() })
	if in := w.intake("lost-ack"); in.Amount != 100 {
		t.Fatalf("intake after the retry: %+v", in)
	}
	w.startWorker()
	w.waitStatus("m_a", "lost-ack", ledger.StatusCompleted)
	if c := w.charges("m_a", "lost-ack"); c != 1 {
		t.Fatalf("%d charges, want 1", c)
	}
	r = w.post("lost-ack", body)
	wantStatus(t, r, http.StatusCreated)
	if p := r.payment(t); p.Amount != 100 || p.Status != gateway.StateSucceeded {
		t.Fatalf("replay: %+v", p)
	}
}

// TestMissingStreamFailsFast: with no payments stream (a gateway started
// before any worker), a POST is refused at once, not after the publish
// retries, with a 503 that says the stream does not exist and to start a
// worker; nothing was stored, so the key is free for a corrected retry.
func TestMissingStreamFailsFast(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, options{})
	w.batched()
	if err := w.js.DeleteStream(w.ctx, w.cfg.Stream.Name); err != nil {
		t.Fatal(err)
	}
	c := newOpenAPIChecker(t, w)
	start := time.Now()
	r := c.exchange(true, http.MethodPost, "/v1/payments", w.keyA, payBody(100, "pm_card_visa"), map[string]string{"Idempotency-Key": "no-stream"})
	took := time.Since(start)
	t.Logf("refused after %v", took)
	wantStatus(t, r, http.StatusServiceUnavailable)
	p := r.problem(t)
	if !strings.Contains(p.Detail, "does not exist") || !strings.Contains(p.Detail, "paydedup worker") {
		t.Fatalf("problem %+v: want the detail to say the stream does not exist and to start a worker", p)
	}
	if took > 2500*time.Millisecond {
		t.Fatalf("answered after %v: the publish was retried for a stream that does not exist", took)
	}
	if _, err := w.gwStore.GetIntake(w.ctx, "m_a", "no-stream"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("intake after a refusal: %v, want none (the key is free)", err)
	}
	if _, _, err := stream.EnsureStreams(w.ctx, w.js, w.cfg.Stream); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, w.post("no-stream", payBody(150, "pm_card_visa")), http.StatusAccepted)
}

// TestDuplicateOfAnotherPayload422: a command published straight on the
// queue holds the key's Nats-Msg-Id with another payload. The gateway's
// publish is answered by a duplicate PubAck that points to that message:
// it is not this command's publish, so the POST is 422, not 202. The same
// payload as the stored one is accepted.
func TestDuplicateOfAnotherPayload422(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, options{})
	w.batched()
	other := &payment.Command{MerchantID: "m_a", IdempotencyKey: "dup", Amount: 999, Currency: "usd",
		PaymentMethod: "pm_card_visa", Description: "order", Metadata: map[string]string{"order_id": "42"}}
	data, err := stream.EncodeCommand(other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.js.PublishMsg(w.ctx, stream.CommandMsg(w.cfg.Stream, "m_a", "dup", data)); err != nil {
		t.Fatal(err)
	}
	r := w.post("dup", payBody(100, "pm_card_visa"))
	wantStatus(t, r, http.StatusUnprocessableEntity)
	if p := r.problem(t); p.Type != gateway.ProblemKeyReused {
		t.Fatalf("problem %+v", p)
	}
	if n := w.keyMsgs("dup"); n != 1 {
		t.Fatalf("%d messages for the key, want 1", n)
	}
	wantStatus(t, w.post("dup", payBody(999, "pm_card_visa")), http.StatusAccepted)
	if n := w.keyMsgs("dup"); n != 1 {
		t.Fatalf("%d messages for the key, want 1", n)
	}
}

// TestRefusedRetryAfterAnUnknownPublishStaysUnknown: the first publish's
// PubAck is lost (the stream stored the command); the client's retry comes
// after the duplicate window, into a full stream, which refuses it. That
// refusal says nothing of the first copy: the answer stays "outcome
// unknown", the intake stays bound, GET never says not-accepted (a client
// told so pays again under a new key, and both copies are charged), and
// the stored copy is charged once.
func TestRefusedRetryAfterAnUnknownPublishStaysUnknown(t *testing.T) {
	t.Parallel()
	w, px, pubNC := swallowedWorld(t, gateway.Config{})
	w.batched()
	body := payBody(100, "pm_card_visa")
	if err := px.Lose(testenv.ServerToClient); err != nil {
		t.Fatal(err)
	}
	r := w.post("unknown-then-full", body)
	if err := px.Restore(); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, r, http.StatusServiceUnavailable)
	if n := w.keyMsgs("unknown-then-full"); n != 1 {
		t.Fatalf("%d messages for the key, want the 1 the stream stored", n)
	}
	w.eventually("the publisher reconnected", pubNC.IsConnected)

	// The duplicate window passes and the stream fills.
	s, err := w.js.Stream(w.ctx, w.cfg.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	full := info.Config
	full.Duplicates, full.MaxMsgs, full.Discard = 200*time.Millisecond, int64(info.State.Msgs), jetstream.DiscardNew
	if _, err := w.js.UpdateStream(w.ctx, full); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)

	r = w.post("unknown-then-full", body)
	wantStatus(t, r, http.StatusServiceUnavailable)
	if p := r.problem(t); p.Type != gateway.ProblemPublishUnknown {
		t.Fatalf("a refused retry after an unknown publish: %+v, want the outcome unknown", p)
	}
	g := w.do(http.MethodGet, "/v1/payments/unknown-then-full", w.keyA, "", nil)
	wantStatus(t, g, http.StatusOK)
	if p := g.payment(t); p.Status != gateway.StatePublishUnknown {
		t.Fatalf("GET after the refused retry: %+v, want publish_unknown", p)
	}

	full.MaxMsgs = info.Config.MaxMsgs
	if _, err := w.js.UpdateStream(w.ctx, full); err != nil {
		t.Fatal(err)
	}
	w.startWorker()
	w.waitStatus("m_a", "unknown-then-full", ledger.StatusCompleted)
	if c := w.charges("m_a", "unknown-then-full"); c != 1 {
		t.Fatalf("%d charges, want 1", c)
	}
}
