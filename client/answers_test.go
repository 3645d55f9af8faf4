package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/client"
)

// scripted is a server that answers the documented answers in order, for
// the rows a real gateway reaches only through an operator's queue or a
// proxy: each request takes the next answer.
type scripted struct {
	mu      sync.Mutex
	answers []scriptedAnswer
	got     []string // method and Prefer of each request
}

type scriptedAnswer struct {
	status int
	ctype  string
	body   string
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.got = append(s.got, r.Method+" "+r.Header.Get("Prefer"))
	a := s.answers[0]
	if len(s.answers) > 1 {
		s.answers = s.answers[1:]
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", a.ctype)
	w.WriteHeader(a.status)
	_, _ = w.Write([]byte(a.body))
}

const (
	problemJSON = "application/problem+json"
	paymentJSON = "application/json"
)

// TestAnswersMapToResults: each documented answer becomes its typed result
// or error: waiting for an operator (with its reason, returned at once by
// Wait), a dead-lettered payment (final), an answer that is not the
// gateway's (retried), a 409 while in flight (the payment's state).
func TestAnswersMapToResults(t *testing.T) {
	t.Parallel()
	waiting := `{"object":"payment","idempotency_key":"k","status":"waiting_for_operator","reason":"provider_rejected","amount":100,"currency":"usd"}`
	for _, tc := range []struct {
		name    string
		answers []scriptedAnswer
		call    func(*client.Client) (client.Result, error)
		status  client.Status
		reason  string
		err     error
		sent    int
	}{
		{name: "202 waiting for an operator", answers: []scriptedAnswer{{202, paymentJSON, waiting}},
			call: create, status: client.StatusWaitingForOperator, reason: "provider_rejected", sent: 1},
		{name: "Wait returns a payment waiting for an operator at once", answers: []scriptedAnswer{{200, paymentJSON, waiting}},
			call: wait, status: client.StatusWaitingForOperator, reason: "provider_rejected", sent: 1},
		{name: "a dead-lettered payment is final", answers: []scriptedAnswer{{422, problemJSON,
			`{"type":"urn:paydedup:problem:payment-rejected","title":"Unprocessable Entity","status":422,"reason":"provider_rejected"}`}},
			call: create, err: client.ErrRejected, sent: 1},
		{name: "a proxy's 502 page is retried", answers: []scriptedAnswer{{502, "text/html", "<html>bad gateway</html>"},
			{201, paymentJSON, `{"idempotency_key":"k","status":"succeeded","charge_id":"pi_1","amount":100,"currency":"usd"}`}},
			call: create, status: client.StatusSucceeded, sent: 2},
		{name: "409 in flight asks how it stands", answers: []scriptedAnswer{{409, problemJSON,
			`{"type":"urn:paydedup:problem:idempotency-key-in-use","title":"Conflict","status":409}`},
			{200, paymentJSON, `{"idempotency_key":"k","status":"processing","amount":100,"currency":"usd"}`}},
			call: create, status: client.StatusProcessing, sent: 2},
		{name: "GET of a payment not accepted", answers: []scriptedAnswer{{404, problemJSON,
			`{"type":"urn:paydedup:problem:not-accepted","title":"Not Found","status":404}`}},
			call: get, err: client.ErrNotAccepted, sent: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := &scripted{answers: tc.answers}
			srv := httptest.NewServer(s)
			defer srv.Close()
			c, err := client.New(srv.URL, "pd_test", client.WithRetryFor(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			r, err := tc.call(c)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("error %v, want %v", err, tc.err)
				}
			} else if err != nil || r.Status != tc.status || r.Reason != tc.reason {
				t.Fatalf("%+v, %v; want status %s, reason %q", r, err, tc.status, tc.reason)
			}
			if len(s.got) != tc.sent {
				t.Fatalf("%d requests (%v), want %d", len(s.got), s.got, tc.sent)
			}
		})
	}
}

func create(c *client.Client) (client.Result, error) {
	return c.Create(context.Background(), "k", visa(100))
}

func get(c *client.Client) (client.Result, error) { return c.Get(context.Background(), "k") }

func wait(c *client.Client) (client.Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.Wait(ctx, "k")
}

// TestKeyCheckedBeforeSending: a key the gateway would refuse, or HTTP
// could not carry, is refused before anything is sent, never retried.
func TestKeyCheckedBeforeSending(t *testing.T) {
	t.Parallel()
	s := &scripted{answers: []scriptedAnswer{{500, "text/plain", "unexpected"}}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	c, err := client.New(srv.URL, "pd_test")
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"", " padded", "line\nbreak", "é", strings.Repeat("k", 256)} {
		if _, err := c.Create(context.Background(), key, visa(100)); !errors.Is(err, client.ErrInvalidRequest) {
			t.Errorf("Create with key %q: %v, want ErrInvalidRequest", key, err)
		}
		if _, err := c.Get(context.Background(), key); !errors.Is(err, client.ErrInvalidRequest) {
			t.Errorf("Get with key %q: %v, want ErrInvalidRequest", key, err)
		}
	}
	if len(s.got) != 0 {
		t.Fatalf("%d requests sent, want none", len(s.got))
	}
}

// TestOperationInFlightAsksOnlyAboutItself: a refund's POST answered 409
// (in flight) asks how the key stands; an answer about another operation
// under the key (another payment, another amount, another kind) is never
// reported as this refund's outcome: the POST is retried, and its own
// answer returned.
func TestOperationInFlightAsksOnlyAboutItself(t *testing.T) {
	t.Parallel()
	inFlight := scriptedAnswer{409, problemJSON, `{"type":"urn:paydedup:problem:idempotency-key-in-use","title":"Conflict","status":409}`}
	queued := scriptedAnswer{202, paymentJSON, `{"object":"refund","idempotency_key":"r","payment_key":"pay-1","status":"queued","amount":500}`}
	for name, other := range map[string]string{
		"another payment's":     `{"object":"refund","idempotency_key":"r","payment_key":"pay-2","status":"succeeded","amount":500}`,
		"another amount, asked": `{"object":"refund","idempotency_key":"r","status":"queued","amount":700}`,
		"another amount, done":  `{"object":"refund","idempotency_key":"r","payment_key":"pay-1","status":"succeeded","amount":700}`,
		"another kind":          `{"object":"capture","idempotency_key":"r","payment_key":"pay-1","status":"succeeded","amount":500}`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := &scripted{answers: []scriptedAnswer{inFlight, {200, paymentJSON, other}, queued}}
			srv := httptest.NewServer(s)
			defer srv.Close()
			c, err := client.New(srv.URL, "pd_test", client.WithRetryFor(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			r, err := c.Refund(context.Background(), "pay-1", "r", 500)
			if err != nil || r.Status != client.StatusQueued || r.PaymentKey != "pay-1" || r.Amount != 500 {
				t.Fatalf("%+v, %v; want this refund queued", r, err)
			}
		})
	}
}
