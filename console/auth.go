package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// cookieName is the session cookie.
const cookieName = "paydedup_console"

// auth holds the operator token and signs sessions. A session is
// "<expiry>.<HMAC(key, expiry)>" under a key drawn at start-up: nothing is
// stored, and a restart logs everyone out.
type auth struct {
	tokenSum [sha256.Size]byte
	hasToken bool
	key      []byte
	ttl      time.Duration
	now      func() time.Time
}

func newAuth(token string, ttl time.Duration) (*auth, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("draw the console's session key: %w", err)
	}
	return &auth{tokenSum: sha256.Sum256([]byte(token)), hasToken: token != "", key: key, ttl: ttl, now: time.Now}, nil
}

// tokenOK compares in constant time; hashing first hides the token's length.
func (a *auth) tokenOK(given string) bool {
	sum := sha256.Sum256([]byte(given))
	return a.hasToken && subtle.ConstantTimeCompare(sum[:], a.tokenSum[:]) == 1
}

func (a *auth) mac(parts ...string) string {
	m := hmac.New(sha256.New, a.key)
	m.Write([]byte(strings.Join(parts, "|")))
	return hex.EncodeToString(m.Sum(nil))
}

func (a *auth) newSession() (value string, expires time.Time) {
	expires = a.now().Add(a.ttl)
	exp := strconv.FormatInt(expires.Unix(), 10)
	return exp + "." + a.mac("session", exp), expires
}

// session returns the request's valid session cookie value.
func (a *auth) session(r *http.Request) (string, bool) {
	if !a.hasToken {
		return "", false
	}
	c, err := r.Cookie(cookieName)
	if err != nil {
		return "", false
	}
	exp, sig, ok := strings.Cut(c.Value, ".")
	if !ok || !hmac.Equal([]byte(sig), []byte(a.mac("session", exp))) {
		return "", false
	}
	unix, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || !a.now().Before(time.Unix(unix, 0)) {
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
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, http.StatusOK, "login.html", c.page(r, "log in", nil))
}

// login is POST /login with token=...: a session cookie when it is the
// operator token. A cross-site POST never gets here (cross-origin
// protection), so another site cannot log a browser in either.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if !c.auth.hasToken {
		c.refuse(w, r, http.StatusForbidden, c.readOnlyReason())
		return
	}
	if err := r.ParseForm(); err != nil {
		c.refuse(w, r, http.StatusBadRequest, "unreadable form")
		return
	}
	if !c.auth.tokenOK(r.PostForm.Get("token")) {
		c.log.Warn("console login refused: wrong token", "remote_addr", r.RemoteAddr)
		c.refuse(w, r, http.StatusUnauthorized, "wrong token")
		return
	}
	value, expires := c.auth.newSession()
	c.auth.setCookie(w, r, value, expires)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || !c.auth.checkCSRF(r, r.PostForm.Get("csrf")) {
		c.refuse(w, r, http.StatusForbidden, "the form's CSRF token is missing or wrong")
		return
	}
	c.auth.setCookie(w, r, "", time.Unix(1, 0))
	http.Redirect(w, r, "/", http.StatusSeeOther)
}
