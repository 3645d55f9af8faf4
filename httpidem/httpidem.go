// Package httpidem is a net/http middleware that makes a handler's side
// effect happen once per Idempotency-Key, for services that run the side
// effect inside their own handler (rather than through paydedup's queue).
//
// Before the handler runs, the middleware claims (scope, key) in its own
// committed transaction, so a crash or a rollback in the handler cannot
// erase the claim. The handler's response is captured (status, headers,
// body) and stored on 2xx and on 4xx business errors, then sent; a retry
// gets it back byte for byte with Idempotent-Replayed: true. On 5xx, on a
// panic, and when the client hangs up before the handler produced a 2xx,
// the claim is released so a retry runs the handler again. A concurrent
// request with the same key gets 409 with Retry-After; the same key with a
// different request gets 422. Handlers never see any of it.
//
// Keys belong to a caller: Config.Scope is required and must name the
// authenticated client (and usually the route), so that two clients that
// happen to send the same key never get each other's response. A response
// too large to store is sent once; the key then keeps a stored error saying
// so, and the handler never runs again for it.
//
// A claim is a lease: the handler's context ends when the lease does, and a
// request arriving after it expired (the holder crashed) runs the handler
// again. A handler calling another service should pass that service an
// idempotency key derived from the request's, as paydedup's worker does.
//
// The Postgres store is *Store (table http_idempotency, migration
// 00003); any Store works.
package httpidem

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Header names.
const (
	HeaderIdempotencyKey   = "Idempotency-Key"
	HeaderIdempotentReplay = "Idempotent-Replayed"
)

// Defaults for Config.
const (
	DefaultLease            = time.Minute
	DefaultRetention        = 24 * time.Hour // Stripe's key window
	DefaultMaxBodyBytes     = 1 << 20
	DefaultMaxResponseBytes = 1 << 20
	DefaultStoreTimeout     = 5 * time.Second
	maxKeyLen               = 255
)

// Sentinel errors of ParseKey.
var (
	// ErrMissingKey means the request has no Idempotency-Key (or an empty one).
	ErrMissingKey = errors.New("missing Idempotency-Key")
	// ErrInvalidKey means the Idempotency-Key is repeated, badly quoted, too
	// long or not printable ASCII.
	ErrInvalidKey = errors.New("invalid Idempotency-Key")
)

// ErrLeaseLost means a Store no longer holds the claim: its lease passed
// and another request took it over. Nothing was changed.
var ErrLeaseLost = errors.New("lease lost")

// Store keeps claims and responses. *Store implements it on Postgres.
type Store interface {
	ClaimResponse(ctx context.Context, scope, key string, hash []byte, lease, retention time.Duration) (ResponseClaimResult, error)
	CompleteResponse(ctx context.Context, c ResponseClaim, resp StoredResponse) error
	ReleaseResponse(ctx context.Context, c ResponseClaim, reason string) error
}

// Config configures the middleware. Zero values take the defaults.
type Config struct {
	// Lease is how long a claim lets the handler run; the handler's context
	// ends with it.
	Lease time.Duration
	// Retention is how long a stored response is replayed.
	Retention time.Duration
	// MaxBodyBytes bounds the request body (read whole, to fingerprint it).
	MaxBodyBytes int64
	// MaxResponseBytes bounds a response kept for replay. A larger response
	// is sent to its client but not stored: the key keeps instead a 500
	// problem (type urn:paydedup:problem:response-not-stored) saying the
	// request ran once, with the original status, and a retry gets that, so
	// the handler's side effect never runs twice. Logged as an error.
	MaxResponseBytes int
	// Methods the middleware applies to; others pass straight through.
	// Default POST and PATCH.
	Methods []string
	// Optional lets requests without an Idempotency-Key through unprotected;
	// by default they get 400.
	Optional bool
	// Scope names the key space of a request. Required: it must include the
	// authenticated caller's identity (an account or API key id set by
	// authentication, which runs before this middleware), and usually the
	// method and route; keys are unique only within a scope, and the
	// fingerprint does not include the caller. A request for which it
	// returns "" is answered 500 and not run.
	Scope func(r *http.Request) string
	// Fingerprint identifies "the same request". Default: SHA-256 of the
	// method, path, query and body. It must return 32 bytes.
	Fingerprint func(r *http.Request, body []byte) [32]byte
	// Storable says which statuses are final and stored. Default: 200-499
	// except 408, 425 and 429, which ask the client to retry.
	Storable func(status int) bool
	// StoreTimeout bounds each store call.
	StoreTimeout time.Duration
	Logger       *slog.Logger
}

// Middleware is the idempotency middleware. Use Wrap.
type Middleware struct {
	store Store
	cfg   Config
	log   *slog.Logger
}

// New returns a middleware on store.
func New(store Store, cfg Config) (*Middleware, error) {
	if store == nil {
		return nil, errors.New("httpidem: nil store")
	}
	cfg.Lease = cmp.Or(cfg.Lease, DefaultLease)
	cfg.Retention = cmp.Or(cfg.Retention, DefaultRetention)
	cfg.MaxBodyBytes = cmp.Or(cfg.MaxBodyBytes, DefaultMaxBodyBytes)
	cfg.MaxResponseBytes = cmp.Or(cfg.MaxResponseBytes, DefaultMaxResponseBytes)
	cfg.StoreTimeout = cmp.Or(cfg.StoreTimeout, DefaultStoreTimeout)
	if len(cfg.Methods) == 0 {
		cfg.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if cfg.Scope == nil {
		return nil, errors.New("httpidem: Config.Scope is required: return the authenticated caller's identity and the route " +
			"(e.g. account + \" \" + r.Method + \" \" + r.URL.Path), so that callers never share keys")
	}
	if cfg.Fingerprint == nil {
		cfg.Fingerprint = defaultFingerprint
	}
	if cfg.Storable == nil {
		cfg.Storable = DefaultStorable
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case cfg.Lease <= 0 || cfg.Retention <= cfg.Lease:
		return nil, fmt.Errorf("httpidem: need 0 < lease (%v) < retention (%v)", cfg.Lease, cfg.Retention)
	case cfg.MaxBodyBytes <= 0 || cfg.MaxResponseBytes <= 0 || cfg.StoreTimeout <= 0:
		return nil, errors.New("httpidem: body and response limits and the store timeout must be positive")
	}
	return &Middleware{store: store, cfg: cfg, log: cfg.Logger}, nil
}

// DefaultStorable stores 200-499 except 408 Request Timeout, 425 Too Early
// and 429 Too Many Requests: those say "retry", so they must not be replayed.
func DefaultStorable(status int) bool {
	return status >= 200 && status < 500 && status != http.StatusRequestTimeout &&
		status != http.StatusTooEarly && status != http.StatusTooManyRequests
}

func defaultFingerprint(r *http.Request, body []byte) [32]byte {
	h := sha256.New()
	for _, s := range []string{"httpidem/v1", r.Method, r.URL.Path, r.URL.RawQuery} {
		h.Write([]byte(strconv.Itoa(len(s))))
		h.Write([]byte{':'})
		h.Write([]byte(s))
	}
	h.Write(body)
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// ParseKey reads the Idempotency-Key header: an RFC 8941 sf-string as the
// IETF draft specifies ("..."), or a bare value as Stripe and most clients
// send. It must occur once and hold 1..255 printable ASCII characters.
func ParseKey(h http.Header) (string, error) {
	vals := h.Values(HeaderIdempotencyKey)
	if len(vals) == 0 {
		return "", ErrMissingKey
	}
	if len(vals) > 1 {
		return "", fmt.Errorf("%w: sent more than once", ErrInvalidKey)
	}
	v := strings.Trim(vals[0], " \t")
	if strings.HasPrefix(v, `"`) {
		s, ok := parseSFString(v)
		if !ok {
			return "", fmt.Errorf("%w: not a valid quoted string", ErrInvalidKey)
		}
		v = s
	}
	switch {
	case v == "":
		return "", ErrMissingKey
	case len(v) > maxKeyLen:
		return "", fmt.Errorf("%w: %d characters, limit is %d", ErrInvalidKey, len(v), maxKeyLen)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return "", fmt.Errorf("%w: must be printable ASCII", ErrInvalidKey)
		}
	}
	return v, nil
}

// parseSFString parses DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE
// with nothing after it.
func parseSFString(v string) (string, bool) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\':
			i++
			if i >= len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", false
			}
			b.WriteByte(v[i])
		case c == '"':
			return b.String(), i == len(v)-1
		case c < 0x20 || c > 0x7e:
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return "", false
}

// Wrap returns next protected by the middleware.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !slices.Contains(m.cfg.Methods, r.Method) {
			next.ServeHTTP(w, r)
			return
		}
		key, err := ParseKey(r.Header)
		switch {
		case errors.Is(err, ErrMissingKey) && m.cfg.Optional:
			next.ServeHTTP(w, r)
			return
		case errors.Is(err, ErrMissingKey):
			writeProblem(w, http.StatusBadRequest, "missing-idempotency-key",
				"Send an Idempotency-Key header and reuse it for every retry of this request.")
			return
		case err != nil:
			writeProblem(w, http.StatusBadRequest, "invalid-idempotency-key", err.Error())
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, m.cfg.MaxBodyBytes))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				writeProblem(w, http.StatusRequestEntityTooLarge, "request-too-large",
					fmt.Sprintf("The body exceeds %d bytes.", m.cfg.MaxBodyBytes))
				return
			}
			writeProblem(w, http.StatusBadRequest, "unreadable-body", "The body could not be read.")
			return
		}
		hash := m.cfg.Fingerprint(r, body)
		scope := m.cfg.Scope(r)
		if scope == "" {
			m.log.Error("Config.Scope returned an empty scope: is authentication run before the middleware?", "path", r.URL.Path)
			writeProblem(w, http.StatusInternalServerError, "no-idempotency-scope",
				"The request could not be attributed to a caller; it was not run.")
			return
		}
		log := m.log.With("scope", scope, "idempotency_key", key)

		ctx, cancel := context.WithTimeout(r.Context(), m.cfg.StoreTimeout)
		res, err := m.store.ClaimResponse(ctx, scope, key, hash[:], m.cfg.Lease, m.cfg.Retention)
		cancel()
		if err != nil {
			log.Error("idempotency claim failed", "error", err)
			w.Header().Set("Retry-After", "1")
			writeProblem(w, http.StatusServiceUnavailable, "unavailable",
				"The request could not be registered; retry with the same Idempotency-Key.")
			return
		}
		switch res.Outcome {
		case ResponseReplay:
			replay(w, res.Response)
			return
		case ResponseInFlight:
			secs := int((min(max(res.RetryIn, time.Second), time.Minute) + time.Second - 1) / time.Second)
			w.Header().Set("Retry-After", strconv.Itoa(secs))
			writeProblem(w, http.StatusConflict, "idempotency-key-in-use",
				"A request with this Idempotency-Key is being processed; retry later with the same key.")
			return
		case ResponseMismatch:
			writeProblem(w, http.StatusUnprocessableEntity, "idempotency-key-reused",
				"This Idempotency-Key was already used with a different request.")
			return
		}
		m.run(w, r, next, *res.Claim, body, log)
	})
}

// run runs the handler under a held claim and settles it.
func (m *Middleware) run(w http.ResponseWriter, r *http.Request, next http.Handler, claim ResponseClaim, body []byte, log *slog.Logger) {
	settleCtx := context.WithoutCancel(r.Context())
	release := func(reason string) {
		ctx, cancel := context.WithTimeout(settleCtx, m.cfg.StoreTimeout)
		defer cancel()
		if err := m.store.ReleaseResponse(ctx, claim, reason); err != nil && !errors.Is(err, ErrLeaseLost) {
			log.Warn("could not release the claim; it expires with its lease", "error", err)
		}
	}

	rec := &recorder{header: http.Header{}, max: m.cfg.MaxResponseBytes}
	hctx, cancel := context.WithDeadline(r.Context(), claim.Until)
	defer cancel()
	hr := r.WithContext(hctx)
	hr.Body = io.NopCloser(bytes.NewReader(body))
	hr.ContentLength = int64(len(body))
	func() {
		defer func() {
			if p := recover(); p != nil {
				release(fmt.Sprint("handler panicked: ", p))
				panic(p)
			}
		}()
		next.ServeHTTP(rec, hr)
	}()

	status := rec.status
	if status == 0 {
		status = http.StatusOK // what net/http sends for a handler that wrote nothing
	}
	clientGone := r.Context().Err() != nil
	switch {
	case clientGone && !(rec.status >= 200 && rec.status < 300):
		// Nobody will read it, and the handler did not report success.
		release("client disconnected before completion")
		return
	case !m.cfg.Storable(status):
		release(fmt.Sprintf("status %d is not stored", status))
	default:
		stored := StoredResponse{Status: status, Header: storedHeader(rec.header), Body: rec.body.Bytes()}
		if rec.overflow {
			// The handler ran: releasing the claim would run it again on
			// the retry. Keep an error in place of the response instead.
			log.Error("response larger than MaxResponseBytes: sent, and a retry gets a response-not-stored error",
				"limit", m.cfg.MaxResponseBytes, "status", status, "bytes", rec.body.Len())
			stored = notStored(status, rec.body.Len(), m.cfg.MaxResponseBytes)
		}
		ctx, cancel := context.WithTimeout(settleCtx, m.cfg.StoreTimeout)
		err := m.store.CompleteResponse(ctx, claim, stored)
		cancel()
		if err != nil {
			// The handler's effect happened: answer anyway. The claim stays
			// pending until its lease passes (or was already taken over).
			log.Error("could not store the response; a retry after the lease runs the handler again", "error", err)
		}
	}
	rec.send(w, status)
}

// notStored is what a key keeps when its response was too large to store:
// a problem that says the request ran once, with the original status.
func notStored(status, size, limit int) StoredResponse {
	detail := fmt.Sprintf("The request with this Idempotency-Key ran once and answered %d, but its response (%d bytes) "+
		"exceeded the %d bytes kept for replay, so it cannot be sent again. The operation was not repeated; "+
		"do not retry it with a new key: look its result up instead.", status, size, limit)
	rec := &recorder{header: http.Header{}, max: math.MaxInt}
	writeProblem(rec, http.StatusInternalServerError, "response-not-stored", detail)
	return StoredResponse{Status: http.StatusInternalServerError, Header: storedHeader(rec.header), Body: rec.body.Bytes()}
}

// hopByHop headers are about one connection, not the response.
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade", "Trailer", "Te", "Date"}

func storedHeader(h http.Header) map[string][]string {
	out := make(map[string][]string, len(h))
	for k, v := range h {
		if !slices.Contains(hopByHop, http.CanonicalHeaderKey(k)) {
			out[k] = slices.Clone(v)
		}
	}
	return out
}

func replay(w http.ResponseWriter, resp *StoredResponse) {
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = slices.Clone(v)
	}
	h.Set(HeaderIdempotentReplay, "true")
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// recorder captures a handler's response; nothing reaches the client
// before it is stored.
type recorder struct {
	header   http.Header
	status   int
	body     bytes.Buffer
	max      int
	overflow bool
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.status != 0 || code < 200 { // informational responses are not the answer
		return
	}
	r.status = code
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if r.body.Len()+len(b) > r.max {
		r.overflow = true
	}
	return r.body.Write(b)
}

func (r *recorder) send(w http.ResponseWriter, status int) {
	h := w.Header()
	for k, v := range r.header {
		h[k] = v
	}
	w.WriteHeader(status)
	_, _ = w.Write(r.body.Bytes())
}

type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

func writeProblem(w http.ResponseWriter, status int, typ, detail string) {
	b, _ := json.Marshal(problem{Type: "urn:paydedup:problem:" + typ, Title: http.StatusText(status), Status: status, Detail: detail})
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
