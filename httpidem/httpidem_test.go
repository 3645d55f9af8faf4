package httpidem_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/paydedup/paydedup/httpidem"
	"github.com/paydedup/paydedup/httpidem/pgstore"
	"github.com/paydedup/paydedup/lab/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
	)
}

// fixture serves handler behind the middleware over real HTTP, on its own
// schema.
type fixture struct {
	t     *testing.T
	srv   *httptest.Server
	store *pgstore.Store
	calls atomic.Int32
}

func setup(t *testing.T, cfg httpidem.Config, handler func(f *fixture, w http.ResponseWriter, r *http.Request)) *fixture {
	t.Helper()
	store, err := pgstore.New(testenv.Pool(t), pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Scope == nil {
		cfg.Scope = callerScope
	}
	mw, err := httpidem.New(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, store: store}
	f.srv = httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.calls.Add(1)
		handler(f, w, r)
	})))
	t.Cleanup(f.srv.Close)
	return f
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

// callerScope is the scope of the tests' applications: the caller (an
// account the test's "authentication" put in X-Account) and the path.
func callerScope(r *http.Request) string {
	if a := r.Header.Get("X-Account"); a != "" {
		return a + " " + r.URL.Path
	}
	return ""
}

func (f *fixture) send(ctx context.Context, method, key, body string) (reply, error) {
	return f.sendAs(ctx, "acct_1", method, key, body)
}

func (f *fixture) sendAs(ctx context.Context, account, method, key, body string) (reply, error) {
	r, err := http.NewRequestWithContext(ctx, method, f.srv.URL+"/orders", strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	if account != "" {
		r.Header.Set("X-Account", account)
	}
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	resp, err := f.srv.Client().Do(r)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, err
}

func (f *fixture) post(key, body string) reply {
	f.t.Helper()
	r, err := f.send(context.Background(), http.MethodPost, key, body)
	if err != nil {
		f.t.Fatal(err)
	}
	return r
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// created answers like an order-creating handler would.
func created(f *fixture, w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Order", "ord_1")
	w.Header().Add("X-Multi", "a")
	w.Header().Add("X-Multi", "b")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(`{"order":"ord_1","echo":`))
	_, _ = w.Write(body)
	_, _ = w.Write([]byte("}\n\x00\xfe"))
}

func TestConcurrentRequestsRunHandlerOnce(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	f := setup(t, httpidem.Config{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
		<-release
		created(f, w, r)
	})
	const n = 20
	replies := make([]reply, n)
	var wg sync.WaitGroup
	var answered atomic.Int32
	for i := range n {
		wg.Go(func() {
			r, err := f.send(context.Background(), http.MethodPost, "same", `{"qty":1}`)
			if err != nil {
				t.Error(err)
			}
			replies[i] = r
			answered.Add(1)
		})
	}
	// Everyone but the one running the handler is answered 409 while it runs.
	eventually(t, "19 conflicts", func() bool { return answered.Load() == n-1 })
	close(release)
	wg.Wait()
	if c := f.calls.Load(); c != 1 {
		t.Fatalf("handler ran %d times", c)
	}
	var won int
	for _, r := range replies {
		switch r.status {
		case http.StatusCreated:
			won++
		case http.StatusConflict:
			if r.header.Get("Retry-After") == "" || r.header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("409 without Retry-After or problem: %v", r.header)
			}
		default:
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	}
	if won != 1 {
		t.Fatalf("%d 201s", won)
	}
}

func TestReplayIsByteIdentical(t *testing.T) {
	t.Parallel()
	f := setup(t, httpidem.Config{}, created)
	first := f.post("k", `{"qty":2}`)
	if first.status != http.StatusCreated || first.header.Get(httpidem.HeaderIdempotentReplay) != "" {
		t.Fatalf("first: %d %v", first.status, first.header)
	}
	again := f.post("k", `{"qty":2}`)
	if again.header.Get(httpidem.HeaderIdempotentReplay) != "true" {
		t.Fatal("no Idempotent-Replayed: true")
	}
	if again.status != first.status || !bytes.Equal(again.body, first.body) {
		t.Fatalf("replay differs: %d %q vs %d %q", again.status, again.body, first.status, first.body)
	}
	for _, h := range []string{"Content-Type", "X-Order", "Content-Length"} {
		if again.header.Get(h) != first.header.Get(h) {
			t.Fatalf("%s: %q vs %q", h, again.header.Get(h), first.header.Get(h))
		}
	}
	if strings.Join(again.header.Values("X-Multi"), ",") != "a,b" {
		t.Fatalf("X-Multi %v", again.header.Values("X-Multi"))
	}
	if f.calls.Load() != 1 {
		t.Fatalf("handler ran %d times", f.calls.Load())
	}
	// Same key, different request: 422, handler not run.
	if r := f.post("k", `{"qty":3}`); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("other body: %d", r.status)
	}
	// No key: 400; a GET is not intercepted.
	if r := f.post("", `{}`); r.status != http.StatusBadRequest {
		t.Fatalf("no key: %d", r.status)
	}
	if r, _ := f.send(context.Background(), http.MethodGet, "", ""); r.status != http.StatusCreated {
		t.Fatalf("GET: %d", r.status)
	}
}

func TestServerErrorReleasesBusinessErrorIsStored(t *testing.T) {
	t.Parallel()
	var fail atomic.Bool
	fail.Store(true)
	f := setup(t, httpidem.Config{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.Contains(r.Header.Get("Idempotency-Key"), "busy"):
			w.WriteHeader(http.StatusTooManyRequests)
		case strings.Contains(r.Header.Get("Idempotency-Key"), "declined"):
			http.Error(w, "card declined", http.StatusPaymentRequired)
		case fail.Load():
			http.Error(w, "database down", http.StatusServiceUnavailable)
		default:
			created(f, w, r)
		}
	})
	if r := f.post("k5", `{}`); r.status != http.StatusServiceUnavailable {
		t.Fatalf("first: %d", r.status)
	}
	fail.Store(false)
	if r := f.post("k5", `{}`); r.status != http.StatusCreated || r.header.Get(httpidem.HeaderIdempotentReplay) != "" {
		t.Fatalf("retry after 5xx: %d %v", r.status, r.header)
	}
	if f.calls.Load() != 2 {
		t.Fatalf("handler ran %d times, want 2", f.calls.Load())
	}
	// A 4xx business error is final: replayed, not re-run.
	d1 := f.post("declined", `{}`)
	d2 := f.post("declined", `{}`)
	if d1.status != http.StatusPaymentRequired || d2.status != http.StatusPaymentRequired ||
		d2.header.Get(httpidem.HeaderIdempotentReplay) != "true" || !bytes.Equal(d1.body, d2.body) {
		t.Fatalf("decline: %d %d %v", d1.status, d2.status, d2.header)
	}
	// 429 asks for a retry, so it is not stored.
	f.post("busy", `{}`)
	if r := f.post("busy", `{}`); r.header.Get(httpidem.HeaderIdempotentReplay) != "" {
		t.Fatal("a 429 was replayed")
	}
	if c := f.calls.Load(); c != 5 {
		t.Fatalf("handler ran %d times, want 5", c)
	}
}

func TestClientDisconnectReleases(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{}, 1)
	var first atomic.Bool
	first.Store(true)
	f := setup(t, httpidem.Config{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
		if first.CompareAndSwap(true, false) {
			entered <- struct{}{}
			<-r.Context().Done() // the client hangs up before the work is done
			return
		}
		created(f, w, r)
	})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := f.send(ctx, http.MethodPost, "gone", `{}`)
		errc <- err
	}()
	<-entered
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client: %v", err)
	}
	// The claim is released once the handler has returned.
	var r reply
	eventually(t, "claim released", func() bool {
		r = f.post("gone", `{}`)
		return r.status != http.StatusConflict
	})
	if r.status != http.StatusCreated || f.calls.Load() != 2 {
		t.Fatalf("retry after disconnect: %d, handler ran %d times", r.status, f.calls.Load())
	}
}

func TestPanicReleases(t *testing.T) {
	t.Parallel()
	var first atomic.Bool
	first.Store(true)
	f := setup(t, httpidem.Config{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
		if first.CompareAndSwap(true, false) {
			panic(http.ErrAbortHandler) // net/http drops the connection quietly
		}
		created(f, w, r)
	})
	if _, err := f.send(context.Background(), http.MethodPost, "p", `{}`); err == nil {
		t.Fatal("the aborted request got a response")
	}
	if r := f.post("p", `{}`); r.status != http.StatusCreated {
		t.Fatalf("after panic: %d %s", r.status, r.body)
	}
}

// TestCallersDoNotShareKeys: the middleware cannot be built without a
// scope, and with one that names the caller, two callers sending the same
// key and body each get their own execution and their own response.
func TestCallersDoNotShareKeys(t *testing.T) {
	t.Parallel()
	store, err := pgstore.New(testenv.Pool(t), pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := httpidem.New(store, httpidem.Config{}); err == nil || !strings.Contains(err.Error(), "Scope") {
		t.Fatalf("New without a Scope: %v; want an error naming Config.Scope (callers would share keys)", err)
	}

	f := setup(t, httpidem.Config{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("order for " + r.Header.Get("X-Account")))
	})
	send := func(account string) reply {
		t.Helper()
		r, err := f.sendAs(context.Background(), account, http.MethodPost, "same-key", `{"qty":1}`)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a, b := send("acct_a"), send("acct_b")
	if a.status != http.StatusCreated || b.status != http.StatusCreated || string(a.body) != "order for acct_a" || string(b.body) != "order for acct_b" {
		t.Fatalf("a: %d %q, b: %d %q", a.status, a.body, b.status, b.body)
	}
	if c := f.calls.Load(); c != 2 {
		t.Fatalf("handler ran %d times for two callers, want 2", c)
	}
	// Each caller's retry replays its own response.
	for _, acct := range []string{"acct_a", "acct_b"} {
		if r := send(acct); r.header.Get(httpidem.HeaderIdempotentReplay) != "true" || string(r.body) != "order for "+acct {
			t.Fatalf("retry of %s: %d %q %v", acct, r.status, r.body, r.header)
		}
	}
	// A request the scope cannot place (no caller) is refused, not run.
	if r := send(""); r.status != http.StatusInternalServerError || !strings.Contains(string(r.body), "no-idempotency-scope") {
		t.Fatalf("without a caller: %d %s", r.status, r.body)
	}
	if c := f.calls.Load(); c != 2 {
		t.Fatalf("handler ran %d times, want 2", c)
	}
}

// TestOversizedResponseRunsOnce: a 2xx too large to store is sent to its
// client, and a retry gets a stored error saying so instead of running the
// handler again.
func TestOversizedResponseRunsOnce(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 300)
	f := setup(t, httpidem.Config{MaxResponseBytes: 100}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(big))
	})
	first := f.post("big", `{"qty":1}`)
	if first.status != http.StatusCreated || string(first.body) != big {
		t.Fatalf("first: %d, %d bytes", first.status, len(first.body))
	}
	for range 2 {
		r := f.post("big", `{"qty":1}`)
		if r.status != http.StatusInternalServerError || r.header.Get(httpidem.HeaderIdempotentReplay) != "true" ||
			r.header.Get("Content-Type") != "application/problem+json" ||
			!strings.Contains(string(r.body), "response-not-stored") || !strings.Contains(string(r.body), "201") {
			t.Fatalf("retry: %d %v %s", r.status, r.header, r.body)
		}
	}
	if c := f.calls.Load(); c != 1 {
		t.Fatalf("handler ran %d times, want 1", c)
	}
}

func TestParseKey(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		vals []string
		want string
		err  error
	}{
		{nil, "", httpidem.ErrMissingKey},
		{[]string{""}, "", httpidem.ErrMissingKey},
		{[]string{"abc-123"}, "abc-123", nil},
		{[]string{` "8e03978e-40d5-43e8-bc93-6894a57f9324" `}, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{[]string{`"a\"b\\c"`}, `a"b\c`, nil},
		{[]string{`""`}, "", httpidem.ErrMissingKey},
		{[]string{`"abc`}, "", httpidem.ErrInvalidKey},
		{[]string{`"a"b`}, "", httpidem.ErrInvalidKey},
		{[]string{`"a\x"`}, "", httpidem.ErrInvalidKey},
		{[]string{"a", "b"}, "", httpidem.ErrInvalidKey},
		{[]string{strings.Repeat("k", 256)}, "", httpidem.ErrInvalidKey},
		{[]string{"caf\xc3\xa9"}, "", httpidem.ErrInvalidKey},
	} {
		h := http.Header{}
		for _, v := range c.vals {
			h.Add("Idempotency-Key", v)
		}
		got, err := httpidem.ParseKey(h)
		if got != c.want || !errors.Is(err, c.err) {
			t.Errorf("%q: %q %v, want %q %v", c.vals, got, err, c.want, c.err)
		}
	}
}
