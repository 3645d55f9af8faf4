package client_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paydedup/paydedup/client"
)

// TestObserverSeesEachAnswer: WithObserver is called once per request, in
// order, with what came back: the answers Create retried (a problem, a
// proxy's page, a connection cut with no answer) as well as the one it
// returned, and Get's.
func TestObserverSeesEachAnswer(t *testing.T) {
	t.Parallel()
	var cut atomic.Bool
	s := &scripted{answers: []scriptedAnswer{
		{503, problemJSON, unavailable503},
		{502, "text/html", "<html>bad gateway</html>"},
		{201, paymentJSON, `{"idempotency_key":"k","status":"succeeded","charge_id":"pi_1","amount":100,"currency":"usd"}`},
		{200, paymentJSON, `{"idempotency_key":"k","status":"succeeded","charge_id":"pi_1","amount":100,"currency":"usd"}`},
	}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if cut.CompareAndSwap(false, true) { // the first request: no answer at all
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		s.ServeHTTP(w, r)
	}))
	defer srv.Close()
	var seen []string
	c, err := client.New(srv.URL, "pd_test", client.WithRetryFor(10*time.Second),
		client.WithObserver(func(x client.Exchange) { seen = append(seen, describe(x)) }))
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Create(context.Background(), "k", visa(100))
	if err != nil || r.Status != client.StatusSucceeded {
		t.Fatalf("Create: %+v, %v; want succeeded", r, err)
	}
	if _, err := c.Get(context.Background(), "k"); err != nil {
		t.Fatalf("Get: %v", err)
	}
	want := []string{
		"POST k: no answer",
		"POST k 503 problem urn:paydedup:problem:unavailable",
		"POST k 502",
		"POST k 201 payment succeeded",
		"GET k 200 payment succeeded",
	}
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Fatalf("observed:\n%s\nwant:\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
}

func describe(x client.Exchange) string {
	switch {
	case x.Err != nil:
		return fmt.Sprintf("%s %s: no answer", x.Method, x.Key)
	case x.Problem != nil:
		return fmt.Sprintf("%s %s %d problem %s", x.Method, x.Key, x.Status, x.Problem.Type)
	case x.Result != nil:
		return fmt.Sprintf("%s %s %d payment %s", x.Method, x.Key, x.Status, x.Result.Status)
	}
	return fmt.Sprintf("%s %s %d", x.Method, x.Key, x.Status)
}
