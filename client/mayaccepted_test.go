package client_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/paydedup/paydedup/client"
)

const (
	unavailable503    = `{"type":"urn:paydedup:problem:unavailable","title":"Service Unavailable","status":503}`
	publishUnknown503 = `{"type":"urn:paydedup:problem:publish-outcome-unknown","title":"Service Unavailable","status":503}`
	notAccepted404    = `{"type":"urn:paydedup:problem:not-accepted","title":"Not Found","status":404}`
)

// wantOutcomeUnknown fails unless err is ErrOutcomeUnknown and not
// ErrNotAccepted: the payment may be queued, a new key could charge twice.
func wantOutcomeUnknown(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, client.ErrOutcomeUnknown) || errors.Is(err, client.ErrNotAccepted) {
		t.Fatalf("%s: %v (outcome unknown %v, not accepted %v); want ErrOutcomeUnknown only",
			what, err, errors.Is(err, client.ErrOutcomeUnknown), errors.Is(err, client.ErrNotAccepted))
	}
}

// TestUnreadable202ThenUnavailableIsOutcomeUnknown: a 202 whose body the
// client cannot read, then 503 unavailable until RetryFor passes. The 202
// accepted it: the error is ErrOutcomeUnknown, never ErrNotAccepted.
func TestUnreadable202ThenUnavailableIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	s := &scripted{answers: []scriptedAnswer{{202, paymentJSON, `{"object":"payment"`}, {503, problemJSON, unavailable503}}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	c, err := client.New(srv.URL, "pd_test", client.WithRetryFor(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Create(context.Background(), "k", visa(100))
	wantOutcomeUnknown(t, "202 then 503 unavailable", err)
}

// TestOutcomeUnknownOutlivesTheCall: Create gives up with
// ErrOutcomeUnknown (503 publish-outcome-unknown); the caller, as told,
// calls Create again later with the same key and payment, and the gateway
// answers 503 unavailable: still ErrOutcomeUnknown, for the key may hold
// the queued payment. Only a GET's 404 not-accepted clears it.
func TestOutcomeUnknownOutlivesTheCall(t *testing.T) {
	t.Parallel()
	s := &scripted{answers: []scriptedAnswer{{503, problemJSON, publishUnknown503}}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	c, err := client.New(srv.URL, "pd_test", client.WithRetryFor(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	script := func(a ...scriptedAnswer) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.answers = a
	}
	ctx := context.Background()
	_, err = c.Create(ctx, "k", visa(100))
	wantOutcomeUnknown(t, "first call, 503 publish-outcome-unknown", err)

	script(scriptedAnswer{503, problemJSON, unavailable503})
	_, err = c.Create(ctx, "k", visa(100))
	wantOutcomeUnknown(t, "second call, 503 unavailable", err)

	// Another key on the same Client is told what its own answer says.
	_, err = c.Create(ctx, "k2", visa(100))
	if !errors.Is(err, client.ErrNotAccepted) || errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("a key whose every answer was 503 unavailable: %v, want ErrNotAccepted", err)
	}

	script(scriptedAnswer{404, problemJSON, notAccepted404})
	if _, err := c.Get(ctx, "k"); !errors.Is(err, client.ErrNotAccepted) {
		t.Fatalf("GET 404 not-accepted: %v, want ErrNotAccepted", err)
	}
	script(scriptedAnswer{503, problemJSON, unavailable503})
	_, err = c.Create(ctx, "k", visa(100))
	if !errors.Is(err, client.ErrNotAccepted) || errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("after GET said not-accepted, 503 unavailable: %v, want ErrNotAccepted", err)
	}
}

// TestGetUnavailableIsNotNotAccepted: a GET the gateway cannot answer (503
// unavailable until RetryFor passes) says nothing of the payment: it is not
// ErrNotAccepted, which a caller could take as leave to pay under a new key.
// Only 404 not-accepted is.
func TestGetUnavailableIsNotNotAccepted(t *testing.T) {
	t.Parallel()
	s := &scripted{answers: []scriptedAnswer{{503, problemJSON, unavailable503}}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	c, err := client.New(srv.URL, "pd_test", client.WithRetryFor(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(context.Background(), "k"); err == nil || errors.Is(err, client.ErrNotAccepted) {
		t.Fatalf("GET answered 503 unavailable: %v, want an error that is not ErrNotAccepted", err)
	}
}
