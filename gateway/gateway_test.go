package gateway_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/ledger"
)

// TestStatusCodes walks the status-code table over real HTTP, first with
// no worker (so keys stay queued), then with one.
func TestStatusCodes(t *testing.T) {
	t.Parallel()
	w := setup(t, gateway.Config{})
	good := payBody(1999, "pm_card_visa")

	t.Run("401 without or with a wrong API key", func(t *testing.T) {
		for _, key := range []string{"", "pd_000000000000_" + strings.Repeat("A", 43), "not-a-key"} {
			r := w.do(http.MethodPost, "/v1/payments", key, good, map[string]string{"Idempotency-Key": "k"})
			wantStatus(t, r, http.StatusUnauthorized)
			r.problem(t)
			if !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
				t.Fatalf("WWW-Authenticate %q", r.header.Get("WWW-Authenticate"))
			}
		}
	})

	t.Run("400 missing or malformed Idempotency-Key", func(t *testing.T) {
		r := w.do(http.MethodPost, "/v1/payments", w.keyA, good, nil)
		wantStatus(t, r, http.StatusBadRequest)
		if p := r.problem(t); p.Type != gateway.ProblemMissingKey {
			t.Fatalf("type %s", p.Type)
		}
		for _, bad := range []string{"", strings.Repeat("k", 256), "caf\u00e9", `"unterminated`, `"a"b`} {
			r := w.post(bad, good)
			wantStatus(t, r, http.StatusBadRequest)
			r.problem(t)
		}
		req, _ := http.NewRequest(http.MethodPost, w.base+"/v1/payments", strings.NewReader(good))
		req.Header.Set("Authorization", "Bearer "+w.keyA)
		req.Header.Add("Idempotency-Key", "one")
		req.Header.Add("Idempotency-Key", "two")
		resp, err := w.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("two Idempotency-Key headers: %d", resp.StatusCode)
		}
	})

	t.Run("400 invalid body names the field", func(t *testing.T) {
		cases := []struct{ body, field, reason string }{
			{payBody(0, "pm_card_visa"), "amount", "invalid_amount"},
			{strings.Replace(good, `"usd"`, `"USD"`, 1), "currency", "invalid_currency"},
			{strings.Replace(good, `{`, `{"merchant_id":"m_b",`, 1), "merchant_id", "unknown_field"},
			{strings.Replace(good, `{`, `{"colour":"red",`, 1), "colour", "unknown_field"},
			{strings.Replace(good, `{`, `{"idempotency_key":"other",`, 1), "idempotency_key", "key_mismatch"},
			{`{"amount":`, "", "malformed_json"},
			{`[]`, "", "malformed_json"},
		}
		for _, c := range cases {
			r := w.post("bad-body", c.body)
			wantStatus(t, r, http.StatusBadRequest)
			p := r.problem(t)
			if p.Field != c.field || p.Reason != c.reason {
				t.Errorf("%s: field %q reason %q, want %q %q", c.body, p.Field, p.Reason, c.field, c.reason)
			}
		}
		r := w.post("big", `{"description":"`+strings.Repeat("x", 70<<10)+`"}`)
		wantStatus(t, r, http.StatusRequestEntityTooLarge)
		r.problem(t)
		r = w.post("text", good, "Content-Type", "text/plain")
		wantStatus(t, r, http.StatusUnsupportedMediaType)
		r.problem(t)
		if n := w.count(`SELECT count(*) FROM gateway_intake`); n != 0 {
			t.Fatalf("%d intake rows after rejected requests", n)
		}
	})

	t.Run("202 for a new key, 409 while queued, GET shows it queued", func(t *testing.T) {
		r := w.post("k1", good)
		wantStatus(t, r, http.StatusAccepted)
		if loc := r.header.Get("Location"); loc != "/v1/payments/k1" {
			t.Fatalf("Location %q", loc)
		}
		if p := r.payment(t); p.Status != gateway.StateQueued || p.Amount != 1999 || p.IdempotencyKey != "k1" {
			t.Fatalf("payment %+v", p)
		}
		r = w.post("k1", good)
		wantStatus(t, r, http.StatusConflict)
		r.problem(t)
		if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 {
			t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
		}
		r = w.post("k1", payBody(2000, "pm_card_visa"))
		wantStatus(t, r, http.StatusUnprocessableEntity)
		r = w.do(http.MethodGet, "/v1/payments/k1", w.keyA, "", nil)
		wantStatus(t, r, http.StatusOK)
		if p := r.payment(t); p.Status != gateway.StateQueued {
			t.Fatalf("GET: %+v", p)
		}
		if n := w.streamMsgs(); n != 1 {
			t.Fatalf("%d messages published, want 1", n)
		}
	})

	w.startWorker()

	t.Run("completed key replays the stored outcome", func(t *testing.T) {
		w.waitStatus("m_a", "k1", ledger.StatusCompleted)
		r1 := w.post("k1", good)
		wantStatus(t, r1, http.StatusCreated)
		if r1.header.Get("Idempotent-Replayed") != "true" {
			t.Fatal("no Idempotent-Replayed: true on a replay")
		}
		p := r1.payment(t)
		if p.Status != gateway.StateSucceeded || p.ChargeID == "" || p.Outcome == nil || p.Outcome.Status != 200 {
			t.Fatalf("replayed payment %+v", p)
		}
		// JSON field order and whitespace do not change the fingerprint.
		r2 := w.post("k1", `{ "metadata": {"order_id": "42"}, "description": "order", "payment_method": "pm_card_visa", "currency": "usd", "amount": 1999 }`)
		wantStatus(t, r2, http.StatusCreated)
		if !bytes.Equal(r1.body, r2.body) {
			t.Fatalf("replays differ:\n%s\n%s", r1.body, r2.body)
		}
		r := w.do(http.MethodGet, "/v1/payments/k1", w.keyA, "", nil)
		wantStatus(t, r, http.StatusOK)
		if g := r.payment(t); g.Status != gateway.StateSucceeded || g.ChargeID != p.ChargeID {
			t.Fatalf("GET %+v", g)
		}
		if n := w.charges("m_a", "k1"); n != 1 {
			t.Fatalf("%d charges", n)
		}
	})

	t.Run("422 for the same key with another payload", func(t *testing.T) {
		r := w.post("k1", payBody(2000, "pm_card_visa"))
		wantStatus(t, r, http.StatusUnprocessableEntity)
		if p := r.problem(t); p.Type != gateway.ProblemKeyReused {
			t.Fatalf("type %s", p.Type)
		}
	})

	t.Run("402 for a decline, replayed", func(t *testing.T) {
		body := payBody(500, "pm_card_chargeDeclined")
		r := w.post("dec", body, "Prefer", "wait=20")
		wantStatus(t, r, http.StatusPaymentRequired)
		if r.header.Get("Idempotent-Replayed") != "" {
			t.Fatal("the first answer is not a replay")
		}
		if p := r.payment(t); p.Status != gateway.StateDeclined || p.Outcome == nil || p.Outcome.Status != 402 {
			t.Fatalf("decline %+v", p)
		}
		r2 := w.post("dec", body)
		wantStatus(t, r2, http.StatusPaymentRequired)
		if r2.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.body, r2.body) {
			t.Fatalf("decline replay: %v %s", r2.header, r2.body)
		}
	})

	t.Run("409 while the worker holds the key", func(t *testing.T) {
		w.gate.hold("slow")
		defer w.gate.release("slow")
		wantStatus(t, w.post("slow", good), http.StatusAccepted)
		w.waitStatus("m_a", "slow", ledger.StatusPending)
		r := w.post("slow", good)
		wantStatus(t, r, http.StatusConflict)
		if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 || ra > 60 {
			t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
		}
		g := w.do(http.MethodGet, "/v1/payments/slow", w.keyA, "", nil)
		if p := g.payment(t); p.Status != gateway.StateProcessing {
			t.Fatalf("GET while held: %+v", p)
		}
		w.gate.release("slow")
		w.waitStatus("m_a", "slow", ledger.StatusCompleted)
		wantStatus(t, w.post("slow", good), http.StatusCreated)
	})

	t.Run("unknown routes and methods are problems", func(t *testing.T) {
		r := w.do(http.MethodDelete, "/v1/payments/k1", w.keyA, "", nil)
		wantStatus(t, r, http.StatusMethodNotAllowed)
		r.problem(t)
		r = w.do(http.MethodGet, "/v2/nothing", w.keyA, "", nil)
		wantStatus(t, r, http.StatusNotFound)
		r.problem(t)
	})
}

// TestConcurrentIdenticalPosts: 20 identical first requests at once make
// one publish and one charge; every other answer is 409 or a replay.
func TestConcurrentIdenticalPosts(t *testing.T) {
	t.Parallel()
	w := setup(t, gateway.Config{})
	w.startWorker()
	body := payBody(4200, "pm_card_visa")
	const n = 20
	fire := func() []response {
		var (
			wg    sync.WaitGroup
			start = make(chan struct{})
			out   = make([]response, n)
			errs  = make([]error, n)
		)
		for i := range n {
			wg.Go(func() {
				<-start
				out[i], errs[i] = w.req(w.ctx, http.MethodPost, "/v1/payments", w.keyA, body, map[string]string{"Idempotency-Key": "same"})
			})
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	accepted := 0
	for _, r := range fire() {
		switch {
		case r.status == http.StatusAccepted:
			accepted++
		case r.status == http.StatusConflict && r.header.Get("Retry-After") != "":
		case r.status == http.StatusCreated && r.header.Get("Idempotent-Replayed") == "true":
		default:
			t.Fatalf("unexpected answer %d %v %s", r.status, r.header, r.body)
		}
	}
	if accepted != 1 {
		t.Fatalf("%d requests accepted, want exactly 1", accepted)
	}
	w.waitStatus("m_a", "same", ledger.StatusCompleted)
	// Once completed, every concurrent retry is the same replay.
	var first []byte
	for _, r := range fire() {
		wantStatus(t, r, http.StatusCreated)
		if first == nil {
			first = r.body
		} else if !bytes.Equal(first, r.body) {
			t.Fatalf("replays differ")
		}
	}
	if m := w.streamMsgs(); m != 1 {
		t.Fatalf("%d messages published, want 1", m)
	}
	if c := w.charges("m_a", "same"); c != 1 {
		t.Fatalf("%d charges, want 1", c)
	}
	if l := w.count(`SELECT count(*) FROM payments`); l != 1 {
		t.Fatalf("%d ledger rows, want 1", l)
	}
}

// TestPreferWait: the outcome comes back in the POST once the worker
// completes it, woken by NOTIFY; 202 when the wait runs out; GET can wait.
func TestPreferWait(t *testing.T) {
	t.Parallel()
	w := setup(t, gateway.Config{})
	w.startWorker()
	body := payBody(700, "pm_card_visa")

	start := time.Now()
	r := w.post("w1", body, "Prefer", "respond-async, wait=20")
	wantStatus(t, r, http.StatusCreated)
	if r.header.Get("Idempotent-Replayed") != "" || r.header.Get("Preference-Applied") != "wait=20" {
		t.Fatalf("headers %v", r.header)
	}
	if p := r.payment(t); p.Status != gateway.StateSucceeded || p.ChargeID == "" {
		t.Fatalf("payment %+v", p)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("took %v", d)
	}

	w.gate.hold("w2")
	defer w.gate.release("w2")
	start = time.Now()
	r = w.post("w2", body, "Prefer", "wait=1")
	wantStatus(t, r, http.StatusAccepted)
	if d := time.Since(start); d < time.Second {
		t.Fatalf("answered after %v, before the wait ran out", d)
	}
	if p := r.payment(t); p.Status != gateway.StateQueued && p.Status != gateway.StateProcessing {
		t.Fatalf("payment %+v", p)
	}
	if r.header.Get("Location") != "/v1/payments/w2" {
		t.Fatalf("Location %q", r.header.Get("Location"))
	}
	// A GET with Prefer: wait answers as soon as the worker completes.
	got := make(chan response, 1)
	go func() {
		r, err := w.req(w.ctx, http.MethodGet, "/v1/payments/w2", w.keyA, "", map[string]string{"Prefer": "wait=25"})
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	w.waitStatus("m_a", "w2", ledger.StatusPending)
	w.gate.release("w2")
	select {
	case r = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("GET with Prefer: wait did not return after completion")
	}
	wantStatus(t, r, http.StatusOK)
	if p := r.payment(t); p.Status != gateway.StateSucceeded {
		t.Fatalf("GET after wait: %+v", p)
	}
}

// TestHTTPAndQueueSameKey: one key arriving both over HTTP and straight on
// the queue is charged once, whichever comes first.
func TestHTTPAndQueueSameKey(t *testing.T) {
	t.Parallel()
	w := setup(t, gateway.Config{})
	w.startWorker()
	publish := func(key string) {
		t.Helper()
		m := nats.NewMsg(w.cfg.Stream.SubjectPrefix + ".m_a")
		m.Data = []byte(`{"merchant_id":"m_a","idempotency_key":"` + key + `","amount":900,"currency":"usd","payment_method":"pm_card_visa"}`)
		if _, err := w.js.PublishMsg(w.ctx, m); err != nil { // no Nats-Msg-Id: both copies reach the stream
			t.Fatal(err)
		}
	}
	body := `{"amount":900,"currency":"usd","payment_method":"pm_card_visa"}`

	r := w.post("http-first", body)
	wantStatus(t, r, http.StatusAccepted)
	publish("http-first")

	publish("queue-first")
	w.waitStatus("m_a", "queue-first", ledger.StatusCompleted)
	r = w.post("queue-first", body, "Prefer", "wait=10")
	wantStatus(t, r, http.StatusCreated)
	if r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("an HTTP retry of a queued payment must be a replay")
	}

	w.waitStatus("m_a", "http-first", ledger.StatusCompleted)
	w.eventually("every message settled", func() bool {
		c, err := w.js.Consumer(w.ctx, w.cfg.Stream.Name, w.cfg.Stream.Durable)
		if err != nil {
			return false
		}
		info, err := c.Info(w.ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	for _, k := range []string{"http-first", "queue-first"} {
		if c := w.charges("m_a", k); c != 1 {
			t.Errorf("%s: %d charges, want 1", k, c)
		}
	}
	if l := w.count(`SELECT count(*) FROM payments`); l != 2 {
		t.Fatalf("%d ledger rows, want 2", l)
	}
}

// TestAuthScopesPayments: keys are hashed at rest; a merchant cannot read
// or replay another's payment, and learns nothing about it.
func TestAuthScopesPayments(t *testing.T) {
	t.Parallel()
	w := setup(t, gateway.Config{})
	w.startWorker()
	body := payBody(1234, "pm_card_visa")

	rb := w.do(http.MethodPost, "/v1/payments", w.keyB, body, map[string]string{"Idempotency-Key": "shared", "Prefer": "wait=20"})
	wantStatus(t, rb, http.StatusCreated)

	// A reading B's payment gets exactly what a key nobody used gets.
	ra := w.do(http.MethodGet, "/v1/payments/shared", w.keyA, "", nil)
	wantStatus(t, ra, http.StatusNotFound)
	none := w.do(http.MethodGet, "/v1/payments/never-used", w.keyA, "", nil)
	if !bytes.Equal(ra.body, none.body) {
		t.Fatalf("404 bodies differ:\n%s\n%s", ra.body, none.body)
	}
	// A posting the same key makes A's own payment, not a replay of B's.
	rp := w.post("shared", body, "Prefer", "wait=20")
	wantStatus(t, rp, http.StatusCreated)
	if rp.header.Get("Idempotent-Replayed") != "" {
		t.Fatal("merchant A was served merchant B's stored response")
	}
	if pa, pb := rp.payment(t), rb.payment(t); pa.ChargeID == pb.ChargeID {
		t.Fatal("A and B share a charge")
	}
	if w.charges("m_a", "shared") != 1 || w.charges("m_b", "shared") != 1 {
		t.Fatalf("charges %v", w.sim.ChargesByKey())
	}

	// Keys are stored as SHA-256 only.
	rows, err := w.pool.Query(w.ctx, `SELECT id, merchant_id, key_hash, label FROM api_keys`)
	if err != nil {
		t.Fatal(err)
	}
	hashes := map[string]bool{}
	for rows.Next() {
		var id, merchant, label string
		var hash []byte
		if err := rows.Scan(&id, &merchant, &hash, &label); err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{w.keyA, w.keyB} {
			secret := key[len(key)-43:]
			if strings.Contains(id+merchant+label+string(hash), secret) {
				t.Fatal("an API key's secret is stored in clear")
			}
		}
		hashes[string(hash)] = true
	}
	rows.Close()
	for _, key := range []string{w.keyA, w.keyB} {
		sum := sha256.Sum256([]byte(key))
		if !hashes[string(sum[:])] {
			t.Fatal("the stored hash is not the key's SHA-256")
		}
	}

	// A revoked key is refused like an unknown one.
	if _, err := w.gwStore.RevokeAPIKey(w.ctx, w.keyB); err != nil {
		t.Fatal(err)
	}
	r := w.do(http.MethodGet, "/v1/payments/shared", w.keyB, "", nil)
	wantStatus(t, r, http.StatusUnauthorized)
	unknown := w.do(http.MethodGet, "/v1/payments/shared", "pd_0123456789ab_"+strings.Repeat("x", 43), "", nil)
	if !bytes.Equal(r.body, unknown.body) {
		t.Fatal("a revoked key is told apart from an unknown one")
	}
}

// TestGracefulShutdown: on stop, a request waiting for its outcome answers
// 202 at once and Serve returns nil.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	w := setup(t, gateway.Config{DrainTimeout: 5 * time.Second})
	got := make(chan response, 1)
	go func() {
		r, err := w.req(context.Background(), http.MethodPost, "/v1/payments", w.keyA, payBody(100, "pm_card_visa"),
			map[string]string{"Idempotency-Key": "drain", "Prefer": "wait=30"})
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	w.eventually("published", func() bool {
		in, err := w.gwStore.GetIntake(w.ctx, "m_a", "drain")
		return err == nil && !in.PublishedAt.IsZero()
	})
	start := time.Now()
	if err := w.stopServe(); err != nil {
		t.Fatal(err)
	}
	if !w.gw.Draining() {
		t.Fatal("not draining after stop")
	}
	r := <-got
	wantStatus(t, r, http.StatusAccepted)
	if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("drain took %v", d)
	}
}
