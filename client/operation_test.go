package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/paydedup/paydedup/client"
	"github.com/paydedup/paydedup/lab/testenv"
)

// charged creates a payment under key with c and waits until it is
// charged.
func charged(t *testing.T, c *client.Client, key string, amount int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Create(ctx, key, visa(amount)); err != nil {
		t.Fatal(err)
	}
	if r, err := c.Wait(ctx, key); err != nil || r.Status != client.StatusSucceeded {
		t.Fatalf("Wait: %+v, %v", r, err)
	}
}

// refundDone polls the refund under key until it is final.
func refundDone(t *testing.T, w *world, c *client.Client, key string) client.OperationResult {
	t.Helper()
	var r client.OperationResult
	w.eventually("refund "+key+" final", func() bool {
		got, err := c.GetOperation(context.Background(), client.KindRefund, key)
		r = got
		return err == nil && got.Final()
	})
	return r
}

// samePOSTs fails the test unless every POST under key the tap saw
// carried one body, and returns how many there were.
func samePOSTs(t *testing.T, tp *tap, key string) int {
	t.Helper()
	n, body := 0, ""
	for _, s := range tp.requests() {
		if s.method != http.MethodPost || s.key != key {
			continue
		}
		if n > 0 && s.body != body {
			t.Fatalf("a retry with another body:\n%s\nwant\n%s", s.body, body)
		}
		n, body = n+1, s.body
	}
	return n
}

// TestRefundRetriesALostAnswer: a refund's 202 is lost after the gateway
// published it; Refund retries with the same key and body and returns the
// refund in flight (or done); the payment is refunded once and GET shows
// it partially refunded.
func TestRefundRetriesALostAnswer(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.startWorker()
	tp := newTap(t)
	c := newClient(t, w, tp)
	charged(t, c, "pay-lost", 2000)
	lost := false
	tp.after = func(n int, r *http.Request, resp *http.Response) error {
		if r.Header.Get("Idempotency-Key") == "ref-lost" && r.Method == http.MethodPost && !lost {
			lost = true
			if resp.StatusCode != http.StatusAccepted {
				t.Errorf("first refund POST answered %d, want the 202 to lose", resp.StatusCode)
			}
			return io.ErrUnexpectedEOF
		}
		return nil
	}
	r, err := c.Refund(context.Background(), "pay-lost", "ref-lost", 500)
	if err != nil {
		t.Fatal(err)
	}
	if r.Object != client.KindRefund || r.Status == client.StatusRefused || r.Status == client.StatusFailed {
		t.Fatalf("after the lost answer: %+v", r)
	}
	if n := samePOSTs(t, tp, "ref-lost"); n < 2 {
		t.Fatalf("%d POSTs, want the lost one and its retry", n)
	}
	if done := refundDone(t, w, c, "ref-lost"); done.Status != client.StatusSucceeded || done.Amount != 500 {
		t.Fatalf("refund %+v", done)
	}
	again, err := c.Refund(context.Background(), "pay-lost", "ref-lost", 500)
	if err != nil || !again.Replayed || again.Status != client.StatusSucceeded {
		t.Fatalf("replay: %+v, %v", again, err)
	}
	p, err := c.Get(context.Background(), "pay-lost")
	if err != nil || p.Status != client.StatusPartiallyRefunded || p.AmountRefunded != 500 || len(p.Refunds) != 1 {
		t.Fatalf("Get: %+v, %v", p, err)
	}
	if n := len(w.sim.Refunds()); n != 1 {
		t.Fatalf("%d refunds at the provider, want 1", n)
	}
	if n := w.keyMsgs("ref-lost"); n != 1 {
		t.Fatalf("%d messages in the stream for the refund, want 1", n)
	}
}

// TestRefundPublishOutcomeUnknownRetried: the refund's PubAck is lost
// (503 publish-outcome-unknown); Refund retries with the same key and
// body, and the payment is refunded once.
func TestRefundPublishOutcomeUnknownRetried(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.startWorker()
	tp := newTap(t)
	c := newClient(t, w, tp)
	charged(t, c, "pay-unk", 1500)
	unknown := 0
	tp.after = func(n int, r *http.Request, resp *http.Response) error {
		if resp.StatusCode == http.StatusServiceUnavailable {
			unknown++
			if err := w.link.Restore(); err != nil {
				t.Error(err)
			}
		}
		return nil
	}
	if err := w.link.Lose(testenv.ServerToClient); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Refund(context.Background(), "pay-unk", "ref-unk", 0); err != nil {
		t.Fatal(err)
	}
	if unknown == 0 {
		t.Fatal("no 503: the PubAck was not lost")
	}
	samePOSTs(t, tp, "ref-unk")
	if done := refundDone(t, w, c, "ref-unk"); done.Status != client.StatusSucceeded || done.Amount != 1500 {
		t.Fatalf("refund of the rest %+v", done)
	}
	if n := len(w.sim.Refunds()); n != 1 {
		t.Fatalf("%d refunds at the provider, want 1", n)
	}
	if n := w.keyMsgs("ref-unk"); n != 1 {
		t.Fatalf("%d messages in the stream for the refund, want 1", n)
	}
}

// TestOperationRefusalsAreTyped: the ledger's refusal (over_refundable)
// is ErrRejected with its reason; a key used for one operation is
// ErrKeyReused for another amount or operation, by the client itself
// (nothing sent) and by the gateway (another client); an unknown payment
// is ErrNotFound; a capture of a payment charged at once is taken in and
// refused by the ledger's rules (payment_not_authorized).
func TestOperationRefusalsAreTyped(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.startWorker()
	tp := newTap(t)
	c := newClient(t, w, tp)
	ctx := context.Background()
	charged(t, c, "pay-typed", 1000)

	if _, err := c.Refund(ctx, "pay-typed", "ref-over", 1001); err != nil {
		t.Fatal(err)
	}
	if r := refundDone(t, w, c, "ref-over"); r.Status != client.StatusRefused || r.Reason != "over_refundable" {
		t.Fatalf("refused refund: %+v", r)
	}
	_, err := c.Refund(ctx, "pay-typed", "ref-over", 1001)
	var p *client.Problem
	if !errors.Is(err, client.ErrRejected) || !errors.As(err, &p) || p.Reason != "over_refundable" {
		t.Fatalf("retry of a refused refund: %v, want ErrRejected over_refundable", err)
	}

	before := len(tp.requests())
	if _, err := c.Refund(ctx, "pay-typed", "ref-over", 10); !errors.Is(err, client.ErrKeyReused) {
		t.Fatalf("another amount under the key: %v, want ErrKeyReused", err)
	}
	if _, err := c.Capture(ctx, "pay-typed", "ref-over", 1001); !errors.Is(err, client.ErrKeyReused) {
		t.Fatalf("a capture under a refund's key: %v, want ErrKeyReused", err)
	}
	if n := len(tp.requests()); n != before {
		t.Fatalf("%d requests sent for a key this client bound to another request, want none", n-before)
	}
	other := newClient(t, w, newTap(t))
	if _, err := other.Refund(ctx, "pay-typed", "ref-over", 10); !errors.Is(err, client.ErrKeyReused) {
		t.Fatalf("another client, another amount under the key: %v, want ErrKeyReused", err)
	}
	if _, err := c.Refund(ctx, "no-such-payment", "ref-none", 10); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("refund of an unknown payment: %v, want ErrNotFound", err)
	}
	// A capture of a payment charged at once: taken in, and refused by
	// the ledger's rules, with its reason.
	if r, err := c.Capture(ctx, "pay-typed", "cap-1", 0); err != nil || r.Status != client.StatusQueued {
		t.Fatalf("capture: %+v %v, want queued", r, err)
	}
	w.eventually("the capture refused", func() bool {
		r, err := c.GetOperation(ctx, client.KindCapture, "cap-1")
		return err == nil && r.Status == client.StatusRefused && r.Reason == "payment_not_authorized"
	})
	_, err = c.Capture(ctx, "pay-typed", "cap-1", 0)
	if !errors.Is(err, client.ErrRejected) || !errors.As(err, &p) || p.Reason != "payment_not_authorized" {
		t.Fatalf("retry of a refused capture: %v, want ErrRejected payment_not_authorized", err)
	}
	if n := len(w.sim.Refunds()); n != 0 {
		t.Fatalf("%d refunds at the provider, want 0", n)
	}
}
