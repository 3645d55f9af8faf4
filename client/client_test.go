package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/client"
	"github.com/paydedup/paydedup/lab/testenv"
)

func visa(amount int64) client.Payment {
	return client.Payment{Amount: amount, Currency: "usd", PaymentMethod: "pm_card_visa", Description: "order 42",
		Metadata: map[string]string{"order_id": "42"}}
}

// newClient is a client of w's gateway through tp, retrying for 20 s.
func newClient(t *testing.T, w *world, tp *tap, opts ...client.Option) *client.Client {
	t.Helper()
	opts = append([]client.Option{client.WithHTTPClient(&http.Client{Transport: tp}), client.WithRetryFor(20 * time.Second)}, opts...)
	c, err := client.New(w.base, w.apiKey, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// samePayment fails the test unless every POST the tap saw carried key and
// one body, and returns how many there were.
func samePayment(t *testing.T, tp *tap, key string) int {
	t.Helper()
	n, body := 0, ""
	for _, s := range tp.requests() {
		if s.method != http.MethodPost {
			continue
		}
		if s.key != key {
			t.Fatalf("a POST under key %q, want only %q", s.key, key)
		}
		if n > 0 && s.body != body {
			t.Fatalf("a retry with another body:\n%s\nwant\n%s", s.body, body)
		}
		n, body = n+1, s.body
	}
	return n
}

// TestCreateAcceptedThenWait: a first POST is accepted (202 queued); Wait
// (Prefer: wait) returns the outcome once a worker charges it, and a
// retry of the same payment is its replay (201), charged once.
func TestCreateAcceptedThenWait(t *testing.T) {
	t.Parallel()
	w := setup(t)
	tp := newTap(t)
	c := newClient(t, w, tp)
	ctx := context.Background()
	r, err := c.Create(ctx, "order-1", visa(1999))
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != client.StatusQueued || r.HTTPStatus != http.StatusAccepted || r.Amount != 1999 || r.IdempotencyKey != "order-1" || r.Final() {
		t.Fatalf("first POST: %+v, want 202 queued", r)
	}
	w.startWorker()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r, err = c.Wait(wctx, "order-1")
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != client.StatusSucceeded || r.ChargeID == "" || !r.Final() {
		t.Fatalf("Wait: %+v, want succeeded with a charge id", r)
	}
	waits := 0
	for _, s := range tp.requests() {
		if s.method == http.MethodGet {
			waits++
		}
	}
	if waits == 0 {
		t.Fatal("Wait sent no GET")
	}
	again, err := c.Create(ctx, "order-1", visa(1999))
	if err != nil || again.Status != client.StatusSucceeded || !again.Replayed || again.HTTPStatus != http.StatusCreated || again.ChargeID != r.ChargeID {
		t.Fatalf("retry after the charge: %+v, %v; want the replay (201)", again, err)
	}
	if n := w.charges("order-1"); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

// TestCreateRetriesALostAnswer: the gateway took the POST in, and its
// answer was lost on the way back (the connection dropped). Create sends
// the same key and body again and returns the same payment, queued once
// and charged once.
func TestCreateRetriesALostAnswer(t *testing.T) {
	t.Parallel()
	w := setup(t)
	tp := newTap(t)
	tp.after = func(n int, r *http.Request, resp *http.Response) error {
		if n == 0 {
			if resp.StatusCode != http.StatusAccepted {
				t.Errorf("first POST answered %d, want the 202 to lose", resp.StatusCode)
			}
			return io.ErrUnexpectedEOF
		}
		return nil
	}
	c := newClient(t, w, tp)
	r, err := c.Create(context.Background(), "lost-answer", visa(500))
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != client.StatusQueued && r.Status != client.StatusProcessing || r.Amount != 500 {
		t.Fatalf("after the lost answer: %+v, want the payment in flight", r)
	}
	if n := samePayment(t, tp, "lost-answer"); n < 2 {
		t.Fatalf("%d POSTs, want the lost one and its retry", n)
	}
	if n := w.keyMsgs("lost-answer"); n != 1 {
		t.Fatalf("%d messages in the stream for the key, want 1", n)
	}
	w.startWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if r, err := c.Wait(ctx, "lost-answer"); err != nil || r.Status != client.StatusSucceeded {
		t.Fatalf("Wait: %+v, %v", r, err)
	}
	if n := w.charges("lost-answer"); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

// TestKeyReusedWithAnotherBody: a key sent with one payment is refused
// with another: by the client itself, which sends nothing, and, from
// another client (another process), by the gateway's 422, as a typed
// error. The first payment stands and is charged once.
func TestKeyReusedWithAnotherBody(t *testing.T) {
	t.Parallel()
	w := setup(t)
	tp := newTap(t)
	c := newClient(t, w, tp)
	ctx := context.Background()
	if _, err := c.Create(ctx, "reused", visa(100)); err != nil {
		t.Fatal(err)
	}
	before := len(tp.requests())
	_, err := c.Create(ctx, "reused", visa(150))
	if !errors.Is(err, client.ErrKeyReused) || errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("another body under the key: %v, want ErrKeyReused", err)
	}
	if n := len(tp.requests()); n != before {
		t.Fatalf("the client sent %d requests for a reused key, want none", n-before)
	}
	other := newClient(t, w, newTap(t))
	_, err = other.Create(ctx, "reused", visa(150))
	var p *client.Problem
	if !errors.Is(err, client.ErrKeyReused) || !errors.As(err, &p) || p.Status != http.StatusUnprocessableEntity || p.Type != client.ProblemKeyReused {
		t.Fatalf("another body from another client: %v, want the gateway's 422 key reused", err)
	}
	if errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("a 422 is final, not unknown: %v", err)
	}
	w.startWorker()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r, err := c.Wait(wctx, "reused")
	if err != nil || r.Status != client.StatusSucceeded || r.Amount != 100 {
		t.Fatalf("Wait: %+v, %v; want the first payment (100) charged", r, err)
	}
	if n := w.charges("reused"); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

// TestPublishOutcomeUnknownRetriedWithTheSameKey: the gateway's PubAck is
// lost, so it answers 503 publish-outcome-unknown (Retry-After: 1). The
// client waits Retry-After and sends the same key and body again, never a
// new key; the stream holds the command once and it is charged once.
func TestPublishOutcomeUnknownRetriedWithTheSameKey(t *testing.T) {
	t.Parallel()
	w := setup(t)
	tp := newTap(t)
	unknown := 0
	tp.after = func(n int, r *http.Request, resp *http.Response) error {
		if resp.StatusCode == http.StatusServiceUnavailable {
			unknown++
			if err := w.link.Restore(); err != nil { // the publisher reconnects
				t.Error(err)
			}
		}
		return nil
	}
	if err := w.link.Lose(testenv.ServerToClient); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, w, tp)
	r, err := c.Create(context.Background(), "unknown", visa(700))
	if err != nil {
		t.Fatal(err)
	}
	if unknown == 0 {
		t.Fatal("no 503: the PubAck was not lost")
	}
	if r.Status != client.StatusQueued && r.Status != client.StatusProcessing {
		t.Fatalf("after the 503: %+v, want the payment accepted", r)
	}
	reqs := tp.requests()
	if reqs[0].status != http.StatusServiceUnavailable || reqs[0].retryAfter == "" {
		t.Fatalf("first answer %d (Retry-After %q), want 503 with Retry-After", reqs[0].status, reqs[0].retryAfter)
	}
	if gap := reqs[1].at.Sub(reqs[0].answeredAt); gap < time.Second-50*time.Millisecond {
		t.Fatalf("retried %v after a 503 with Retry-After: 1", gap)
	}
	samePayment(t, tp, "unknown")
	if n := w.keyMsgs("unknown"); n != 1 {
		t.Fatalf("%d messages in the stream for the key, want 1", n)
	}
	w.startWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if r, err := c.Wait(ctx, "unknown"); err != nil || r.Status != client.StatusSucceeded {
		t.Fatalf("Wait: %+v, %v", r, err)
	}
	if n := w.charges("unknown"); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

// TestRetryAfterHonoured: a 429 with Retry-After: 2 (answered in the
// gateway's place: nothing was taken in) is retried with the same key and
// body after 2 s, not after the backoff's first 100 ms.
func TestRetryAfterHonoured(t *testing.T) {
	t.Parallel()
	w := setup(t)
	tp := newTap(t)
	tp.before = func(n int, r *http.Request) *http.Response {
		if n != 0 {
			return nil
		}
		h := http.Header{"Content-Type": {"application/problem+json"}, "Retry-After": {"2"}}
		return &http.Response{StatusCode: http.StatusTooManyRequests, Header: h, Request: r,
			Body: io.NopCloser(strings.NewReader(`{"type":"urn:paydedup:problem:rate-limited","title":"Too Many Requests","status":429}`))}
	}
	c := newClient(t, w, tp)
	r, err := c.Create(context.Background(), "limited", visa(300))
	if err != nil || r.Status != client.StatusQueued {
		t.Fatalf("after the 429: %+v, %v", r, err)
	}
	reqs := tp.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want the 429 and its retry", len(reqs))
	}
	if gap := reqs[1].at.Sub(reqs[0].answeredAt); gap < 2*time.Second-50*time.Millisecond || gap > 4*time.Second {
		t.Fatalf("retried %v after Retry-After: 2", gap)
	}
	samePayment(t, tp, "limited")
}

// TestGivingUpIsOutcomeUnknown: every answer lost, the client gives up
// after RetryFor with ErrOutcomeUnknown (keep the key), having sent only
// the one key and body. Called again later, the same key and payment find
// the payment, charged once.
func TestGivingUpIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	w := setup(t)
	tp := newTap(t)
	tp.after = func(int, *http.Request, *http.Response) error { return io.ErrUnexpectedEOF }
	c := newClient(t, w, tp, client.WithRetryFor(time.Second))
	_, err := c.Create(context.Background(), "gave-up", visa(900))
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("every answer lost: %v, want ErrOutcomeUnknown", err)
	}
	if n := samePayment(t, tp, "gave-up"); n < 2 {
		t.Fatalf("%d POSTs, want retries", n)
	}
	tp.mu.Lock()
	tp.after = nil
	tp.mu.Unlock()
	r, err := c.Create(context.Background(), "gave-up", visa(900))
	if err != nil || r.Status != client.StatusQueued && r.Status != client.StatusProcessing {
		t.Fatalf("called again: %+v, %v; want the payment in flight", r, err)
	}
	w.startWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if r, err := c.Wait(ctx, "gave-up"); err != nil || r.Status != client.StatusSucceeded {
		t.Fatalf("Wait: %+v, %v", r, err)
	}
	if n := w.charges("gave-up"); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

// TestRefusalsAreTyped: the gateway's refusals are typed errors, never
// retried: card data (the key stays free), an invalid body, a wrong API
// key, an unknown key; a decline is a final result, replayed as 402.
func TestRefusalsAreTyped(t *testing.T) {
	t.Parallel()
	w := setup(t)
	tp := newTap(t)
	c := newClient(t, w, tp)
	ctx := context.Background()
	var p *client.Problem

	card := visa(100)
	card.Description = "card 4242 4242 4242 4242"
	_, err := c.Create(ctx, "refused", card)
	if !errors.Is(err, client.ErrCardData) || !errors.As(err, &p) || p.Field != "description" || errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("card data: %v, want ErrCardData naming description", err)
	}
	_, err = c.Create(ctx, "refused", visa(0))
	if !errors.Is(err, client.ErrInvalidRequest) || !errors.As(err, &p) || p.Field != "amount" || p.Reason != "invalid_amount" {
		t.Fatalf("amount 0: %v, want ErrInvalidRequest naming amount", err)
	}
	if n := len(tp.requests()); n != 2 {
		t.Fatalf("%d requests, want one per refusal (none retried)", n)
	}
	// Refused at once, the key bound nothing: the corrected payment may use it.
	if r, err := c.Create(ctx, "refused", visa(100)); err != nil || r.Status != client.StatusQueued {
		t.Fatalf("the corrected payment under the key: %+v, %v", r, err)
	}
	if _, err := c.Get(ctx, "no-such-key"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("GET of an unknown key: %v, want ErrNotFound", err)
	}
	wrong, err := client.New(w.base, "pd_wrong", client.WithHTTPClient(&http.Client{Transport: newTap(t)}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wrong.Create(ctx, "k", visa(100)); !errors.Is(err, client.ErrUnauthenticated) {
		t.Fatalf("a wrong API key: %v, want ErrUnauthenticated", err)
	}

	declined := client.Payment{Amount: 100, Currency: "usd", PaymentMethod: "pm_card_chargeDeclined"}
	if _, err := c.Create(ctx, "declined", declined); err != nil {
		t.Fatal(err)
	}
	w.startWorker()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r, err := c.Wait(wctx, "declined")
	if err != nil || r.Status != client.StatusDeclined || !r.Final() || r.Outcome == nil {
		t.Fatalf("Wait of a declined card: %+v, %v", r, err)
	}
	r, err = c.Create(ctx, "declined", declined)
	if err != nil || r.Status != client.StatusDeclined || r.HTTPStatus != http.StatusPaymentRequired {
		t.Fatalf("retry of a declined payment: %+v, %v; want the 402 replay as a result", r, err)
	}
	if n := w.charges("declined"); n != 0 {
		t.Fatalf("%d charges of a declined card", n)
	}
}
