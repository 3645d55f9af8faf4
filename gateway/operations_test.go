package gateway_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// refunder is the world's options for a worker that refunds: the
// provider itself, not the charge gate (which has no refunds).
func refunder() options {
	return options{charger: func(c consumer.Charger) consumer.Charger { return c.(*gatedCharger).next }}
}

// postOp sends POST /v1/payments/{payment}/{op} as merchant A under key.
func (w *world) postOp(payment, op, key, body string) response {
	w.t.Helper()
	return w.do(http.MethodPost, "/v1/payments/"+payment+"/"+op, w.keyA, body, map[string]string{"Idempotency-Key": key})
}

func (r response) operation(t *testing.T) gateway.Operation {
	t.Helper()
	var op gateway.Operation
	if err := json.Unmarshal(r.body, &op); err != nil {
		t.Fatalf("operation body %s: %v", r.body, err)
	}
	return op
}

// charged posts a payment and waits for it to succeed.
func (w *world) charged(key string, amount int64) {
	w.t.Helper()
	r := w.post(key, payBody(amount, "pm_card_visa"), "Prefer", "wait=20")
	wantStatus(w.t, r, http.StatusCreated)
}

// refundRow waits for the refund's row to be final and returns it.
func (w *world) refundFinal(key string) ledger.Refund {
	w.t.Helper()
	var ref ledger.Refund
	w.eventually("refund "+key+" final", func() bool {
		got, err := w.gwStore.GetRefund(w.ctx, "m_a", key)
		ref = got
		return err == nil && got.Final()
	})
	return ref
}

// TestRefundThroughTheDoor: a refund posted to the door is published
// once, refunded once by the worker, and shown: its own GET, the
// payment's lifecycle (partially_refunded, then refunded with the rest),
// and a retry of the same key and body replays it. Another amount under
// the key, and the key for another operation, are 422, never a replay.
func TestRefundThroughTheDoor(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, refunder())
	w.startWorker()
	w.charged("pay-1", 5000)

	r := w.postOp("pay-1", "refunds", "ref-1", `{"amount":1200}`)
	wantStatus(t, r, http.StatusAccepted)
	if op := r.operation(t); op.Object != gateway.ObjectRefund || op.Status != gateway.StateQueued || op.Amount != 1200 || op.PaymentKey != "pay-1" {
		t.Fatalf("202 body %+v", op)
	}
	if loc := r.header.Get("Location"); loc != "/v1/refunds/ref-1" {
		t.Fatalf("Location %q", loc)
	}
	if ref := w.refundFinal("ref-1"); ref.Status != ledger.RefundSucceeded || ref.Amount != 1200 {
		t.Fatalf("refund row %+v", ref)
	}
	g := w.do(http.MethodGet, "/v1/refunds/ref-1", w.keyA, "", nil)
	wantStatus(t, g, http.StatusOK)
	if op := g.operation(t); op.Status != gateway.OpSucceeded || op.Amount != 1200 || op.RefundID == "" {
		t.Fatalf("GET refund %+v", op)
	}
	p := w.do(http.MethodGet, "/v1/payments/pay-1", w.keyA, "", nil).payment(t)
	if p.Status != gateway.StatePartiallyRefunded || p.AmountRefunded == nil || *p.AmountRefunded != 1200 ||
		p.AmountReceived == nil || *p.AmountReceived != 5000 || len(p.Refunds) != 1 || p.Refunds[0].IdempotencyKey != "ref-1" {
		t.Fatalf("GET payment %+v", p)
	}

	again := w.postOp("pay-1", "refunds", "ref-1", `{"amount":1200}`)
	wantStatus(t, again, http.StatusOK)
	if again.header.Get(gateway.HeaderIdempotentReplay) != "true" || again.operation(t).Status != gateway.OpSucceeded {
		t.Fatalf("replay %s %v", again.body, again.header)
	}
	for _, c := range []struct{ op, key, body string }{
		{"refunds", "ref-1", `{"amount":1300}`}, // another amount
		{"refunds", "ref-1", ``},                // the rest, not 1200
		{"capture", "ref-1", `{"amount":1200}`}, // another operation
		{"cancel", "ref-1", ``},
		{"refunds", "pay-1", `{"amount":1200}`}, // the payment's own key
	} {
		r := w.postOp("pay-1", c.op, c.key, c.body)
		if c.op != "refunds" && r.status == http.StatusBadRequest && r.problem(t).Reason == string(payment.ReasonInvalidKind) {
			continue // this version's worker takes no captures or cancels: refused at the door
		}
		if r.status != http.StatusUnprocessableEntity || r.problem(t).Type != gateway.ProblemKeyReused {
			t.Fatalf("%s %s %s: %d %s, want 422 key reused", c.op, c.key, c.body, r.status, r.body)
		}
	}
	// The rest of it.
	wantStatus(t, w.postOp("pay-1", "refunds", "ref-2", ``), http.StatusAccepted)
	if ref := w.refundFinal("ref-2"); ref.Status != ledger.RefundSucceeded || ref.Amount != 3800 {
		t.Fatalf("refund of the rest %+v", ref)
	}
	p = w.do(http.MethodGet, "/v1/payments/pay-1", w.keyA, "", nil).payment(t)
	if p.Status != gateway.StateRefunded || *p.AmountRefunded != 5000 || len(p.Refunds) != 2 {
		t.Fatalf("GET payment after the rest %+v", p)
	}
	if n := len(w.sim.Refunds()); n != 2 {
		t.Fatalf("%d refunds at the provider, want 2", n)
	}
	if n := w.keyMsgs("ref-1"); n != 1 {
		t.Fatalf("%d copies of ref-1 in the stream, want 1", n)
	}

	// A replay answers from the worker's row, before any batch re-checks
	// the API key: a key revoked since it was last used gets nothing.
	key2 := w.apiKey("m_a")
	replay := func() response {
		return w.do(http.MethodPost, "/v1/payments/pay-1/refunds", key2, `{"amount":1200}`, map[string]string{"Idempotency-Key": "ref-1"})
	}
	wantStatus(t, replay(), http.StatusOK)
	if _, err := w.gwStore.RevokeAPIKey(w.ctx, key2); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, replay(), http.StatusUnauthorized)
}

// TestRefundOverRefundableRefusedWithReason: the ledger's rule is the
// worker's: a refund over what is left is published, refused by the
// worker (never sent), and its GET and its retry say why.
func TestRefundOverRefundableRefusedWithReason(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, refunder())
	w.startWorker()
	w.charged("pay-o", 1000)
	wantStatus(t, w.postOp("pay-o", "refunds", "ref-o", `{"amount":1001}`), http.StatusAccepted)
	var op gateway.Operation
	w.eventually("the refusal shown", func() bool {
		op = w.do(http.MethodGet, "/v1/refunds/ref-o", w.keyA, "", nil).operation(t)
		return op.Status == gateway.OpRefused
	})
	if op.Reason != ledger.RefuseOverRefundable {
		t.Fatalf("GET refused refund %+v, want reason %s", op, ledger.RefuseOverRefundable)
	}
	r := w.postOp("pay-o", "refunds", "ref-o", `{"amount":1001}`)
	if r.status != http.StatusUnprocessableEntity || r.problem(t).Reason != ledger.RefuseOverRefundable {
		t.Fatalf("retry of a refused refund: %d %s", r.status, r.body)
	}
	if r := w.postOp("pay-o", "refunds", "ref-o", `{"amount":10}`); r.status != http.StatusUnprocessableEntity || r.problem(t).Type != gateway.ProblemKeyReused {
		t.Fatalf("another refund under a refused refund's key: %d %s, want 422 key reused", r.status, r.body)
	}
	if n := len(w.sim.Refunds()); n != 0 {
		t.Fatalf("%d refunds at the provider, want 0", n)
	}
}

// TestOperationDoorInput: bad input is refused at the door, naming the
// field; an unknown payment is 404; nothing is published.
func TestOperationDoorInput(t *testing.T) {
	t.Parallel()
	w := setup(t, gateway.Config{})
	wantStatus(t, w.post("pay-i", payBody(900, "pm_card_visa")), http.StatusAccepted)
	for _, c := range []struct {
		op, body string
		status   int
		field    string
	}{
		{"refunds", `{"amount":0}`, http.StatusUnprocessableEntity, "amount"},
		{"refunds", `{"amount":-5}`, http.StatusUnprocessableEntity, "amount"},
		{"refunds", `{"amount":1.5}`, http.StatusUnprocessableEntity, "amount"},
		{"refunds", `{"amount":"100"}`, http.StatusUnprocessableEntity, "amount"},
		{"capture", `{"amount":0}`, http.StatusUnprocessableEntity, "amount"},
		{"refunds", `{"amount":100,"reason":"x"}`, http.StatusBadRequest, "reason"},
		{"refunds", `{"amount":1,"amount":2}`, http.StatusBadRequest, "amount"},
		{"cancel", `{"amount":100}`, http.StatusBadRequest, "amount"},
		{"refunds", `[1]`, http.StatusBadRequest, ""},
	} {
		r := w.postOp("pay-i", c.op, "bad-"+c.op, c.body)
		if r.status != c.status || r.problem(t).Field != c.field {
			t.Errorf("%s %s: %d %s, want %d naming %q", c.op, c.body, r.status, r.body, c.status, c.field)
		}
	}
	if r := w.postOp("no-such", "refunds", "ref-n", `{"amount":100}`); r.status != http.StatusNotFound {
		t.Errorf("refund of an unknown payment: %d %s, want 404", r.status, r.body)
	}
	b := w.do(http.MethodPost, "/v1/payments/pay-i/refunds", w.keyB, `{"amount":100}`, map[string]string{"Idempotency-Key": "ref-b"})
	if b.status != http.StatusNotFound {
		t.Errorf("refund of another merchant's payment: %d %s, want 404", b.status, b.body)
	}
	if r := w.do(http.MethodPost, "/v1/payments/pay-i/refunds", w.keyA, `{}`, nil); r.status != http.StatusBadRequest {
		t.Errorf("refund without Idempotency-Key: %d %s, want 400", r.status, r.body)
	}
	if n := w.streamMsgs(); n != 1 {
		t.Fatalf("%d messages in the stream, want the payment's only", n)
	}
}

// TestRefundDoorReplaysFirstAnswer: before any worker runs, the same key
// and body is the door's in-flight answer (409), another body 422, and a
// GET of the payment's key never shows the refund's row, nor a GET of the
// refund's the payment's.
func TestRefundDoorReplaysFirstAnswer(t *testing.T) {
	t.Parallel()
	w := setup(t, gateway.Config{})
	wantStatus(t, w.post("pay-q", payBody(900, "pm_card_visa")), http.StatusAccepted)
	wantStatus(t, w.postOp("pay-q", "refunds", "ref-q", `{"amount":100}`), http.StatusAccepted)
	if r := w.postOp("pay-q", "refunds", "ref-q", `{"amount":100}`); r.status != http.StatusConflict {
		t.Fatalf("same key and body in flight: %d %s, want 409", r.status, r.body)
	}
	if r := w.postOp("pay-q", "refunds", "ref-q", `{"amount":101}`); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("same key, another amount: %d %s, want 422", r.status, r.body)
	}
	if r := w.post("ref-q", payBody(100, "pm_card_visa")); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("the refund's key as a payment's: %d %s, want 422", r.status, r.body)
	}
	g := w.do(http.MethodGet, "/v1/refunds/ref-q", w.keyA, "", nil)
	wantStatus(t, g, http.StatusOK)
	if op := g.operation(t); op.Status != gateway.StateQueued || op.Amount != 100 {
		t.Fatalf("GET queued refund %+v", op)
	}
	if r := w.postOp("ref-q", "refunds", "ref-qq", ``); r.status != http.StatusNotFound {
		t.Fatalf("a refund of a refund: %d %s, want 404", r.status, r.body)
	}
	if r := w.do(http.MethodGet, "/v1/payments/ref-q", w.keyA, "", nil); r.status != http.StatusNotFound {
		t.Fatalf("GET payment of a refund's key: %d %s, want 404", r.status, r.body)
	}
	if r := w.do(http.MethodGet, "/v1/refunds/pay-q", w.keyA, "", nil); r.status != http.StatusNotFound {
		t.Fatalf("GET refund of a payment's key: %d %s, want 404", r.status, r.body)
	}
	if r := w.do(http.MethodGet, "/v1/refunds/ref-q", w.keyB, "", nil); r.status != http.StatusNotFound {
		t.Fatalf("GET of another merchant's refund: %d %s, want 404", r.status, r.body)
	}
	if n := w.keyMsgs("ref-q"); n != 1 {
		t.Fatalf("%d copies of the refund in the stream, want 1", n)
	}
}

// TestTwoDoorsRaceOneRefundKey: two gateways take the same refund (same
// key, same body) at once: one publish, and once the worker refunded it,
// both doors answer the same refund, refunded once.
func TestTwoDoorsRaceOneRefundKey(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, refunder())
	w.startWorker()
	w.charged("pay-r", 3000)
	other := w.secondGateway()

	const n = 8
	var wg sync.WaitGroup
	statuses := make([]int, n)
	for i := range n {
		wg.Go(func() {
			base := w.base
			if i%2 == 1 {
				base = other
			}
			r, err := w.reqTo(base, http.MethodPost, "/v1/payments/pay-r/refunds", `{"amount":700}`, "ref-r")
			if err != nil {
				t.Error(err)
				return
			}
			statuses[i] = r.status
		})
	}
	wg.Wait()
	accepted := 0
	for _, s := range statuses {
		switch s {
		case http.StatusAccepted:
			accepted++
		case http.StatusConflict, http.StatusOK:
		default:
			t.Fatalf("answers %v: want 202, 409 or a replay", statuses)
		}
	}
	if accepted > 1 {
		t.Fatalf("answers %v: more than one 202", statuses)
	}
	if got := w.keyMsgs("ref-r"); got != 1 {
		t.Fatalf("%d copies of the refund in the stream, want 1", got)
	}
	w.refundFinal("ref-r")
	var bodies []string
	for _, base := range []string{w.base, other} {
		r, err := w.reqTo(base, http.MethodPost, "/v1/payments/pay-r/refunds", `{"amount":700}`, "ref-r")
		if err != nil {
			t.Fatal(err)
		}
		wantStatus(t, r, http.StatusOK)
		bodies = append(bodies, string(r.body))
	}
	if bodies[0] != bodies[1] {
		t.Fatalf("the doors answer differently:\n%s\n%s", bodies[0], bodies[1])
	}
	if got := len(w.sim.Refunds()); got != 1 {
		t.Fatalf("%d refunds at the provider, want 1", got)
	}
}

// TestRefundAnswerLostRetryAnswersAsFirst: the client→gateway boundary
// for a refund: its POST is published and the client's connection cut
// before the answer. The retry with the same key and body answers the
// one refund, refunded once.
func TestRefundAnswerLostRetryAnswersAsFirst(t *testing.T) {
	t.Parallel()
	cp := &cutPublisher{key: "ref-l"}
	opt := refunder()
	opt.pub = func(p gateway.Publisher) gateway.Publisher { cp.Publisher = p; return cp }
	w := setupWith(t, gateway.Config{}, opt)
	w.startWorker()
	w.charged("pay-l", 2500)
	px := testenv.NewFrontProxy(t, strings.TrimPrefix(w.base, "http://"))
	cut := func() {
		if n := px.CutClients(); n != 1 {
			t.Errorf("cut %d client connections, want 1", n)
		}
	}
	cp.onPublish.Store(&cut)

	errc := make(chan error, 1)
	go func() {
		r, err := http.NewRequestWithContext(w.ctx, http.MethodPost, px.URL()+"/v1/payments/pay-l/refunds", strings.NewReader(`{"amount":900}`))
		if err != nil {
			errc <- err
			return
		}
		r.Header.Set("Authorization", "Bearer "+w.keyA)
		r.Header.Set("Idempotency-Key", "ref-l")
		r.Header.Set("Content-Type", "application/json")
		resp, err := (&http.Client{Transport: &http.Transport{}}).Do(r)
		if err == nil {
			_ = resp.Body.Close()
		}
		errc <- err
	}()
	if err := <-errc; err == nil {
		t.Fatal("the first POST got an answer; want its connection cut before one")
	}
	ref := w.refundFinal("ref-l")
	r := w.postOp("pay-l", "refunds", "ref-l", `{"amount":900}`)
	wantStatus(t, r, http.StatusOK)
	if op := r.operation(t); op.Status != gateway.OpSucceeded || op.RefundID != ref.RefundID {
		t.Fatalf("retry %+v, want the refund %s", op, ref.RefundID)
	}
	if n := len(w.sim.Refunds()); n != 1 {
		t.Fatalf("%d refunds at the provider, want 1", n)
	}
	if n := w.keyMsgs("ref-l"); n != 1 {
		t.Fatalf("%d copies of the refund in the stream, want 1", n)
	}
}

// cutPublisher runs onPublish after the PubAck of key's command, before
// the gateway can answer it (its publishes are one at a time: it has no
// batch publish).
type cutPublisher struct {
	gateway.Publisher
	key       string
	onPublish atomic.Pointer[func()]
}

func (p *cutPublisher) Publish(ctx context.Context, cmd *payment.Command, extra map[string]string, republish int) (uint64, error) {
	seq, err := p.Publisher.Publish(ctx, cmd, extra, republish)
	if f := p.onPublish.Load(); f != nil && err == nil && cmd.IdempotencyKey == p.key {
		(*f)()
	}
	return seq, err
}

// secondGateway serves another gateway on the world's database and
// stream, as a second pod would, and returns its base URL.
func (w *world) secondGateway() string {
	t := w.t
	t.Helper()
	comp, err := pgstore.NewListener(w.pool, pgstore.ListenerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := stream.NewCommandPublisher(w.nc, w.cfg.Stream, 0)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(w.store, w.gwStore, comp, pub, gateway.Config{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(w.ctx)
	served, listened := make(chan error, 1), make(chan struct{})
	go func() { defer close(listened); _ = comp.Run(ctx) }()
	go func() { served <- gw.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("second gateway: %v", err)
		}
		<-listened
	})
	return "http://" + ln.Addr().String()
}

// reqTo sends a POST or GET as merchant A to the gateway at base, with
// key as its Idempotency-Key (none when empty).
func (w *world) reqTo(base, method, path, body, key string) (response, error) {
	r, err := http.NewRequestWithContext(w.ctx, method, base+path, strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	r.Header.Set("Authorization", "Bearer "+w.keyA)
	r.Header.Set("Content-Type", "application/json")
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	resp, err := w.client.Do(r)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: b}, err
}

// laterKinds is the publisher of a version whose worker takes captures
// and cancels: it publishes them as the stream's command (the stream's
// own check refuses them in this version) and leaves every other
// command to the real publisher.
type laterKinds struct {
	gateway.Publisher
	js  jetstream.JetStream
	cfg stream.Config
}

func later(cmd *payment.Command) bool {
	return cmd.Kind == payment.KindCapture || cmd.Kind == payment.KindCancel
}

func (p *laterKinds) Check(cmd *payment.Command, extra map[string]string) error {
	if later(cmd) {
		return nil
	}
	return p.Publisher.Check(cmd, extra)
}

func (p *laterKinds) Publish(ctx context.Context, cmd *payment.Command, extra map[string]string, republish int) (uint64, error) {
	if !later(cmd) {
		return p.Publisher.Publish(ctx, cmd, extra, republish)
	}
	data, err := stream.EncodeCommand(cmd)
	if err != nil {
		return 0, err
	}
	ack, err := p.js.PublishMsg(ctx, stream.CommandMsg(p.cfg, cmd.MerchantID, cmd.IdempotencyKey, data))
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// TestCaptureAndCancelDoorsBindTheirKeys: the capture and cancel doors,
// before any worker: each publishes its command once (kind, payment_key,
// amount), a retry of the same key and body is 409 in flight, and its key
// is bound to it: another amount, the other operation or a refund under
// it is 422, and its GET shows it queued on its own route only.
func TestCaptureAndCancelDoorsBindTheirKeys(t *testing.T) {
	t.Parallel()
	var lk *laterKinds
	w := setupWith(t, gateway.Config{}, options{pub: func(p gateway.Publisher) gateway.Publisher {
		lk = &laterKinds{Publisher: p}
		return lk
	}})
	lk.js, lk.cfg = w.js, w.cfg.Stream
	wantStatus(t, w.post("pay-a", `{"amount":800,"currency":"usd","payment_method":"pm_card_visa","capture_method":"manual"}`), http.StatusAccepted)

	r := w.postOp("pay-a", "capture", "cap-1", `{"amount":500}`)
	wantStatus(t, r, http.StatusAccepted)
	if op := r.operation(t); op.Object != gateway.ObjectCapture || op.Status != gateway.StateQueued || op.Amount != 500 ||
		r.header.Get("Location") != "/v1/captures/cap-1" {
		t.Fatalf("capture: %+v, Location %q", op, r.header.Get("Location"))
	}
	r = w.postOp("pay-a", "cancel", "can-1", ``)
	wantStatus(t, r, http.StatusAccepted)
	if op := r.operation(t); op.Object != gateway.ObjectCancel || r.header.Get("Location") != "/v1/cancels/can-1" {
		t.Fatalf("cancel: %+v, Location %q", op, r.header.Get("Location"))
	}
	wantStatus(t, w.postOp("pay-a", "capture", "cap-1", `{"amount":500}`), http.StatusConflict)
	wantStatus(t, w.postOp("pay-a", "cancel", "can-1", `{}`), http.StatusConflict)
	for _, c := range []struct{ op, key, body string }{
		{"capture", "cap-1", `{"amount":501}`},
		{"capture", "cap-1", ``},
		{"cancel", "cap-1", ``},
		{"refunds", "cap-1", `{"amount":500}`},
		{"capture", "can-1", ``},
	} {
		if r := w.postOp("pay-a", c.op, c.key, c.body); r.status != http.StatusUnprocessableEntity || r.problem(t).Type != gateway.ProblemKeyReused {
			t.Fatalf("%s %s %s: %d %s, want 422 key reused", c.op, c.key, c.body, r.status, r.body)
		}
	}
	g := w.do(http.MethodGet, "/v1/captures/cap-1", w.keyA, "", nil)
	wantStatus(t, g, http.StatusOK)
	if op := g.operation(t); op.Status != gateway.StateQueued || op.Amount != 500 {
		t.Fatalf("GET capture %+v", op)
	}
	wantStatus(t, w.do(http.MethodGet, "/v1/cancels/can-1", w.keyA, "", nil), http.StatusOK)
	wantStatus(t, w.do(http.MethodGet, "/v1/payments/cap-1", w.keyA, "", nil), http.StatusNotFound)
	for _, key := range []string{"cap-1", "can-1"} {
		if n := w.keyMsgs(key); n != 1 {
			t.Fatalf("%d copies of %s in the stream, want 1", n, key)
		}
	}
	var got payment.Command
	for _, m := range w.storedMsgs() {
		if m.Header.Get(stream.HeaderIdempotencyKey) == "cap-1" {
			if err := json.Unmarshal(m.Data, &got); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got.Kind != payment.KindCapture || got.PaymentKey != "pay-a" || got.Amount != 500 || got.MerchantID != "m_a" {
		t.Fatalf("the capture's command %+v", got)
	}
}
