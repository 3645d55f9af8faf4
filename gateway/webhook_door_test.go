package gateway_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
	stripeadapter "github.com/paydedup/paydedup/provider/stripe"
)

// A Stripe-Signature with two t= is refused, in either order: stripe-go
// verifies the HMAC with the last t=, so a check of the first would let a
// signature made an hour ahead through (the future side is ours to check).
// One t= signed now is served; the event is not ours, so 200 not_ours.
func TestWebhookRefusesTwoTimestamps(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, options{webhookSecret: webhookSecret})
	body := intentEvent("evt_t", "payment_intent.succeeded", "pi_elsewhere", "succeeded", 900, map[string]string{"order": "7"})
	now, ahead := time.Now(), time.Now().Add(time.Hour)
	signedAhead := signHMAC(body, webhookSecret, ahead) // t=<ahead>,v1=<sig over ahead>
	_, v1Ahead, _ := strings.Cut(signedAhead, ",")
	signedNow := signHMAC(body, webhookSecret, now)
	_, v1Now, _ := strings.Cut(signedNow, ",")
	for name, sig := range map[string]string{
		"now first, signed ahead":   fmt.Sprintf("t=%d,t=%d,%s", now.Unix(), ahead.Unix(), v1Ahead),
		"ahead first, signed ahead": fmt.Sprintf("t=%d,t=%d,%s", ahead.Unix(), now.Unix(), v1Ahead),
		"now first, signed now":     fmt.Sprintf("t=%d,t=%d,%s", now.Unix(), ahead.Unix(), v1Now),
		"ahead first, signed now":   fmt.Sprintf("t=%d,t=%d,%s", ahead.Unix(), now.Unix(), v1Now),
		"twice the same t":          fmt.Sprintf("t=%d,t=%d,%s", now.Unix(), now.Unix(), v1Now),
		"t after v1, signed ahead":  fmt.Sprintf("t=%d,%s,t=%d", now.Unix(), v1Ahead, ahead.Unix()),
	} {
		if code, res := w.webhook(body, sig); code != http.StatusBadRequest {
			t.Errorf("%s: %d %q, want 400", name, code, res)
		}
	}
	if code, res := w.webhook(body, stripesim.SignWebhook(body, webhookSecret, now)); code != http.StatusOK || res != gateway.WebhookNotOurs {
		t.Fatalf("one t=: %d %q, want 200 %q", code, res, gateway.WebhookNotOurs)
	}
}

// signWith signs body at t with each secret, as Stripe signs during a roll
// of the endpoint's secret: one t=, a v1= per secret.
func signWith(body []byte, at time.Time, secrets ...string) string {
	sig := fmt.Sprintf("t=%d", at.Unix())
	for _, s := range secrets {
		_, v1, _ := strings.Cut(signHMAC(body, s, at), ",")
		sig += "," + v1
	}
	return sig
}

// rollingVerifier is the gateway's verifier across a rolling restart: each
// call goes to the verifier of the configuration the pod that answers runs,
// alternating between the old and the new while both run.
type rollingVerifier struct {
	mu    sync.Mutex
	pods  []*stripeadapter.WebhookVerifier
	calls int
}

func (r *rollingVerifier) set(t *testing.T, secrets ...string) {
	t.Helper()
	var pods []*stripeadapter.WebhookVerifier
	for _, s := range secrets {
		v, err := stripeadapter.NewWebhookVerifier(s, 0)
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, v)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pods = pods
}

func (r *rollingVerifier) pod() *stripeadapter.WebhookVerifier {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	return r.pods[r.calls%len(r.pods)]
}

func (r *rollingVerifier) CheckSignature(sig string) error { return r.pod().CheckSignature(sig) }

func (r *rollingVerifier) Verify(body []byte, sig string) (provider.Event, error) {
	return r.pod().Verify(body, sig)
}

// The endpoint's secret is rolled while events flow, as docs/operations.md
// says: Stripe signs with the old and the new secret; the gateways restart
// one by one with STRIPE_WEBHOOK_SECRET=new,old; the overlap ends and
// Stripe signs with the new one only; the old is dropped. A stream of
// events runs throughout, and each phase settles a processing payment: no
// event is refused, every payment settles.
func TestWebhookSecretRotationLosesNoEvent(t *testing.T) {
	t.Parallel()
	const oldSecret, newSecret = "whsec_rotation_old", "whsec_rotation_new"
	rv := &rollingVerifier{}
	rv.set(t, oldSecret)
	w := setupWith(t, gateway.Config{}, options{webhookSecret: "whsec_simulator_unused", webhookVerifier: rv, processingDelay: time.Hour})
	w.startWorker()
	type step struct {
		name     string
		stripe   []string // the secrets Stripe signs with
		gateways []string // STRIPE_WEBHOOK_SECRET of each running gateway
	}
	steps := []step{
		{"before the roll", []string{oldSecret}, []string{oldSecret}},
		{"Stripe rolls the secret (24 h overlap)", []string{oldSecret, newSecret}, []string{oldSecret}},
		{"rolling restart with new,old", []string{oldSecret, newSecret}, []string{oldSecret, newSecret + "," + oldSecret}},
		{"every gateway on new,old", []string{oldSecret, newSecret}, []string{newSecret + "," + oldSecret}},
		{"the overlap ends", []string{newSecret}, []string{newSecret + "," + oldSecret}},
		{"old secret dropped", []string{newSecret}, []string{newSecret}},
	}
	var pays []ledger.Payment
	for i := range steps {
		key := fmt.Sprintf("rot-%d", i)
		wantStatus(t, w.post(key, payBody(int64(1000+i), "pm_usBankAccount_success"), "Prefer", "wait=10"), http.StatusCreated)
		w.eventually("payment processing", func() bool {
			p, err := w.store.GetPayment(w.ctx, "m_a", key)
			return err == nil && p.Status == ledger.PaymentProcessing
		})
		pays = append(pays, w.payment("m_a", key))
	}

	var signing atomic.Pointer[[]string]
	signing.Store(&steps[0].stripe)
	var sent, refused atomic.Int64
	stop := make(chan struct{})
	flowDone := make(chan struct{})
	go func() {
		defer close(flowDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			body := intentEvent(fmt.Sprintf("evt_flow_%d", i), "payment_intent.succeeded", "pi_elsewhere", "succeeded", 1, map[string]string{"order": "7"})
			r, err := w.req(w.ctx, http.MethodPost, gateway.PathStripeWebhooks, "", string(body),
				map[string]string{gateway.HeaderStripeSignature: signWith(body, time.Now(), *signing.Load()...)})
			sent.Add(1)
			if err != nil || r.status != http.StatusOK {
				refused.Add(1)
			}
		}
	}()
	for i, s := range steps {
		signing.Store(&s.stripe)
		rv.set(t, s.gateways...)
		from := sent.Load()
		w.eventually("events flow in step "+s.name, func() bool { return sent.Load() >= from+20 })
		p := pays[i]
		ev := intentEvent(fmt.Sprintf("evt_settle_%d", i), "payment_intent.succeeded", p.ChargeID, "succeeded", p.Amount,
			map[string]string{"merchant_id": "m_a", "idempotency_key": p.IdempotencyKey})
		if code, res := w.webhook(ev, signWith(ev, time.Now(), s.stripe...)); code != http.StatusOK || res != gateway.WebhookSettled {
			t.Errorf("%s: settling event answered %d %q, want 200 %q", s.name, code, res, gateway.WebhookSettled)
		}
	}
	close(stop)
	<-flowDone
	if n := refused.Load(); n != 0 {
		t.Fatalf("%d of %d events refused during the rotation", n, sent.Load())
	}
	for _, p := range pays {
		if got := w.payment("m_a", p.IdempotencyKey); got.Status != ledger.PaymentSucceeded {
			t.Errorf("payment %s: %s, want succeeded", p.IdempotencyKey, got.Status)
		}
	}
	t.Logf("%d events, none refused", sent.Load())

	// The order matters: a gateway on the new secret alone while Stripe
	// still signs with the old one only refuses the event.
	rv.set(t, newSecret)
	body := intentEvent("evt_early", "payment_intent.succeeded", "pi_elsewhere", "succeeded", 1, nil)
	if code, _ := w.webhook(body, signWith(body, time.Now(), oldSecret)); code != http.StatusBadRequest {
		t.Fatalf("new secret only, signed with the old: %d, want 400", code)
	}
}

// rawPost writes a webhook POST's head and the first part of its body on
// a connection of its own and leaves the rest unsent, as a slow or hostile
// client does; it returns the status of the answer, which must come within
// three seconds (the read timeout is 15 s), while the body is still open.
func (w *world) rawPost(sig string, declared int, part []byte) int {
	w.t.Helper()
	hdr := ""
	if sig != "" {
		hdr = gateway.HeaderStripeSignature + ": " + sig + "\r\n"
	}
	return w.rawRequest(gateway.PathStripeWebhooks, hdr, declared, part)
}

// rawRequest is rawPost to path with the header lines hdr.
func (w *world) rawRequest(path, hdr string, declared int, part []byte) int {
	w.t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(w.base, "http://"))
	if err != nil {
		w.t.Fatal(err)
	}
	defer conn.Close()
	head := "POST " + path + " HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n" + hdr
	if declared >= 0 {
		head += fmt.Sprintf("Content-Length: %d\r\n\r\n", declared)
	} else {
		head += "Transfer-Encoding: chunked\r\n\r\n"
		part = fmt.Appendf(nil, "%x\r\n%s\r\n", len(part), part)
	}
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := conn.Write(append([]byte(head), part...)); err != nil {
		w.t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		w.t.Fatalf("no answer while the body is unfinished: %v", err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// The webhook checks the signature header before it reads a body, reads at
// most MaxBodyBytes + WebhookEnvelopeBytes of it, and answers a larger one
// 413 while the client is still sending; nothing is parsed before the
// signature verifies.
func TestWebhookBodyBoundedBeforeVerification(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, options{webhookSecret: webhookSecret})
	limit := 64<<10 + gateway.WebhookEnvelopeBytes // the default command limit + the envelope
	good := signHMAC([]byte("x"), webhookSecret, time.Now())

	// A header no body can make verify: 400 before any of the body, which
	// is never sent.
	twoT := fmt.Sprintf("t=%d,%s", time.Now().Unix(), good)
	for name, sig := range map[string]string{"unsigned": "", "two t=": twoT,
		"an hour old": signHMAC([]byte("x"), webhookSecret, time.Now().Add(-time.Hour))} {
		if code := w.rawPost(sig, 10<<10, nil); code != http.StatusBadRequest {
			t.Errorf("%s, body unsent: %d, want 400", name, code)
		}
	}
	// A well-formed header: a body declared over the limit is 413 unread;
	// one sent chunked is 413 as soon as the limit is passed.
	if code := w.rawPost(good, limit+1, nil); code != http.StatusRequestEntityTooLarge {
		t.Errorf("declared %d bytes: %d, want 413", limit+1, code)
	}
	if code := w.rawPost(good, -1, bytes.Repeat([]byte("a"), limit+1)); code != http.StatusRequestEntityTooLarge {
		t.Errorf("chunked, %d bytes and more to come: %d, want 413", limit+1, code)
	}
	// The same for a payment: 413 once past the limit, not after the
	// client sends the rest.
	auth := "Authorization: Bearer " + w.keyA + "\r\nIdempotency-Key: big-1\r\n"
	if code := w.rawRequest("/v1/payments", auth, -1, bytes.Repeat([]byte("a"), 64<<10+1)); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a payment, chunked, over the limit and more to come: %d, want 413", code)
	}
	// A body that is not JSON under a signature that does not verify is a
	// bad signature, not a parse error.
	code, _ := w.webhook([]byte("{not json"), good)
	if code != http.StatusBadRequest || w.webhookResults(gateway.WebhookBadSignature) != 4 {
		t.Errorf("unsigned garbage: %d, bad_signature %v, want 400 and 4", code, w.webhookResults(gateway.WebhookBadSignature))
	}
	// An event at the limit is read and verified.
	ev := intentEvent("evt_big", "payment_intent.succeeded", "pi_elsewhere", "succeeded", 1, map[string]string{"order": "7"})
	ev = append(ev[:len(ev)-1], []byte(`,"pad":"`+strings.Repeat("p", limit-len(ev)-10)+`"}`)...)
	if code, res := w.webhook(ev, stripesim.SignWebhook(ev, webhookSecret, time.Now())); code != http.StatusOK || res != gateway.WebhookNotOurs {
		t.Errorf("an event of %d bytes: %d %q, want 200 %q", len(ev), code, res, gateway.WebhookNotOurs)
	}
}
