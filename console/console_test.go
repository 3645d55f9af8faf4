package console_test

import (
	"cmp"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/paydedup/paydedup/console"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.LeakOptions()...)
}

const token = "c0n5013e7e57a9b1f48d26e3c7a05b9f1d84e2c6a3b7f09d5e1c4a8b2f6d03e9a7"

// world is one test's console over its own schema and streams.
type world struct {
	t      *testing.T
	ctx    context.Context
	js     jetstream.JetStream
	nc     *nats.Conn
	store  *dedup.Store
	cfg    stream.Config
	con    *console.Console
	base   string
	client *http.Client
}

func setup(t *testing.T, ccfg console.Config) *world {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Pool(t)
	store, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if ccfg.Lifecycles == nil {
		if ccfg.Lifecycles, err = pgstore.New(pool, pgstore.Config{}); err != nil {
			t.Fatal(err)
		}
	}
	nc := testenv.NATSConn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testenv.Streams(t, js).WithDefaults()
	if _, _, err := stream.EnsureStreams(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	if ccfg.Stream.Name == "" {
		ccfg.Stream = cfg
	}
	con, err := console.New(js, store, ccfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con.Handler())
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	t.Cleanup(client.CloseIdleConnections)
	return &world{t: t, ctx: ctx, js: js, nc: nc, store: store, cfg: cfg, con: con, base: srv.URL, client: client}
}

// fileLetter files a verified dead letter of a valid payment command.
func (w *world) fileLetter(reason, merchant, key string, body []byte, hdr nats.Header) uint64 {
	w.t.Helper()
	if body == nil {
		var err error
		body, err = stream.EncodeCommand(&payment.Command{MerchantID: merchant, IdempotencyKey: key, Amount: 1200, Currency: "usd", PaymentMethod: "pm_card_visa"})
		if err != nil {
			w.t.Fatal(err)
		}
	}
	if hdr == nil {
		hdr = nats.Header{}
	}
	why := map[string]string{
		stream.ReasonMaxDeliveries:          "provider: 503 Service Unavailable after 6 deliveries",
		stream.ReasonKeyReused:              "idempotency key reused with a different request",
		string(payment.ReasonInvalidAmount): "amount: must be a positive integer of minor units",
	}[reason]
	d := stream.Letter{Reason: reason, Err: errors.New(cmp.Or(why, "it failed")), OrigSubject: w.cfg.SubjectPrefix + "." + merchant,
		OrigStream: w.cfg.Name, OrigSeq: uint64(time.Now().UnixNano()), Deliveries: 6, Header: hdr, Data: body, FailedAt: time.Now()}
	ack, err := w.js.PublishMsg(w.ctx, d.Msg(w.cfg))
	if err != nil {
		w.t.Fatal(err)
	}
	return ack.Sequence
}

func (w *world) letterExists(seq uint64) bool {
	w.t.Helper()
	_, err := dlq.Get(w.ctx, w.js, w.cfg, seq)
	if err != nil && !errors.Is(err, dlq.ErrNotFound) {
		w.t.Fatal(err)
	}
	return err == nil
}

type response struct {
	status int
	header http.Header
	body   string
}

// send sends a request as the page's own form would (same origin), with
// the headers in hdr on top.
func (w *world) send(method, path string, form url.Values, hdr map[string]string) response {
	w.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(w.ctx, method, w.base+path, body)
	if err != nil {
		w.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v // the client sends req.Host, never a Host header
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := w.client.Do(req)
	if err != nil {
		w.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

func (w *world) get(path string) response { return w.send(http.MethodGet, path, nil, nil) }

func (w *world) post(path string, form url.Values, hdr ...string) response {
	h := map[string]string{}
	for i := 0; i+1 < len(hdr); i += 2 {
		h[hdr[i]] = hdr[i+1]
	}
	return w.send(http.MethodPost, path, form, h)
}

func (w *world) login() {
	w.t.Helper()
	if r := w.post("/login", url.Values{"token": {token}}); r.status != http.StatusSeeOther {
		w.t.Fatalf("login: status %d\n%s", r.status, r.body)
	}
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// csrf reads the form token from the overview, as the browser would.
func (w *world) csrf() string {
	w.t.Helper()
	m := csrfRE.FindStringSubmatch(w.get("/").body)
	if m == nil {
		w.t.Fatal("no CSRF token on the overview")
	}
	return m[1]
}

func want(t *testing.T, r response, status int, substr string) {
	t.Helper()
	if r.status != status || !strings.Contains(r.body, substr) {
		t.Fatalf("status %d, want %d with %q; body:\n%s", r.status, status, substr, r.body)
	}
}

func seqForm(seq uint64, extra ...string) url.Values {
	v := url.Values{"seq": {strconv.FormatUint(seq, 10)}}
	for i := 0; i+1 < len(extra); i += 2 {
		v.Set(extra[i], extra[i+1])
	}
	return v
}

// Without a token the console serves every page and changes nothing.
func TestWithoutTokenTheConsoleIsReadOnly(t *testing.T) {
	t.Parallel()
	w := setup(t, console.Config{})
	seq := w.fileLetter(stream.ReasonMaxDeliveries, "m_1", "k1", nil, nil)
	if !w.con.ReadOnly() {
		t.Fatal("ReadOnly() = false without a token")
	}
	r := w.get("/")
	want(t, r, http.StatusOK, "read-only: PAYDEDUP_CONSOLE_TOKEN is not set")
	if !strings.Contains(r.body, `id="letter-`+strconv.FormatUint(seq, 10)+`"`) {
		t.Fatalf("the overview does not list letter %d:\n%s", seq, r.body)
	}
	want(t, w.post("/login", url.Values{"token": {""}}), http.StatusForbidden, "read-only")
	want(t, w.post("/replay", seqForm(seq, "confirm", "yes")), http.StatusForbidden, "log in")
	if !w.letterExists(seq) {
		t.Fatal("a read-only console replayed a letter")
	}
}

func TestReplayWithoutALoginIsRefused(t *testing.T) {
	t.Parallel()
	w := setup(t, console.Config{Token: token})
	seq := w.fileLetter(stream.ReasonMaxDeliveries, "m_1", "k1", nil, nil)
	want(t, w.post("/replay", seqForm(seq, "confirm", "yes")), http.StatusForbidden, "log in")
	// A cookie the console did not sign is no session.
	u, _ := url.Parse(w.base)
	w.client.Jar.SetCookies(u, []*http.Cookie{{Name: "paydedup_console", Value: "99999999999.deadbeef"}})
	want(t, w.post("/replay", seqForm(seq, "confirm", "yes")), http.StatusForbidden, "log in")
	if !w.letterExists(seq) {
		t.Fatal("replayed without a login")
	}
}

func TestWrongTokenGetsNoSession(t *testing.T) {
	t.Parallel()
	w := setup(t, console.Config{Token: token})
	for _, tok := range []string{"", "wrong", token + "x", token[:len(token)-1]} {
		r := w.post("/login", url.Values{"token": {tok}})
		want(t, r, http.StatusUnauthorized, "wrong token")
		if len(r.header.Values("Set-Cookie")) != 0 {
			t.Fatalf("token %q: a cookie was set: %v", tok, r.header.Values("Set-Cookie"))
		}
	}
}

func TestSessionCookieIsHttpOnlyAndSameSiteStrict(t *testing.T) {
	t.Parallel()
	w := setup(t, console.Config{Token: token})
	r := w.post("/login", url.Values{"token": {token}})
	c := r.header.Get("Set-Cookie")
	if r.status != http.StatusSeeOther || !strings.Contains(c, "HttpOnly") || !strings.Contains(c, "SameSite=Strict") {
		t.Fatalf("login: status %d, Set-Cookie %q", r.status, c)
	}
}

func TestReplayWithoutTheCSRFTokenIsRefused(t *testing.T) {
	t.Parallel()
	w := setup(t, console.Config{Token: token})
	seq := w.fileLetter(stream.ReasonMaxDeliveries, "m_1", "k1", nil, nil)
	w.login()
	want(t, w.post("/replay", seqForm(seq, "confirm", "yes")), http.StatusForbidden, "CSRF")
	want(t, w.post("/replay", seqForm(seq, "confirm", "yes", "csrf", strings.Repeat("0", 64))), http.StatusForbidden, "CSRF")
	if !w.letterExists(seq) {
		t.Fatal("replayed without the CSRF token")
	}
}

// A cross-site form post, even one carrying the right cookie and form
// token (a page that somehow learned it), is refused before any handler.
func TestCrossSiteRequestsAreRefused(t *testing.T) {
	t.Parallel()
	w := setup(t, console.Config{Token: token})
	seq := w.fileLetter(stream.ReasonMaxDeliveries, "m_1", "k1", nil, nil)
	w.login()
	form := seqForm(seq, "confirm", "yes", "csrf", w.csrf())
	for _, h := range [][]string{
		{"Sec-Fetch-Site", "cross-site"},
		{"Sec-Fetch-Site", "same-site"},
		{"Origin", "http://evil.example"},
	} {
		if r := w.post("/replay", form, h...); r.status != http.StatusForbidden {
			t.Errorf("replay with %s: %s: status %d, want 403", h[0], h[1], r.status)
		}
		if r := w.post("/login", url.Values{"token": {token}}, h...); r.status != http.StatusForbidden {
			t.Errorf("login with %s: %s: status %d, want 403", h[0], h[1], r.status)
		}
	}
	if r := w.get("/replay"); r.status != http.StatusMethodNotAllowed {
		t.Errorf("GET /replay: status %d, want 405", r.status)
	}
	if !w.letterExists(seq) {
		t.Fatal("a cross-site request replayed a letter")
	}
	// The same form from the page itself goes through.
	want(t, w.post("/replay", form, "Sec-Fetch-Site", "same-origin"), http.StatusOK, "1 replayed")
}

func TestReplayAsksForConfirmationFirst(t *testing.T) {
	t.Parallel()
	w := setup(t, console.Config{Token: token})
	a := w.fileLetter(stream.ReasonMaxDeliveries, "m_1", "k1", nil, nil)
	b := w.fileLetter(stream.ReasonMaxDeliveries, "m_1", "k2", nil, nil)
	bad := w.fileLetter(string(payment.ReasonInvalidAmount), "m_1", "k3", nil, nil)
	w.login()
	csrf := w.csrf()

	form := url.Values{"csrf": {csrf}, "seq": {strconv.FormatUint(a, 10), strconv.FormatUint(b, 10), strconv.FormatUint(bad, 10)}}
	r := w.post("/replay", form)
	want(t, r, http.StatusOK, "2 would be replayed, 1 skipped")
	if !strings.Contains(r.body, `id="confirm"`) {
		t.Fatalf("no confirmation button:\n%s", r.body)
	}
	for _, s := range []uint64{a, b, bad} {
		if !w.letterExists(s) {
			t.Fatalf("letter %d replayed before the confirmation", s)
		}
	}
	form.Set("confirm", "yes")
	want(t, w.post("/replay", form), http.StatusOK, "2 replayed, 1 skipped")
	if w.letterExists(a) || w.letterExists(b) || !w.letterExists(bad) {
		t.Fatal("after the confirmation: want the two max_deliveries letters gone and the bad input kept")
	}
	s, err := w.js.Stream(w.ctx, w.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(w.ctx)
	if err != nil || info.State.Msgs != 2 {
		t.Fatalf("payments stream holds %v messages (%v), want the 2 replayed", info.State.Msgs, err)
	}
	// A letter's own button replays it alone, whatever else is ticked.
	c := w.fileLetter(stream.ReasonMaxDeliveries, "m_1", "k4", nil, nil)
	d := w.fileLetter(stream.ReasonMaxDeliveries, "m_1", "k5", nil, nil)
	one := url.Values{"csrf": {csrf}, "confirm": {"yes"}, "one": {strconv.FormatUint(c, 10)}, "seq": {strconv.FormatUint(d, 10)}}
	want(t, w.post("/replay", one), http.StatusOK, "1 replayed")
	if w.letterExists(c) || !w.letterExists(d) {
		t.Fatal("the letter's own button did not replay it alone")
	}
}

// Without a DLQ key nothing verifies, and replay is off even when logged in.
func TestWithoutTheDLQKeyReplayIsOff(t *testing.T) {
	t.Parallel()
	w := setup(t, console.Config{Token: token})
	seq := w.fileLetter(stream.ReasonMaxDeliveries, "m_1", "k1", nil, nil)
	cfg := w.cfg
	cfg.DLQKey = nil
	con, err := console.New(w.js, w.store, console.Config{Stream: cfg, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con.Handler())
	t.Cleanup(srv.Close)
	w.base = srv.URL
	w.login()
	r := w.get("/")
	want(t, r, http.StatusOK, "PAYDEDUP_DLQ_KEY is not set")
	if !strings.Contains(r.body, "UNVERIFIED") {
		t.Fatalf("the letter is not marked unverified:\n%s", r.body)
	}
	want(t, w.post("/replay", seqForm(seq, "confirm", "yes", "csrf", w.csrf())), http.StatusForbidden, "PAYDEDUP_DLQ_KEY")
	if !w.letterExists(seq) {
		t.Fatal("replayed without the DLQ key")
	}
}

func TestReadsNeedALoginWhenConfigured(t *testing.T) {
	t.Parallel()
	if _, err := console.New(nil, nil, console.Config{ReadNeedsLogin: true}); !errors.Is(err, console.ErrConfig) {
		t.Fatalf("ReadNeedsLogin without a token: %v, want ErrConfig", err)
	}
	if _, err := console.New(nil, nil, console.Config{Token: "short"}); !errors.Is(err, console.ErrConfig) {
		t.Fatalf("a short token: %v, want ErrConfig", err)
	}
	w := setup(t, console.Config{Token: token, ReadNeedsLogin: true})
	for _, path := range []string{"/", "/payment?merchant=m_1&key=k", "/letters/1"} {
		if r := w.get(path); r.status != http.StatusSeeOther || r.header.Get("Location") != "/login" {
			t.Errorf("GET %s: status %d Location %q, want a redirect to /login", path, r.status, r.header.Get("Location"))
		}
	}
	w.login()
	want(t, w.get("/"), http.StatusOK, "Overview")
}

func TestLoopback(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{"127.0.0.1:8089": true, "[::1]:0": true, "localhost:1": true, "127.0.0.2:1": true,
		":8089": false, "0.0.0.0:8089": false, "10.0.0.1:80": false, "example.com:80": false, "nonsense": false} {
		if got := console.Loopback(addr); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

// A dead letter is whatever its publisher sent: its markup is shown as
// text, and a card number in it never reaches the page.
func TestPagesEscapeMarkupAndMaskCardNumbers(t *testing.T) {
	t.Parallel()
	w := setup(t, console.Config{Token: token})
	hostile := []byte(`{"merchant_id":"m_1","idempotency_key":"<script>alert(1)</script>","amount":5,"currency":"usd",` +
		`"payment_method":"4242 4242 4242 4242","metadata":{"note":"<img src=x onerror=alert(2)>","card":"5555555555554444"}}`)
	h := nats.Header{}
	h.Set("X-Note", `"><b>bold</b> 4000056655665556`)
	seq := w.fileLetter(string(payment.ReasonInvalidMethod), "m_1", "k", hostile, h)
	for _, path := range []string{"/", "/letters/" + strconv.FormatUint(seq, 10)} {
		r := w.get(path)
		want(t, r, http.StatusOK, "&lt;script&gt;alert(1)&lt;/script&gt;")
		for _, raw := range []string{"<script>alert", "<img src=x", "<b>bold</b>", "4242 4242 4242 4242", "4242424242424242",
			"5555555555554444", "4000056655665556"} {
			if strings.Contains(r.body, raw) {
				t.Errorf("GET %s shows %q", path, raw)
			}
		}
		if !strings.Contains(r.body, "[card number redacted]") {
			t.Errorf("GET %s: no masked card number", path)
		}
	}
	if csp := w.get("/").header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'none'") {
		t.Errorf("Content-Security-Policy %q allows scripts", csp)
	}
}

// The payment lookup shows the key's row, its ledger row and the stored
// provider answer, without the card details that answer may hold.
func TestPaymentLookupShowsRowLedgerAndOutcome(t *testing.T) {
	t.Parallel()
	w := setup(t, console.Config{})
	cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: "order-7", Amount: 1999, Currency: "usd", PaymentMethod: "pm_card_visa"}
	res, err := w.store.Claim(w.ctx, "h1", time.Minute, ledger.NewClaimRequest(cmd))
	if err != nil || res.Lease == nil {
		t.Fatalf("claim: %v %+v", err, res)
	}
	answer := `{"id":"pi_123","object":"payment_intent","status":"succeeded","amount":1999,` +
		`"payment_method":{"id":"pm_1Abc","card":{"brand":"visa","last4":"4242","exp_month":12,"exp_year":2030,"fingerprint":"Xy12"}},` +
		`"latest_charge":{"payment_method_details":{"card":{"last4":"4242"}}}}`
	if err := w.store.Complete(w.ctx, *res.Lease, ledger.Completion{ChargeID: "pi_123", ResponseStatus: 200, Response: []byte(answer)}); err != nil {
		t.Fatal(err)
	}
	r := w.get("/payment?merchant=m_1&key=order-7")
	for _, s := range []string{`id="record-status">completed<`, `id="ledger-status">succeeded<`, "pi_123", "pm_1Abc", "1999 usd"} {
		if !strings.Contains(r.body, s) {
			t.Errorf("the lookup does not show %q", s)
		}
	}
	for _, s := range []string{"4242", "exp_month\": 12", "Xy12", "2030"} {
		if strings.Contains(r.body, s) {
			t.Errorf("the lookup shows card data %q", s)
		}
	}
	want(t, w.get("/payment?merchant=m_1&key=nope"), http.StatusOK, "No row")
	// A completed row keeps its maybe_charged flag; the page says what the
	// outcome says, not "maybe charged".
	if !strings.Contains(r.body, `id="record-state">completed`) || strings.Contains(r.body, "maybe charged") {
		t.Errorf("the lookup of a completed payment does not say completed, or says maybe charged:\n%s", r.body)
	}
}

// A key purged after the retention leaves its ledger row: the lookup says
// what that row means for the payment (ledger.StateOf), as GET would for a
// payment read from the ledger alone.
func TestPurgedKeyShowsTheLedgerState(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	store, err := dedup.New(testenv.Pool(t), dedup.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []struct {
		key  string
		comp ledger.Completion
	}{
		{"charged", ledger.Completion{ChargeID: "pi_1", ResponseStatus: 200, Response: []byte(`{"id":"pi_1"}`)}},
		{"declined", ledger.Completion{Declined: true, ResponseStatus: 402, Response: []byte(`{"error":{"code":"card_declined"}}`)}},
		{"processing", ledger.Completion{ChargeID: "pi_3", Processing: true, ResponseStatus: 202, Response: []byte(`{"id":"pi_3"}`)}},
	} {
		cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: c.key, Amount: 700, Currency: "usd", PaymentMethod: "pm_card_visa"}
		res, err := store.Claim(ctx, "h1", time.Minute, ledger.NewClaimRequest(cmd))
		if err != nil || res.Lease == nil {
			t.Fatalf("claim: %v %+v", err, res)
		}
		if err := store.Complete(ctx, *res.Lease, c.comp); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(ledger.DefaultRetention + time.Hour)
	if n, err := store.Purge(ctx, 10); err != nil || n != 3 {
		t.Fatalf("purge: %d %v", n, err)
	}
	con, err := console.New(nil, store, console.Config{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con.Handler())
	t.Cleanup(srv.Close)
	for key, words := range map[string]string{"charged": "completed: charged", "declined": "completed: declined, never charged",
		"processing": "completed as processing"} {
		resp, err := http.Get(srv.URL + "/payment?merchant=m_1&key=" + key)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), "No row") || !strings.Contains(string(body), `id="payment-state">`+words) {
			t.Errorf("the lookup of purged key %s does not say %q:\n%s", key, words, body)
		}
	}
}

// A failed row was not charged, and is retried only by a redelivery: the
// console never calls it "retrying" outright (its message may wait in the
// dead letters for an operator), and says so on the overview and the
// lookup.
func TestFailedPaymentIsNotCalledRetrying(t *testing.T) {
	t.Parallel()
	w := setup(t, console.Config{})
	cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: "order-8", Amount: 500, Currency: "usd", PaymentMethod: "pm_card_visa"}
	res, err := w.store.Claim(w.ctx, "h1", time.Minute, ledger.NewClaimRequest(cmd))
	if err != nil || res.Lease == nil {
		t.Fatalf("claim: %v %+v", err, res)
	}
	if st, err := w.store.Fail(w.ctx, *res.Lease, "provider: 400 invalid_request_error"); err != nil || st != ledger.StatusFailed {
		t.Fatalf("fail: %v %s", err, st)
	}
	w.fileLetter(stream.ReasonProviderRejected, "m_1", "order-8", nil, nil)
	r := w.get("/payment?merchant=m_1&key=order-8")
	for _, s := range []string{`id="record-status">failed<`, `id="record-state">not charged`, "waits for an operator"} {
		if !strings.Contains(r.body, s) {
			t.Errorf("the lookup of a failed payment does not show %q:\n%s", s, r.body)
		}
	}
	o := w.get("/")
	if strings.Contains(o.body, "retrying)") || !strings.Contains(o.body, "waits for an operator") {
		t.Errorf("the overview calls failed rows retrying, or does not say they may wait for an operator:\n%s", o.body)
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"pm_card_visa", "pm_card_visa"},
		{"4242424242424242", "[card number redacted]"},
		{"card 4242-4242-4242-4242 ok", "card [card number redacted] ok"},
		{"1234 1234 1234 1234", "1234 1234 1234 1234"}, // no window passes Luhn: not a card number
		{"order 123456789012", "order 123456789012"},   // too short
		{"2026-12-02T04:05:06Z", "2026-12-02T04:05:06Z"},
		{"x4111111111111111y", "x4111111111111111y"},     // an identifier (issue 54, item 6)
		{"99994111111111111111", "99994111111111111111"}, // glued to other digits: an id
	} {
		if got := console.Redact(c.in); got != c.want {
			t.Errorf("Redact(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	got := redact.ShownBody([]byte(`{"payment_method":{"id":"pm_1","card":{"last4":"4242"}},"billing_details":{"name":"A"},"amount":5}`))
	if strings.Contains(got, "4242") || strings.Contains(got, `"A"`) || !strings.Contains(got, `"payment_method": "pm_1"`) {
		t.Errorf("ShownBody kept card or personal data, or lost the token:\n%s", got)
	}
}

// After a DLQ key rotation the console verifies and replays a letter
// signed with the previous key, and says so on the letter's page.
func TestLetterSignedWithAPreviousKeyReplays(t *testing.T) {
	t.Parallel()
	w := setup(t, console.Config{Token: token})
	seq := w.fileLetter(stream.ReasonMaxDeliveries, "m_1", "k1", nil, nil) // signed with testenv.DLQKey
	cfg := w.cfg
	cfg.DLQKey, cfg.DLQPreviousKeys = []byte("console-rotated-dlq-key-0123456789abcdef"), [][]byte{[]byte(testenv.DLQKey)}
	con, err := console.New(w.js, w.store, console.Config{Stream: cfg, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con.Handler())
	t.Cleanup(srv.Close)
	w.base = srv.URL
	w.login()
	want(t, w.get("/letters/"+strconv.FormatUint(seq, 10)), http.StatusOK, "signed with a previous DLQ key ("+stream.DLQKeyID([]byte(testenv.DLQKey))+")")
	want(t, w.post("/replay", seqForm(seq, "confirm", "yes", "csrf", w.csrf())), http.StatusOK, "1 replayed")
	if w.letterExists(seq) {
		t.Fatal("a letter signed with a previous key was not replayed")
	}
}
