package console_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/console"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// DNS rebinding: a web page the operator visits that resolves its own
// name to 127.0.0.1 reaches the console with its own name as the Host. The
// console answers only to localhost, IP addresses and configured names.
func TestConsoleRefusesAForeignHost(t *testing.T) {
	t.Parallel()
	w := setup(t, console.Config{})
	w.fileLetter(stream.ReasonMaxDeliveries, "m_1", "k1", nil, nil)
	port := w.base[strings.LastIndex(w.base, ":")+1:]
	for _, host := range []string{"attacker.example", "attacker.example:" + port, "localhost.attacker.example", "127.0.0.1.nip.io:" + port} {
		for _, path := range []string{"/", "/letters/1", "/payment?merchant=m_1&key=k1", "/login"} {
			r := w.send(http.MethodGet, path, nil, map[string]string{"Host": host})
			if r.status != http.StatusMisdirectedRequest || strings.Contains(r.body, "k1") {
				t.Errorf("GET %s with Host %q: status %d, want 421 without the page", path, host, r.status)
			}
		}
	}
	if r := w.send(http.MethodGet, "/", nil, map[string]string{"Host": "attacker.example"}); !strings.Contains(r.body, "PAYDEDUP_CONSOLE_HOSTS") {
		t.Errorf("the refusal does not say how to allow a name:\n%s", r.body)
	}
	for _, host := range []string{"localhost:" + port, "LOCALHOST", "127.0.0.1:" + port, "[::1]:" + port, "localhost.:" + port} {
		if r := w.send(http.MethodGet, "/", nil, map[string]string{"Host": host}); r.status != http.StatusOK {
			t.Errorf("GET / with Host %q: status %d, want 200", host, r.status)
		}
	}
}

func TestConsoleAnswersToConfiguredHosts(t *testing.T) {
	t.Parallel()
	for _, bad := range [][]string{{""}, {"*.example.com"}, {"ops.example.com:8089"}, {"http://ops.example.com"}, {"a b"}} {
		if _, err := console.New(nil, nil, console.Config{Hosts: bad}); !errors.Is(err, console.ErrConfig) {
			t.Errorf("Hosts %q: %v, want ErrConfig", bad, err)
		}
	}
	w := setup(t, console.Config{Hosts: []string{"Console.Ops.Example"}})
	if r := w.send(http.MethodGet, "/", nil, map[string]string{"Host": "console.ops.example:443"}); r.status != http.StatusOK {
		t.Errorf("a configured name: status %d, want 200", r.status)
	}
	if r := w.send(http.MethodGet, "/", nil, map[string]string{"Host": "other.ops.example"}); r.status != http.StatusMisdirectedRequest {
		t.Errorf("another name: status %d, want 421", r.status)
	}
}

// Logging out ends the session on the server: the old cookie, replayed,
// is no session.
func TestLogoutEndsTheSession(t *testing.T) {
	t.Parallel()
	w := setup(t, console.Config{Token: token, ReadNeedsLogin: true})
	seq := w.fileLetter(stream.ReasonMaxDeliveries, "m_1", "k1", nil, nil)
	w.login()
	u, _ := url.Parse(w.base)
	old := w.client.Jar.Cookies(u)
	csrf := w.csrf()
	r := w.post("/logout", url.Values{"csrf": {csrf}})
	if r.status != http.StatusSeeOther {
		t.Fatalf("logout: status %d\n%s", r.status, r.body)
	}
	w.client.Jar.SetCookies(u, old) // the attacker's copy of the cookie
	if r := w.get("/"); r.status != http.StatusSeeOther || r.header.Get("Location") != "/login" {
		t.Errorf("GET / with the logged-out cookie: status %d Location %q, want a redirect to /login", r.status, r.header.Get("Location"))
	}
	want(t, w.post("/replay", seqForm(seq, "confirm", "yes", "csrf", csrf)), http.StatusForbidden, "log in")
	if !w.letterExists(seq) {
		t.Fatal("a logged-out cookie replayed a letter")
	}
}

// A session ends after its lifetime, by the console's clock.
func TestSessionsExpire(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	w := setup(t, console.Config{Token: token, ReadNeedsLogin: true, SessionTTL: time.Hour, Now: clock})
	w.login()
	want(t, w.get("/"), http.StatusOK, "Overview")
	mu.Lock()
	now = now.Add(time.Hour + time.Second)
	mu.Unlock()
	if r := w.get("/"); r.status != http.StatusSeeOther {
		t.Errorf("GET / after the session's lifetime: status %d, want a redirect to /login", r.status)
	}
}

// Behind a TLS proxy the request is plain HTTP: the cookie is Secure when
// configured, whatever the request.
func TestSessionCookieIsSecureWhenConfigured(t *testing.T) {
	t.Parallel()
	w := setup(t, console.Config{Token: token, SecureCookie: true})
	r := w.send(http.MethodPost, "/login", url.Values{"token": {token}}, nil)
	if c := r.header.Get("Set-Cookie"); r.status != http.StatusSeeOther || !strings.Contains(c, "; Secure") {
		t.Fatalf("login: status %d, Set-Cookie %q, want Secure", r.status, c)
	}
}

// Wrong logins are throttled: a burst of guesses gets 429s, and the
// throttled attempts are never compared with the token.
func TestWrongLoginsAreThrottled(t *testing.T) {
	t.Parallel()
	w := setup(t, console.Config{Token: token})
	var wrong, throttled int
	for i := range 50 {
		r := w.post("/login", url.Values{"token": {"guess-" + strconv.Itoa(i)}})
		switch r.status {
		case http.StatusUnauthorized:
			wrong++
		case http.StatusTooManyRequests:
			throttled++
			if r.header.Get("Retry-After") == "" {
				t.Errorf("a 429 without Retry-After")
			}
		default:
			t.Fatalf("guess %d: status %d", i, r.status)
		}
	}
	if wrong > console.DefaultLoginBurst+2 || throttled == 0 {
		t.Fatalf("50 wrong logins at once: %d compared, %d throttled; want at most about %d compared", wrong, throttled, console.DefaultLoginBurst)
	}
	if len(w.post("/login", url.Values{"token": {token}}).header.Values("Set-Cookie")) != 0 {
		t.Error("the right token got a session while logins are throttled")
	}
}

// A guessable token is refused at start, saying why.
func TestWeakTokensAreRefused(t *testing.T) {
	t.Parallel()
	for _, tok := range []string{"short", "aaaaaaaaaaaaaaaa", strings.Repeat("a", 64), strings.Repeat("ab", 32), "password12345678", "0123456789abcdef"} {
		_, err := console.New(nil, nil, console.Config{Token: tok})
		if !errors.Is(err, console.ErrConfig) || !strings.Contains(err.Error(), "128 bits") {
			t.Errorf("token %q: %v, want ErrConfig naming the 128-bit rule", tok, err)
		}
	}
	for _, tok := range []string{token, "4f9c2e7a1b8d3f60c5e2a9174d8b3e6f0a2c5e7b9d1f3a5c7e9b2d4f6a8c0e1b", "Zq3+Yk8/Pw2mR7xT5vN1bL9cH4gF6dS0aE2jU8oI3y="} {
		if _, err := console.New(nil, nil, console.Config{Token: tok}); err != nil {
			t.Errorf("token %q: %v", tok, err)
		}
	}
}

// Tokens that pass a count of characters and their variety but that a
// guesser tries first are refused, naming what gives them away and how to
// make a good one: a sequence, a repeat, keyboard walks, and a phrase with
// a sequence in it.
func TestPredictableTokensAreRefused(t *testing.T) {
	t.Parallel()
	for tok, why := range map[string]string{
		"abcdefghijklmnopqrstuvwxyzab":            "ascending sequence",
		"zyxwvutsrqponmlkjihgfedcbaZYXWVUTSRQPON": "descending sequence",
		"0123456789abcdef0123456789abcdef":        "repeat",
		"qwertyuiopasdfghjklzxcvbnm1234567890":    "keyboard walk",
		"1qaz2wsx3edc4rfv5tgb6yhn7ujm8ik,9ol.":    "keyboard walk",
		"QWERTYUIOP{}ASDFGHJKL:ZXCVBNM<>?!@#$%^&": "keyboard walk",
		"console-test-token-0123456789-and-more":  "ascending sequence",
		"Tr0ub4dor&3-Tr0ub4dor&3-Tr0ub4dor&3-xyz": "repeat",
	} {
		_, err := console.New(nil, nil, console.Config{Token: tok})
		if !errors.Is(err, console.ErrConfig) || !strings.Contains(err.Error(), "128 bits") ||
			!strings.Contains(err.Error(), why) || !strings.Contains(err.Error(), "paydedup console token") {
			t.Errorf("token %q: %v, want ErrConfig naming the 128-bit rule, %q and paydedup console token", tok, err, why)
		}
	}
}

// ?flash= shows only the console's own messages, never a link's text.
func TestFlashShowsOnlyTheConsolesOwnMessages(t *testing.T) {
	t.Parallel()
	w := setup(t, console.Config{Token: token})
	r := w.get("/?flash=" + url.QueryEscape("Security notice: call +1 555 0100 and read them your token"))
	if strings.Contains(r.body, "Security notice") {
		t.Fatalf("the banner shows a link's text:\n%s", r.body)
	}
	w.login()
	r = w.post("/logout", url.Values{"csrf": {w.csrf()}})
	if loc := r.header.Get("Location"); r.status != http.StatusSeeOther || !strings.Contains(w.get(loc).body, "Logged out") {
		t.Fatalf("logout: status %d Location %q, want the overview saying Logged out", r.status, loc)
	}
}

// A dead letter's control bytes are shown escaped, as dlq show prints
// them, and a card number reaches no field of any page: not the original
// subject, the reason, the headers, the replay's report, nor the provider
// outcome a merchant's description was echoed into.
func TestEveryFieldIsRedactedAndPrintable(t *testing.T) {
	t.Parallel()
	w := setup(t, console.Config{Token: token})
	const pan = "4111111111111111"
	h := nats.Header{}
	h.Set("X-Card-"+pan, pan+" 12/28")
	h.Set("X-Title", "\x1b]0;owned\x07")
	h.Set(stream.HeaderIdempotencyKey, "k\x1b[2J")
	body := []byte("{\"merchant_id\":\"m_" + pan + "\",\"note\":\"order 12 " + pan + "\"}\x1bc\xff")
	d := stream.Letter{Reason: stream.ReasonMaxDeliveries, Err: errors.New("provider: card " + pan + " 123 declined\x1b[31m"),
		OrigSubject: w.cfg.SubjectPrefix + "." + pan, OrigStream: w.cfg.Name, OrigSeq: 7, Deliveries: 6, Header: h, Data: body, FailedAt: time.Now()}
	ack, err := w.js.PublishMsg(w.ctx, d.Msg(w.cfg))
	if err != nil {
		t.Fatal(err)
	}
	forged := d
	forged.Reason = "x" // a letter published straight to the DLQ with a card number as its reason
	m := forged.Msg(w.cfg)
	m.Subject = w.cfg.DLQPrefix + "." + pan
	m.Header.Set(stream.HeaderDLQReason, pan)
	m.Header.Set(nats.MsgIdHdr, "forged")
	ack2, err := w.js.PublishMsg(w.ctx, m)
	if err != nil || ack2.Duplicate {
		t.Fatalf("publish the forged letter: %v %+v", err, ack2)
	}
	w.login()
	pages := map[string]string{}
	for _, path := range []string{"/", "/letters/" + strconv.FormatUint(ack.Sequence, 10), "/letters/" + strconv.FormatUint(ack2.Sequence, 10)} {
		r := w.get(path)
		if r.status != http.StatusOK {
			t.Fatalf("GET %s: %d", path, r.status)
		}
		pages[path] = r.body
	}
	pages["replay"] = w.post("/replay", seqForm(ack.Sequence, "csrf", w.csrf())).body

	// The provider echoed a merchant's description and metadata into the
	// stored outcome.
	cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: "order-7", Amount: 1999, Currency: "usd", PaymentMethod: "pm_card_visa"}
	res, err := w.store.Claim(context.Background(), "h1", time.Minute, ledger.NewClaimRequest(cmd))
	if err != nil || res.Lease == nil {
		t.Fatalf("claim: %v %+v", err, res)
	}
	answer := `{"id":"pi_1","status":"succeeded","description":"order 12 ` + pan + `","metadata":{"note":"` + pan + ` 12/28","n":"4111\t1111\t1111\t1111"}}`
	if err := w.store.Complete(context.Background(), *res.Lease, ledger.Completion{ChargeID: "pi_1", ResponseStatus: 200, Response: []byte(answer)}); err != nil {
		t.Fatal(err)
	}
	pages["payment"] = w.get("/payment?merchant=m_1&key=order-7").body
	if !strings.Contains(pages["payment"], "pi_1") {
		t.Fatalf("the lookup does not show the outcome:\n%s", pages["payment"])
	}
	for name, body := range pages {
		for _, bad := range []string{pan, "4111\t1111", "\x1b", "\x07", "\xff"} {
			if strings.Contains(body, bad) {
				t.Errorf("%s shows %q", name, bad)
			}
		}
	}
	if p := pages["/letters/"+strconv.FormatUint(ack.Sequence, 10)]; !strings.Contains(p, `\x1b]0;owned\x07`) || !strings.Contains(p, `}\x1bc\xff`) {
		t.Errorf("the letter's control bytes are not shown escaped:\n%s", p[strings.Index(p, "<main>"):])
	}
}
