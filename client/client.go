package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/paydedup/paydedup/stream"
)

// Defaults of a Client.
const (
	// DefaultRetryFor is how long Create and Get retry before they give up.
	DefaultRetryFor = time.Minute
	// DefaultAttemptTimeout bounds one request (without its Prefer: wait).
	DefaultAttemptTimeout = 15 * time.Second
	// DefaultWait is the longest Prefer: wait one request of Wait asks for
	// (the gateway's own bound, PAYDEDUP_HTTP_MAX_WAIT, is 30 s).
	DefaultWait = 30 * time.Second
)

// maxAnswer bounds the body of an answer read.
const maxAnswer = 1 << 20

// Client is a client of paydedup's HTTP door. It is safe for concurrent
// use. See the package doc for what it does with each answer.
type Client struct {
	base     *url.URL
	apiKey   string
	hc       *http.Client
	retryFor time.Duration
	attempt  time.Duration
	wait     time.Duration
	observe  func(Exchange)
	keys     keyBook
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sends the requests with hc (its Transport, proxies, TLS)
// instead of http.DefaultClient. Each request's timeout is the Client's
// own (WithAttemptTimeout).
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithRetryFor sets how long Create and Get retry, DefaultRetryFor by
// default. The caller's context bounds them too.
func WithRetryFor(d time.Duration) Option { return func(c *Client) { c.retryFor = d } }

// WithAttemptTimeout bounds one request; a request that runs out is
// retried like a lost connection. DefaultAttemptTimeout by default.
func WithAttemptTimeout(d time.Duration) Option { return func(c *Client) { c.attempt = d } }

// WithWait sets the longest Prefer: wait of one of Wait's requests;
// DefaultWait by default.
func WithWait(d time.Duration) Option { return func(c *Client) { c.wait = d } }

// WithObserver calls observe with each request the Client sends and what
// came back, in order, before the Client acts on it: to log, count or audit
// what the gateway told (also the answers Create and Get retry). observe
// runs on the calling goroutine; it must not call the Client.
func WithObserver(observe func(Exchange)) Option { return func(c *Client) { c.observe = observe } }

// Exchange is one request a Client sent and what came back, as
// WithObserver sees it: a payment (Result), a gateway's refusal (Problem),
// another HTTP answer (Status only: a proxy's page), or no answer (Err).
type Exchange struct {
	Method string // POST (Create, Refund, Capture, Cancel) or GET (Get, Wait, and a POST's look after a 409)
	Key    string // the idempotency key asked about
	Kind   string // the operation's (Refund, Capture, Cancel); "" for a payment
	// Status is the answer's HTTP status; 0 when none came (Err).
	Status int
	// Result is the payment the answer holds, if it holds one.
	Result *Result
	// Operation is the refund, capture or cancel answered, if any.
	Operation *OperationResult
	// Problem is the gateway's problem the answer holds, if it holds one.
	Problem *Problem
	// Err is why no answer came: a timeout, a reset, a refused
	// connection, a body cut short, or the caller's context ending.
	Err error
}

// New returns a client of the gateway at baseURL (e.g.
// "https://pay.example.com") that authenticates with apiKey (sent as
// Authorization: Bearer, made by `paydedup apikey create`).
func New(baseURL, apiKey string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: base URL %q: want http(s)://host[:port]", baseURL)
	}
	if apiKey == "" {
		return nil, errors.New("client: an API key is required")
	}
	c := &Client{base: u, apiKey: apiKey, hc: http.DefaultClient,
		retryFor: DefaultRetryFor, attempt: DefaultAttemptTimeout, wait: DefaultWait}
	for _, o := range opts {
		o(c)
	}
	if c.hc == nil || c.retryFor <= 0 || c.attempt <= 0 || c.wait < time.Second {
		return nil, errors.New("client: an option is out of range (an HTTP client, positive durations, a wait of at least 1 s)")
	}
	return c, nil
}

// Create asks for payment p under key and returns what the gateway
// answered: StatusQueued (202: it will be charged once, or end in a
// refusal you can read), StatusSucceeded or StatusProcessing (201),
// StatusDeclined (402), StatusWaitingForOperator (202), or, when a request
// with the key is already in flight (409), the payment's state as GET
// tells it. Answers that may have been accepted, or that ask to come back
// later, are retried with the same key and the same body (see the package
// doc); refusals are a *Problem. A key this Client sent with another
// payment is refused with ErrKeyReused before anything is sent.
func (c *Client) Create(ctx context.Context, key string, p Payment) (Result, error) {
	if err := checkKey(key); err != nil {
		return Result{}, err
	}
	body, err := json.Marshal(p)
	if err != nil {
		return Result{}, fmt.Errorf("client: encode payment: %w", err)
	}
	fresh, mayBeAccepted, err := c.keys.bind(key, sha256.Sum256(body))
	if err != nil {
		return Result{}, err
	}
	res, err := c.retry(ctx, func() (Result, error) {
		a, err := c.do(ctx, http.MethodPost, "/v1/payments", key, "", body, 0)
		if err != nil {
			mayBeAccepted = true
			return Result{}, err
		}
		switch a.status {
		case http.StatusCreated, http.StatusAccepted, http.StatusPaymentRequired:
			mayBeAccepted = true // accepted, even when its body cannot be read
			return a.result()
		case http.StatusConflict: // in flight: ask how it stands
			g, gerr := c.do(ctx, http.MethodGet, paymentPath(key), key, "", nil, 0)
			if gerr == nil && g.status == http.StatusOK {
				if r, err := g.result(); err == nil && r.Status != StatusPublishUnknown {
					return r, nil
				}
			}
			mayBeAccepted = true
			return Result{}, a.retryLater()
		}
		if a.mayBeAccepted() {
			mayBeAccepted = true
		}
		return Result{}, a.failure()
	})
	if mayBeAccepted {
		c.keys.mayBe(key) // until a GET says not-accepted, no answer clears it
	}
	if err != nil && fresh && !mayBeAccepted && boundNothing(err) {
		c.keys.forget(key) // refused at once: the key holds nothing
	}
	if err != nil && mayBeAccepted && !errors.Is(err, ErrKeyReused) && !isFinal(err) {
		err = outcomeUnknown(err)
	}
	return res, err
}

// Get returns the payment under key as it stands, without waiting; it
// changes nothing. Answers that ask to come back (503, 409 while its
// publish settles, a timeout) are retried, and are not ErrNotAccepted when
// it gives up. StatusPublishUnknown means: call Create again with the same
// key and payment. A 404 not-accepted (ErrNotAccepted) tells the Client
// that key holds nothing.
func (c *Client) Get(ctx context.Context, key string) (Result, error) {
	return c.get(ctx, key, 0)
}

// Wait returns the payment under key once it is final (succeeded or
// declined), or once it waits for an operator or its publish is unknown
// (neither changes by waiting: see Status), asking with Prefer: wait so the
// gateway answers as soon as a worker completes it. It waits until ctx
// ends; then it returns the last state seen with ctx's error.
func (c *Client) Wait(ctx context.Context, key string) (Result, error) {
	var last Result
	for {
		wait := c.wait
		if dl, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(dl)-time.Second)
		}
		wait = max(wait, time.Second)
		r, err := c.get(ctx, key, wait)
		if err != nil {
			return last, err
		}
		last = r
		switch r.Status {
		case StatusSucceeded, StatusDeclined, StatusAuthorized, StatusWaitingForOperator, StatusPublishUnknown,
			StatusRefunded, StatusPartiallyRefunded:
			return r, nil
		}
		if err := ctx.Err(); err != nil {
			return r, fmt.Errorf("client: wait for %q: %w", key, err)
		}
	}
}

// Forget drops what the Client remembers of key (the fingerprint of its
// payment, and that it may have been accepted): call it once its payment
// is final, in a process that makes many payments, to bound the Client's
// memory.
func (c *Client) Forget(key string) { c.keys.forget(key) }

func (c *Client) get(ctx context.Context, key string, wait time.Duration) (Result, error) {
	if err := checkKey(key); err != nil {
		return Result{}, err
	}
	res, err := c.retry(ctx, func() (Result, error) {
		a, err := c.do(ctx, http.MethodGet, paymentPath(key), key, "", nil, wait)
		if err != nil {
			return Result{}, err
		}
		if a.status == http.StatusOK {
			return a.result()
		}
		if p := a.problem(); p != nil && p.Type == ProblemNotAccepted {
			c.keys.notAccepted(key) // the gateway took nothing in under key
		}
		return Result{}, a.failure()
	})
	var p *Problem
	if errors.As(err, &p) && p.Type != ProblemNotAccepted && errors.Is(p, ErrNotAccepted) {
		// 503, 429 or 500 to a GET: the gateway could not tell, which says
		// nothing of the payment; only 404 not-accepted is ErrNotAccepted.
		err = fmt.Errorf("client: get %q: no answer about the payment: %v", key, err)
	}
	return res, err
}

// retry runs op with the client's backoff, honouring Retry-After, until
// it succeeds, fails for good (backoff.Permanent), RetryFor passes or ctx
// ends; it returns op's last error, unwrapped.
func (c *Client) retry(ctx context.Context, op func() (Result, error)) (Result, error) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = 100*time.Millisecond, 5*time.Second
	var last error
	res, err := backoff.Retry(ctx, func() (Result, error) {
		r, err := op()
		last = err
		return r, err
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(c.retryFor))
	if err == nil {
		return res, nil
	}
	var rl *retryLater
	switch {
	case errors.As(err, &rl):
		err = rl.err
	case ctx.Err() != nil && last != nil && !errors.Is(last, ctx.Err()): // ended while waiting to retry
		if errors.As(last, &rl) {
			last = rl.err
		}
		err = fmt.Errorf("%w (last answer: %w)", err, last)
	}
	return res, err
}

// do sends one request about key to path: a POST of body under it, or a
// GET of its state with a Prefer: wait. kind is the operation's (Refund,
// Capture, Cancel), "" for a payment. A transport failure (a timeout, a
// reset, no answer) is returned as a retryable error. The observer, if
// any, sees the answer first.
func (c *Client) do(ctx context.Context, method, path, key, kind string, body []byte, wait time.Duration) (answer, error) {
	a, err := c.send(ctx, method, path, key, body, wait)
	if c.observe != nil && !isBuildError(err) {
		x := Exchange{Method: method, Key: key, Kind: kind, Status: a.status, Err: err}
		if err == nil {
			x.Problem = a.problem()
			if x.Problem == nil && kind == "" {
				if r, rerr := a.result(); rerr == nil {
					x.Result = &r
				}
			} else if x.Problem == nil {
				if r, rerr := a.operation(); rerr == nil {
					x.Operation = &r
				}
			}
		}
		c.observe(x)
	}
	if err == nil {
		return a, nil
	}
	var be *buildError
	switch {
	case errors.As(err, &be):
		return answer{}, backoff.Permanent(fmt.Errorf("client: %w", be.err))
	case ctx.Err() != nil: // the caller's context, not the attempt's
		return answer{}, backoff.Permanent(fmt.Errorf("client: %s %s: %w", method, path, ctx.Err()))
	}
	return answer{}, &retryLater{err: fmt.Errorf("client: %s %s: no answer: %w", method, path, err)}
}

// send sends one request and reads its answer whole; its error is the
// transport's, or a *buildError when nothing was sent.
func (c *Client) send(ctx context.Context, method, path, key string, body []byte, wait time.Duration) (answer, error) {
	actx, cancel := context.WithTimeout(ctx, c.attempt+wait)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(actx, method, c.base.JoinPath(path).String(), rd)
	if err != nil {
		return answer{}, &buildError{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	req.Header.Set("Accept", "application/json, application/problem+json")
	if method == http.MethodPost {
		req.Header.Set("Idempotency-Key", key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if wait > 0 {
		req.Header.Set("Prefer", "wait="+strconv.Itoa(int(wait/time.Second)))
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil { // the answer was cut: as good as none
		return answer{}, err
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: raw}, nil
}

// paymentPath is the path of a GET of key's payment.
func paymentPath(key string) string { return "/v1/payments/" + url.PathEscape(key) }

// buildError is a request that could not be made: nothing was sent.
type buildError struct{ err error }

func (e *buildError) Error() string { return e.err.Error() }

func isBuildError(err error) bool {
	var be *buildError
	return errors.As(err, &be)
}

// answer is one HTTP answer, read whole.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// problem is the answer's problem, when it is the gateway's
// application/problem+json; nil for anything else (a proxy's page).
func (a answer) problem() *Problem {
	mt, _, _ := mime.ParseMediaType(a.header.Get("Content-Type"))
	if mt != "application/problem+json" {
		return nil
	}
	var p Problem
	if json.Unmarshal(a.body, &p) != nil || !strings.HasPrefix(p.Type, problemPrefix) {
		return nil
	}
	p.Status = a.status
	p.RetryAfter = retryAfter(a.header.Get("Retry-After"))
	return &p
}

// result decodes a payment answer.
func (a answer) result() (Result, error) {
	var r Result
	if err := json.Unmarshal(a.body, &r); err != nil || r.Status == "" {
		// Not the gateway's payment: as good as no answer.
		return Result{}, &retryLater{err: fmt.Errorf("client: a %d answer that is not a payment: %.80q", a.status, a.body)}
	}
	r.HTTPStatus = a.status
	r.Replayed = a.header.Get("Idempotent-Replayed") == "true"
	return r, nil
}

// mayBeAccepted reports whether an answer leaves the request's fate
// unknown: 503 publish-outcome-unknown, or an answer that is not the
// gateway's.
func (a answer) mayBeAccepted() bool {
	p := a.problem()
	return p == nil || p.Type == ProblemPublishUnknown
}

// failure is the error of an answer that is not a payment: retried
// (after its Retry-After) when it asks to come back or tells nothing,
// permanent when it is a refusal.
func (a answer) failure() error {
	p := a.problem()
	if p == nil { // a load balancer's 502, a proxy's page: tells nothing
		return &retryLater{err: fmt.Errorf("client: an answer that is not the gateway's (%d)", a.status)}
	}
	switch {
	case a.status == http.StatusTooManyRequests, a.status >= 500, a.status == http.StatusConflict:
		return &retryLater{err: p, after: p.RetryAfter}
	}
	return backoff.Permanent(p)
}

// retryLater is the answer to retry, after its Retry-After when it has
// one.
func (a answer) retryLater() error {
	if p := a.problem(); p != nil {
		return &retryLater{err: p, after: p.RetryAfter}
	}
	return &retryLater{err: fmt.Errorf("client: an answer that is not the gateway's (%d)", a.status)}
}

// retryLater is a retryable error; after, when set, is the answer's
// Retry-After, which backoff honours (backoff.RetryAfterError).
type retryLater struct {
	err   error
	after time.Duration
}

func (e *retryLater) Error() string { return e.err.Error() }

func (e *retryLater) Unwrap() []error {
	if e.after > 0 {
		return []error{e.err, &backoff.RetryAfterError{Duration: e.after}}
	}
	return []error{e.err}
}

// retryAfter parses a Retry-After (seconds, or an HTTP date); 0 when
// absent or malformed.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil && secs >= 0 {
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

// boundNothing reports whether a refusal, answered to the first request
// with a key, proves the request bound nothing to it: malformed,
// unauthenticated or card data. (The same types answered for a
// dead-lettered command come only after an earlier request with the key.)
func boundNothing(err error) bool {
	var p *Problem
	return errors.As(err, &p) && (errors.Is(p, ErrInvalidRequest) || errors.Is(p, ErrUnauthenticated) || errors.Is(p, ErrCardData))
}

// isFinal reports whether err is a refusal final for the key (a
// dead-lettered payment, a reused key): no retry changes it.
func isFinal(err error) bool {
	var p *Problem
	return errors.As(err, &p) && p.Status >= 400 && p.Status < 500 && p.Status != http.StatusUnauthorized &&
		p.Status != http.StatusConflict && p.Status != http.StatusTooManyRequests
}

// checkKey refuses, before anything is sent, a key the gateway would
// refuse (400 invalid-idempotency-key) or that HTTP cannot carry: 1 to 255
// printable ASCII characters, no leading or trailing space.
func checkKey(key string) error {
	ok := len(key) > 0 && len(key) <= 255 && key[0] != ' ' && key[len(key)-1] != ' '
	for i := 0; ok && i < len(key); i++ {
		ok = key[i] >= 0x20 && key[i] < 0x7f
	}
	if !ok {
		return fmt.Errorf("client: idempotency key %.40q: %w: want 1 to 255 printable ASCII characters, no leading or trailing space", key, ErrInvalidRequest)
	}
	return nil
}

// keyBook remembers, per key, the fingerprint of the payment it was first
// sent with, and whether a request with it may have been accepted (a
// Client) or stored (a Publisher): once so, no later answer about one
// request says the key holds nothing.
type keyBook struct {
	mu   sync.Mutex
	keys map[string]keyEntry
}

type keyEntry struct {
	sum   [sha256.Size]byte
	maybe bool // a request with the key may have been accepted or stored
}

// bind binds key to sum, or refuses it bound to another; fresh reports
// whether this call bound it, maybe whether an earlier call with the key
// may have been accepted.
func (k *keyBook) bind(key string, sum [sha256.Size]byte) (fresh, maybe bool, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.keys == nil {
		k.keys = map[string]keyEntry{}
	}
	got, ok := k.keys[key]
	switch {
	case !ok:
		k.keys[key] = keyEntry{sum: sum}
		return true, false, nil
	case got.sum != sum:
		return false, false, fmt.Errorf("client: key %q: %w (by this client: nothing was sent)", key, ErrKeyReused)
	}
	return false, got.maybe, nil
}

// mayBe records that a request with key may have been accepted or stored.
func (k *keyBook) mayBe(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if e, ok := k.keys[key]; ok {
		e.maybe = true
		k.keys[key] = e
	}
}

// notAccepted records a definitive answer that nothing was taken in under
// key (GET 404 not-accepted): the key no longer may be accepted.
func (k *keyBook) notAccepted(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if e, ok := k.keys[key]; ok {
		e.maybe = false
		k.keys[key] = e
	}
}

func (k *keyBook) forget(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.keys, key)
}

// outcomeUnknown is ErrOutcomeUnknown caused by cause, the last answer. A
// cause that says nothing was accepted or stored (ErrNotAccepted, a
// stream refusal) speaks of its own request only, not of the key, which
// may hold an earlier one: it is kept in the message but does not match
// through errors.Is.
func outcomeUnknown(cause error) error {
	if errors.Is(cause, ErrNotAccepted) || stream.Refused(cause) {
		return fmt.Errorf("%w: %v", ErrOutcomeUnknown, cause)
	}
	return fmt.Errorf("%w: %w", ErrOutcomeUnknown, cause)
}
