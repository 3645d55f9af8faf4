package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// cookieName is the session cookie.
const cookieName = "paydedup_console"

// maxSessions bounds the sessions held at once; a login beyond it ends the
// one closest to its expiry.
const maxSessions = 1024

// MinTokenBits is the least estimated entropy of an operator token.
const MinTokenBits = 128

// auth holds the operator token and the sessions. A session is a random
// id the console keeps, with its expiry, until logout or expiry: logout
// burns it, so a copy of the cookie is worth nothing afterwards, and a
// restart logs everyone out. Only the id's SHA-256 is kept, compared by
// map lookup of a 256-bit value no one can guess.
type auth struct {
	tokenSum [sha256.Size]byte
	hasToken bool
	key      []byte // signs the CSRF tokens
	ttl      time.Duration
	now      func() time.Time
	secure   bool
	logins   *rate.Limiter

	mu       sync.Mutex
	sessions map[[sha256.Size]byte]time.Time
}

func newAuth(cfg Config) (*auth, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("draw the console's CSRF key: %w", err)
	}
	return &auth{tokenSum: sha256.Sum256([]byte(cfg.Token)), hasToken: cfg.Token != "", key: key, ttl: cfg.SessionTTL,
		now: cfg.Now, secure: cfg.SecureCookie, logins: rate.NewLimiter(rate.Limit(cfg.LoginRate), cfg.LoginBurst),
		sessions: map[[sha256.Size]byte]time.Time{}}, nil
}

// ValidateToken says why an operator token is too guessable: it needs an
// estimated MinTokenBits bits (estimateToken: its unpredictable characters
// times the lesser of the bits its character classes allow and the bits
// its characters' frequencies show; sequences, repeats and keyboard walks
// count for nothing) and MinTokenLen characters.
func ValidateToken(token string) error {
	est := estimateToken(token)
	bits := est.bits
	if len(token) < MinTokenLen || bits < MinTokenBits {
		why := ""
		if est.pattern != "" {
			why = fmt.Sprintf(" (%d of them predictable; the longest stretch is %s)", est.predictable, est.pattern)
		}
		return fmt.Errorf("%w: the token is too guessable: about %.0f bits estimated from its %d characters and their variety%s, need at least %d bits and %d characters: make one with `paydedup console token` (or openssl rand -hex 32)",
			ErrConfig, bits, len([]rune(token)), why, MinTokenBits, MinTokenLen)
	}
	return nil
}

// tokenOK compares in constant time; hashing first hides the token's length.
func (a *auth) tokenOK(given string) bool {
	sum := sha256.Sum256([]byte(given))
	return a.hasToken && hmac.Equal(sum[:], a.tokenSum[:])
}

func (a *auth) mac(parts ...string) string {
	m := hmac.New(sha256.New, a.key)
	m.Write([]byte(strings.Join(parts, "|")))
	return hex.EncodeToString(m.Sum(nil))
}

// newSession starts a session and returns its cookie value.
func (a *auth) newSession() (value string, expires time.Time, err error) {
	id := make([]byte, 32)
	if _, err := rand.Read(id); err != nil {
		return "", time.Time{}, fmt.Errorf("draw a session id: %w", err)
	}
	value = hex.EncodeToString(id)
	now := a.now()
	expires = now.Add(a.ttl)
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, exp := range a.sessions {
		if !now.Before(exp) {
			delete(a.sessions, k)
		}
	}
	for len(a.sessions) >= maxSessions {
		var first [sha256.Size]byte
		var firstExp time.Time
		for k, exp := range a.sessions {
			if firstExp.IsZero() || exp.Before(firstExp) {
				first, firstExp = k, exp
			}
		}
		delete(a.sessions, first)
	}
	a.sessions[sha256.Sum256([]byte(value))] = expires
	return value, expires, nil
}

// endSession burns a session: its cookie is no session any more.
func (a *auth) endSession(value string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.sessions, sha256.Sum256([]byte(value)))
}

// session returns the request's live session cookie value.
func (a *auth) session(r *http.Request) (string, bool) {
	if !a.hasToken {
		return "", false
	}
	c, err := r.Cookie(cookieName)
	if err != nil || len(c.Value) != 64 {
		return "", false
	}
	k := sha256.Sum256([]byte(c.Value))
	a.mu.Lock()
	defer a.mu.Unlock()
	exp, ok := a.sessions[k]
	if !ok {
		return "", false
	}
	if !a.now().Before(exp) {
		delete(a.sessions, k)
		return "", false
	}
	return c.Value, true
}

// csrf is the form token of a session.
func (a *auth) csrf(session string) string { return a.mac("csrf", session) }

// checkCSRF reports whether a form's token belongs to the request's session.
func (a *auth) checkCSRF(r *http.Request, given string) bool {
	s, ok := a.session(r)
	return ok && given != "" && hmac.Equal([]byte(given), []byte(a.csrf(s)))
}

// requireSession refuses a request without a valid session: a page asks
// for the login, anything else is 403.
func (a *auth) requireSession(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := a.session(r); ok {
			next.ServeHTTP(w, r)
			return
		}
		if r.Method == http.MethodGet {
			http.Redirect(w, r, "/login", http.StatusSeeOther)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintln(w, "log in with the console token first (POST /login)")
	})
}

func (a *auth) setCookie(w http.ResponseWriter, r *http.Request, value string, expires time.Time) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: value, Path: "/", Expires: expires,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: a.secure || r.TLS != nil})
}

// hostAllowed reports whether a request's Host is one the console answers
// to: localhost, an IP address (a page cannot rebind a literal address to
// another name, so DNS rebinding always shows a name), or a configured
// name. Anything else is a page that resolved its own name to this
// listener.
func hostAllowed(host string, names map[string]bool) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if host == "" {
		return false
	}
	return host == "localhost" || net.ParseIP(host) != nil || names[host]
}

// checkHost refuses a request whose Host is not one the console answers to.
func (c *Console) checkHost(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hostAllowed(r.Host, c.hosts) {
			next.ServeHTTP(w, r)
			return
		}
		c.log.Warn("console request refused: foreign Host", "host", shown(r.Host), "remote_addr", r.RemoteAddr)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusMisdirectedRequest)
		fmt.Fprintf(w, "this console answers only to localhost, an IP address or a name in PAYDEDUP_CONSOLE_HOSTS; Host %q is none of them (a web page rebinding its name to this address is refused this way): add the name to PAYDEDUP_CONSOLE_HOSTS if it is yours\n", shown(r.Host))
	})
}

// ValidateHosts says why a configured host name is not one (Config.Hosts).
func ValidateHosts(hosts []string) error {
	_, err := hostNames(hosts)
	return err
}

func hostNames(hosts []string) (map[string]bool, error) {
	names := map[string]bool{}
	for _, h := range hosts {
		name := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(h)), ".")
		if !validHostName(name) {
			return nil, fmt.Errorf("%w: host name %q: give a plain DNS name such as console.ops.example (no scheme, port or wildcard)", ErrConfig, h)
		}
		names[name] = true
	}
	return names, nil
}

// validHostName reports whether s is a plain DNS name (no port, scheme or
// wildcard).
func validHostName(s string) bool {
	if s == "" || len(s) > 253 || s[0] == '.' || s[0] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, http.StatusOK, "login.html", c.page(r, "log in", nil))
}

// login is POST /login with token=...: a session cookie when it is the
// operator token. A cross-site POST never gets here (cross-origin
// protection), so another site cannot log a browser in either. Every
// attempt reserves a place in the login budget first and a right one gives
// it back: beyond the budget an attempt is answered 429 without being
// checked, so guessing is bounded whatever the answers.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if !c.auth.hasToken {
		c.refuse(w, r, http.StatusForbidden, c.readOnlyReason())
		return
	}
	if err := r.ParseForm(); err != nil {
		c.refuse(w, r, http.StatusBadRequest, "unreadable form")
		return
	}
	res := c.auth.logins.Reserve()
	if delay := res.Delay(); !res.OK() || delay > 0 {
		res.Cancel()
		c.log.Warn("console login throttled", "remote_addr", r.RemoteAddr)
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(max(delay.Seconds(), 1)))))
		c.refuse(w, r, http.StatusTooManyRequests, "too many wrong logins: wait a few seconds and try again")
		return
	}
	if !c.auth.tokenOK(r.PostForm.Get("token")) {
		c.log.Warn("console login refused: wrong token", "remote_addr", r.RemoteAddr)
		c.refuse(w, r, http.StatusUnauthorized, "wrong token")
		return
	}
	res.Cancel()
	value, expires, err := c.auth.newSession()
	if err != nil {
		c.refuse(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	c.auth.setCookie(w, r, value, expires)
	http.Redirect(w, r, "/?flash="+flashLoggedIn, http.StatusSeeOther)
}

// logout burns the session on the server and clears the cookie.
func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || !c.auth.checkCSRF(r, r.PostForm.Get("csrf")) {
		c.refuse(w, r, http.StatusForbidden, "the form's CSRF token is missing or wrong")
		return
	}
	if s, ok := c.auth.session(r); ok {
		c.auth.endSession(s)
	}
	c.auth.setCookie(w, r, "", time.Unix(1, 0))
	http.Redirect(w, r, "/?flash="+flashLoggedOut, http.StatusSeeOther)
}

// The banner's messages: ?flash= names one of them, never carries text.
const (
	flashLoggedIn  = "logged-in"
	flashLoggedOut = "logged-out"
)

var flashes = map[string]string{
	flashLoggedIn:  "Logged in: replay is on until you log out or the session expires.",
	flashLoggedOut: "Logged out: this session is ended on the server.",
}
