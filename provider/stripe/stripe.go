package stripe

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	stripego "github.com/stripe/stripe-go/v82"

	"github.com/paydedup/paydedup/provider"
)

// DefaultAPIBase is Stripe's API root; STRIPE_API_BASE overrides it (the
// simulator, a proxy).
const DefaultAPIBase = "https://api.stripe.com"

// DefaultTimeout bounds one Stripe call when Config.Timeout is 0.
// A RetryPolicy's shorter AttemptTimeout binds first when ChargeWithRetry is
// used.
const DefaultTimeout = 30 * time.Second

// Config configures the Stripe adapter.
type Config struct {
	// SecretKey is the API key (STRIPE_SECRET_KEY); required.
	SecretKey string
	// APIBase is the API root (STRIPE_API_BASE); DefaultAPIBase when
	// empty.
	APIBase string
	// HTTPClient is used for every call when set; otherwise the adapter owns
	// a client on NewTransport.
	HTTPClient *http.Client
	// Timeout bounds each Charge or Lookup call; DefaultTimeout when 0.
	Timeout time.Duration
}

// Client is the Provider for Stripe's PaymentIntents API, on stripe-go. It
// never retries by itself (stripe-go's network retries are off): retries
// belong to ChargeWithRetry and the worker. (net/http may still resend a
// request by itself when a reused keep-alive connection closes after the
// request was written and before any response byte: stripe-go sets GetBody
// and an Idempotency-Key header, which net/http takes as leave to replay it.
// The resend carries the same key, so it cannot charge twice, but its answer
// speaks only for itself: Charge counts the copies written and reports any
// "not executed" answer that follows an earlier written copy as an unknown
// outcome.)
type Client struct {
	client     *stripego.Client
	api        stripego.Backend // the client's v1 backend: Charge calls it directly
	secretKey  string
	httpClient *http.Client
	timeout    time.Duration
	now        func() time.Time
}

var _ provider.Provider = (*Client)(nil)

// New validates cfg and returns a Stripe adapter.
func New(cfg Config) (*Client, error) {
	if strings.TrimSpace(cfg.SecretKey) == "" {
		return nil, fmt.Errorf("new stripe: %w: STRIPE_SECRET_KEY is empty", provider.ErrInvalidConfig)
	}
	if strings.ContainsAny(cfg.SecretKey, " \t\r\n") {
		return nil, fmt.Errorf("new stripe: %w: STRIPE_SECRET_KEY contains white space", provider.ErrInvalidConfig)
	}
	base := cfg.APIBase
	if base == "" {
		base = DefaultAPIBase
	}
	u, err := url.Parse(base)
	switch {
	case err != nil:
		return nil, fmt.Errorf("new stripe: %w: STRIPE_API_BASE %q: %v", provider.ErrInvalidConfig, base, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("new stripe: %w: STRIPE_API_BASE %q: scheme must be http or https", provider.ErrInvalidConfig, base)
	case u.Host == "":
		return nil, fmt.Errorf("new stripe: %w: STRIPE_API_BASE %q: no host", provider.ErrInvalidConfig, base)
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return nil, fmt.Errorf("new stripe: %w: STRIPE_API_BASE %q: must be a plain base URL", provider.ErrInvalidConfig, base)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("new stripe: %w: timeout %s is negative", provider.ErrInvalidConfig, cfg.Timeout)
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: NewTransport()}
	}
	hc = withSizedBodies(hc)
	backends := stripego.NewBackendsWithConfig(&stripego.BackendConfig{
		URL:               stripego.String(base),
		HTTPClient:        hc,
		MaxNetworkRetries: stripego.Int64(0),
		EnableTelemetry:   stripego.Bool(false),
		// stripe-go's debug log prints request and response bodies, which
		// hold payment method ids: keep it silent.
		LeveledLogger: &stripego.LeveledLogger{Level: stripego.LevelNull},
	})
	return &Client{
		client:     stripego.NewClient(cfg.SecretKey, stripego.WithBackends(backends)),
		api:        backends.API,
		secretKey:  cfg.SecretKey,
		httpClient: hc,
		timeout:    cmp.Or(cfg.Timeout, DefaultTimeout),
		now:        time.Now,
	}, nil
}

// NewTransport returns the transport the adapter uses when Config.HTTPClient
// is nil; a caller that wraps it (tracing) sets Config.HTTPClient. A worker
// runs many charges at once against one host: it keeps their connections
// (the default keeps 2 idle per host, so most calls would pay a new TCP and
// TLS handshake). MaxIdlePerHost covers the worker's default ceiling of
// calls in flight (1000, PAYDEDUP_CONCURRENCY): over HTTP/1.1 each call in
// flight holds a connection, and one returned past the idle cap is closed.
func NewTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 2*MaxIdlePerHost, MaxIdlePerHost
	return tr
}

// MaxIdlePerHost is how many idle connections to the provider NewTransport
// keeps.
const MaxIdlePerHost = 1024

// withSizedBodies returns a copy of hc whose transport gives every request
// body stripe-go sends its length. stripe-go puts its form on the request as
// a reader net/http cannot size (Content-Length 0, a body, GetBody set), so
// net/http sent each POST chunked: a goroutine and a timer probed the body,
// the headers went out in a write of their own and the body in another.
// Sized, a POST is one write (TestRequestsCarryTheirLength).
func withSizedBodies(hc *http.Client) *http.Client {
	c := *hc
	c.Transport = sizedBodies{next: cmp.Or[http.RoundTripper](hc.Transport, http.DefaultTransport)}
	return &c
}

// sizedBodies is the RoundTripper of withSizedBodies.
type sizedBodies struct{ next http.RoundTripper }

func (t sizedBodies) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body == nil || req.Body == http.NoBody || req.ContentLength != 0 || req.GetBody == nil {
		return t.next.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("stripe: read the request body: %w", err)
	}
	// A shallow copy, as net/http makes of requests it rewrites: a
	// RoundTripper must not change the request it was given. GetBody stays
	// set, so net/http may still resend the request (see Client).
	sized := *req
	sized.ContentLength = int64(len(body))
	sized.Body = io.NopCloser(bytes.NewReader(body))
	sized.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return t.next.RoundTrip(&sized)
}

// CloseIdleConnections closes the idle connections of the transport under
// t, as http.Client.CloseIdleConnections does for the transport it holds.
func (t sizedBodies) CloseIdleConnections() {
	if c, ok := t.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// CloseIdleConnections closes the idle connections of the adapter's HTTP
// client; tests call it so that no connection goroutine outlives them.
func (s *Client) CloseIdleConnections() { s.httpClient.CloseIdleConnections() }

// Charge creates and confirms a PaymentIntent under req.ProviderKey,
// off-session unless req.OnSession. A decline (402 card_error) is an Outcome
// with Declined set, an intent left processing one with Processing set, and
// one left requiring action is canceled and declined
// (authentication_required); every other answer is an *Error.
func (s *Client) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	if err := provider.CheckProviderKey(req.ProviderKey); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var copies writtenCopies
	ctx = httptrace.WithClientTrace(ctx, copies.trace())

	// The create stripe-go's V1PaymentIntents.Create sends, with its body
	// built by appendChargeForm and the answer read into chargedIntent:
	// stripe-go's reflective form encoding and its decoding of the whole
	// PaymentIntent object are work the adapter does not need.
	params := &stripego.Params{Context: ctx}
	params.SetIdempotencyKey(req.ProviderKey)
	var ci chargedIntent
	if err := s.api.CallRaw(http.MethodPost, "/v1/payment_intents", s.secretKey, appendChargeForm(nil, req), params, &ci); err != nil {
		out, cerr := s.chargeError(err)
		return out, copies.check(cerr, answered(err))
	}
	pi := ci.intent()
	raw, hdr := lastResponse(pi.LastResponse)
	if raw == nil {
		return nil, &provider.Error{Class: provider.ClassUnknown, Message: "charge response has no body"}
	}
	out, err := s.settle(ctx, pi, raw, req.ProviderKey)
	if err != nil {
		return nil, err
	}
	out.Replayed = replayed(hdr)
	return out, nil
}

// settle is what an intent Stripe returned means for us. One still waiting
// for the customer to authenticate (requires_action) is canceled first: left
// open, anyone holding its client_secret could complete it later and move
// money under a row we recorded declined. Only a canceled intent is
// declined; if the cancel fails the answer is ClassUnknown, and the row stays
// pending for a redelivery or the reconciler (the cancel's own key makes a
// second cancel replay the first).
func (s *Client) settle(ctx context.Context, pi *stripego.PaymentIntent, raw []byte, providerKey string) (*provider.Outcome, error) {
	if pi.Status != stripego.PaymentIntentStatusRequiresAction {
		return intentOutcome(pi, raw)
	}
	if providerKey == "" {
		return nil, &provider.Error{Class: provider.ClassUnknown, HTTPStatus: http.StatusOK,
			Message: fmt.Sprintf("payment intent %s requires_action and no provider key to cancel it under", pi.ID)}
	}
	params := &stripego.PaymentIntentCancelParams{
		CancellationReason: stripego.String(string(stripego.PaymentIntentCancellationReasonAbandoned)),
	}
	params.SetIdempotencyKey(provider.CancelKey(providerKey, pi.ID))
	canceled, err := s.client.V1PaymentIntents.Cancel(ctx, pi.ID, params)
	if err != nil {
		return nil, &provider.Error{Class: provider.ClassUnknown, Message: fmt.Sprintf("payment intent %s requires_action; cancel failed: %v", pi.ID, s.lookupError(err)), Err: err}
	}
	craw, _ := lastResponse(canceled.LastResponse)
	if craw == nil || canceled.Status != stripego.PaymentIntentStatusCanceled {
		return nil, &provider.Error{Class: provider.ClassUnknown, HTTPStatus: http.StatusOK,
			Message: fmt.Sprintf("payment intent %s requires_action; cancel answered %s", pi.ID, statusOr(canceled.Status))}
	}
	return declinedIntent(canceled, craw, provider.DeclineAuthenticationRequired), nil
}

// writtenCopies counts the copies of one request that net/http wrote in
// full: more than one when it resent the request on a new connection.
type writtenCopies struct{ n atomic.Int32 }

func (w *writtenCopies) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{WroteRequest: func(info httptrace.WroteRequestInfo) {
		if info.Err == nil {
			w.n.Add(1)
		}
	}}
}

// check returns err, made ClassUnknown when it is "not executed"
// (ClassRetryable, ClassRejected, ClassUnauthorized) but a copy
// of the request other than the one it answers was written: that copy may be
// running at the provider (a resend meets it as 409, or is refused on its
// own with a 429 or a failed dial) and may charge. answered reports that err
// is the provider's answer (to the last copy written) rather than a failure
// to send.
func (w *writtenCopies) check(err error, answered bool) error {
	pe, ok := err.(*provider.Error)
	if !ok || (pe.Class != provider.ClassRetryable && pe.Class != provider.ClassRejected && pe.Class != provider.ClassUnauthorized) {
		return err
	}
	earlier := int(w.n.Load())
	if answered {
		earlier--
	}
	if earlier <= 0 {
		return err
	}
	return &provider.Error{
		Class: provider.ClassUnknown, HTTPStatus: pe.HTTPStatus, Type: pe.Type, Code: pe.Code, RetryAfter: pe.RetryAfter,
		RateLimitReason: pe.RateLimitReason, ShouldRetry: pe.ShouldRetry,
		Message: fmt.Sprintf("net/http resent the request after writing it; the answer to the resend proves nothing about the first copy (%s)", pe.Message),
		Err:     pe.Err,
	}
}

// answered reports whether a failed stripe-go call got an answer from the
// API (a status and an error body) rather than a transport failure.
func answered(err error) bool {
	var se *stripego.Error
	return errors.As(err, &se) && se.HTTPStatusCode != 0
}

// appendChargeForm appends the body of the create the adapter sends for
// req: what stripe-go's form encoding makes of its create parameters for
// req (stripeCreateParams, in the tests), byte for byte
// (TestChargeFormIsStripeGos), without its reflection. Names are in
// the order stripe-go writes them (its fields' order, then metadata keys
// sorted), query-escaped but for the brackets.
func appendChargeForm(b []byte, req provider.ChargeRequest) []byte {
	b = append(b, "amount="...)
	b = strconv.AppendInt(b, req.Amount, 10)
	b = append(b, "&automatic_payment_methods[allow_redirects]=never&automatic_payment_methods[enabled]=true"...)
	if req.ManualCapture {
		b = append(b, "&capture_method=manual"...)
	}
	b = append(b, "&confirm=true&currency="...)
	b = append(b, url.QueryEscape(req.Currency)...)
	if req.Description != "" {
		b = append(b, "&description="...)
		b = append(b, url.QueryEscape(req.Description)...)
	}
	md := chargeMetadata(req)
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b = append(b, '&')
		b = append(b, formName.Replace(url.QueryEscape("metadata["+k+"]"))...)
		b = append(b, '=')
		b = append(b, url.QueryEscape(md[k])...)
	}
	b = append(b, "&off_session="...)
	b = strconv.AppendBool(b, !req.OnSession)
	b = append(b, "&payment_method="...)
	return append(b, url.QueryEscape(req.PaymentMethod)...)
}

// formName undoes the escaping of brackets in a form name, as stripe-go does.
var formName = strings.NewReplacer("%5B", "[", "%5D", "]")

// chargedIntent is the part of a PaymentIntent object Charge reads (the
// whole answer is kept raw in LastResponse).
type chargedIntent struct {
	ID               string                       `json:"id"`
	Status           stripego.PaymentIntentStatus `json:"status"`
	AmountCapturable int64                        `json:"amount_capturable"`
	LastPaymentError *struct {
		Code        stripego.ErrorCode   `json:"code"`
		DeclineCode stripego.DeclineCode `json:"decline_code"`
		Msg         string               `json:"message"`
	} `json:"last_payment_error"`
	lastResponse *stripego.APIResponse
}

func (c *chargedIntent) SetLastResponse(r *stripego.APIResponse) { c.lastResponse = r }

// intent is c as the stripe-go object settle reads.
func (c *chargedIntent) intent() *stripego.PaymentIntent {
	pi := &stripego.PaymentIntent{APIResource: stripego.APIResource{LastResponse: c.lastResponse}, ID: c.ID, Status: c.Status,
		AmountCapturable: c.AmountCapturable}
	if e := c.LastPaymentError; e != nil {
		pi.LastPaymentError = &stripego.Error{Code: e.Code, DeclineCode: e.DeclineCode, Msg: e.Msg}
	}
	return pi
}

// chargeMetadata returns the metadata actually sent: the command's metadata
// plus merchant_id and idempotency_key, which win.
func chargeMetadata(r provider.ChargeRequest) map[string]string {
	md := make(map[string]string, len(r.Metadata)+2)
	for k, v := range r.Metadata {
		md[k] = v
	}
	md[provider.MetadataMerchantID] = r.MerchantID
	md[provider.MetadataIdempotencyKey] = r.IdempotencyKey
	return md
}

// chargeError turns a failed Create into a declined Outcome or an *Error.
func (s *Client) chargeError(err error) (*provider.Outcome, error) {
	var se *stripego.Error
	if !errors.As(err, &se) {
		return nil, transportError(err)
	}
	f := stripeFailure(se, s.now())
	return f.ChargeResult()
}

// lookupError maps a failed retrieve or search to an *Error.
func (s *Client) lookupError(err error) error {
	var se *stripego.Error
	if !errors.As(err, &se) {
		return transportError(err)
	}
	f := stripeFailure(se, s.now())
	return f.LookupError()
}

// stripeFailure reads the answer of a failed stripe-go call, received at now.
func stripeFailure(se *stripego.Error, now time.Time) provider.Rejection {
	raw, hdr := lastResponse(se.LastResponse)
	f := provider.Rejection{
		HTTPStatus:  se.HTTPStatusCode,
		Type:        string(se.Type),
		Code:        string(se.Code),
		DeclineCode: string(se.DeclineCode),
		Message:     se.Msg,
		RetryAfter:  parseRetryAfter(hdr.Get("Retry-After"), now),

		RateLimitReason: strings.TrimSpace(hdr.Get(provider.HeaderRateLimitedReason)),
		ShouldRetry:     provider.ParseAdvice(hdr.Get(provider.HeaderShouldRetry)),
		Replayed:        replayed(hdr),
		Response:        raw,
	}
	if pi := se.PaymentIntent; pi != nil {
		f.ChargeID = pi.ID
		f.ChargeStatus = string(pi.Status)
	}
	return f
}

// transportError is the *Error for a call that got no answer.
func transportError(err error) *provider.Error {
	return &provider.Error{Class: provider.Classify(0, "", "", err), Err: err}
}

// Lookup finds what Stripe has under the key without charging: it retrieves
// req.ChargeID when given (falling back to search if Stripe has no such
// intent), else searches PaymentIntents by metadata merchant_id and
// idempotency_key. A search hit counts only when its metadata, amount and
// currency match the request; any hit that does not is reported as a
// ClassUnknown error wrapping provider.ErrForeignIntent, never used. Each
// hit is then retrieved by id, and only the retrieved intent's status is
// believed: a succeeded intent is a charge, a processing one is Processing,
// one that ended needing a new payment method (or canceled, or never
// confirmed) is a decline, and one still requiring action is canceled first
// (see Charge). None is Found=false. Several charges under one key are a
// ClassUnknown error, never hidden.
//
// Search is eventually consistent (Stripe: usually under a minute), so
// Found=false means "not yet seen": callers decide how long it must persist.
func (s *Client) Lookup(ctx context.Context, req provider.LookupRequest) (provider.LookupResult, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()

	if req.ChargeID != "" {
		pi, err := s.client.V1PaymentIntents.Retrieve(ctx, req.ChargeID, nil)
		switch {
		case err == nil:
			return s.lookupByID(ctx, pi, req)
		case !isResourceMissing(err):
			return provider.LookupResult{}, fmt.Errorf("retrieve payment intent: %w", s.lookupError(err))
		}
	}
	if req.MerchantID == "" || req.IdempotencyKey == "" {
		return provider.LookupResult{}, &provider.Error{Class: provider.ClassMismatch, Message: "lookup needs merchant id and idempotency key", Err: provider.ErrInvalidRequest}
	}

	params := &stripego.PaymentIntentSearchParams{}
	params.Query = SearchQuery(req.MerchantID, req.IdempotencyKey)
	params.Limit = stripego.Int64(searchLimit)
	var hits []string
	for pi, err := range s.client.V1PaymentIntents.Search(ctx, params) {
		if err != nil {
			return provider.LookupResult{}, fmt.Errorf("search payment intents: %w", s.lookupError(err))
		}
		if err := provider.CheckIntent(req, intentFacts(pi)); err != nil {
			return provider.LookupResult{}, err
		}
		hits = append(hits, pi.ID)
	}
	var found []*provider.Outcome
	for _, id := range hits {
		pi, err := s.client.V1PaymentIntents.Retrieve(ctx, id, nil)
		if err != nil {
			return provider.LookupResult{}, fmt.Errorf("retrieve payment intent %s found by search: %w", id, s.lookupError(err))
		}
		res, err := s.lookupByID(ctx, pi, req)
		if err != nil {
			return provider.LookupResult{}, err
		}
		found = append(found, res.Outcome)
	}
	return provider.SearchVerdict(found)
}

// lookupByID is what a retrieved intent tells about req's key: nothing
// unless it is req's own (provider.CheckIntent).
func (s *Client) lookupByID(ctx context.Context, pi *stripego.PaymentIntent, req provider.LookupRequest) (provider.LookupResult, error) {
	if err := provider.CheckIntent(req, intentFacts(pi)); err != nil {
		return provider.LookupResult{}, err
	}
	raw, _ := lastResponse(pi.LastResponse)
	if raw == nil {
		return provider.LookupResult{}, &provider.Error{Class: provider.ClassUnknown, Message: "lookup response has no body"}
	}
	out, err := s.settle(ctx, pi, raw, req.ProviderKey)
	if err != nil {
		return provider.LookupResult{}, err
	}
	return provider.LookupResult{Found: true, Outcome: out}, nil
}

// intentFacts are the fields of pi that tell whose intent it is.
func intentFacts(pi *stripego.PaymentIntent) provider.IntentFacts {
	return provider.IntentFacts{
		ID:             pi.ID,
		MerchantID:     pi.Metadata[provider.MetadataMerchantID],
		IdempotencyKey: pi.Metadata[provider.MetadataIdempotencyKey],
		Amount:         pi.Amount,
		Currency:       string(pi.Currency),
	}
}

// searchLimit is the page size of a lookup's search, the largest Stripe
// allows.
const searchLimit = 100

// SearchQuery returns the Stripe search query that finds the intents charged
// for (merchantID, idempotencyKey). Values are single-quoted with backslash
// escapes for ' and \, so no key can change the query's meaning.
func SearchQuery(merchantID, idempotencyKey string) string {
	return fmt.Sprintf("metadata['%s']:'%s' AND metadata['%s']:'%s'",
		provider.MetadataIdempotencyKey, quoteSearchValue(idempotencyKey),
		provider.MetadataMerchantID, quoteSearchValue(merchantID))
}

func quoteSearchValue(v string) string {
	return strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v)
}

// intentOutcome classifies a PaymentIntent object that needs no call to
// settle: charged, processing, declined, or a ClassUnknown error for a
// status we cannot read (requires_action is settle's).
func intentOutcome(pi *stripego.PaymentIntent, raw []byte) (*provider.Outcome, error) {
	switch pi.Status {
	case stripego.PaymentIntentStatusSucceeded:
		return &provider.Outcome{ChargeID: pi.ID, Status: string(pi.Status), HTTPStatus: http.StatusOK, Response: raw}, nil
	case stripego.PaymentIntentStatusRequiresCapture:
		// Authorized: held, moved only by a capture.
		return &provider.Outcome{ChargeID: pi.ID, Status: string(pi.Status), Authorized: true,
			AmountCapturable: pi.AmountCapturable, HTTPStatus: http.StatusOK, Response: raw}, nil
	case stripego.PaymentIntentStatusProcessing:
		// Accepted; money may still move (bank debits take days).
		return &provider.Outcome{ChargeID: pi.ID, Status: string(pi.Status), Processing: true, HTTPStatus: http.StatusAccepted, Response: raw}, nil
	case stripego.PaymentIntentStatusRequiresPaymentMethod, stripego.PaymentIntentStatusCanceled,
		stripego.PaymentIntentStatusRequiresConfirmation:
		// The attempt failed, the intent was canceled, or it was never
		// confirmed (no one we serve holds its client_secret): nothing
		// moved and nothing will without a new confirm.
		return declinedIntent(pi, raw, ""), nil
	default:
		return nil, &provider.Error{Class: provider.ClassUnknown, HTTPStatus: http.StatusOK,
			Message: fmt.Sprintf("payment intent %s is %s", pi.ID, statusOr(pi.Status))}
	}
}

// declinedIntent builds the declined Outcome for an intent object. Its
// Response has the shape of the 402 error Stripe sends for a decline
// ({"error":{..., "payment_intent":{...}}}), so a decline found by lookup is
// stored and replayed like one seen by Charge. Its type is card_error, the
// type of every decline: last_payment_error.type may read anything
// (api_error, idempotency_error) and is never copied. code, when not
// empty, is the decline's reason, over the intent's own.
func declinedIntent(pi *stripego.PaymentIntent, raw []byte, code string) *provider.Outcome {
	body := struct {
		Error struct {
			Type          string          `json:"type"`
			Code          string          `json:"code,omitempty"`
			DeclineCode   string          `json:"decline_code,omitempty"`
			Message       string          `json:"message"`
			PaymentIntent json.RawMessage `json:"payment_intent"`
		} `json:"error"`
	}{}
	body.Error.Type = "card_error"
	body.Error.Message = "The payment intent is " + string(pi.Status) + "."
	body.Error.PaymentIntent = raw
	reason := string(pi.Status)
	if lpe := pi.LastPaymentError; lpe != nil {
		body.Error.Code = string(lpe.Code)
		body.Error.DeclineCode = string(lpe.DeclineCode)
		if lpe.Msg != "" {
			body.Error.Message = lpe.Msg
		}
		reason = cmp.Or(string(lpe.DeclineCode), string(lpe.Code), reason)
	}
	if code != "" {
		body.Error.Code, body.Error.DeclineCode, reason = code, "", code
		body.Error.Message = "The payment needed the customer to authenticate and was canceled."
	}
	resp, err := json.Marshal(body)
	if err != nil {
		// Marshalling strings and valid JSON cannot fail; keep the intent.
		resp = raw
	}
	return &provider.Outcome{
		ChargeID:    pi.ID,
		Status:      string(pi.Status),
		Declined:    true,
		DeclineCode: reason,
		HTTPStatus:  http.StatusPaymentRequired,
		Response:    resp,
	}
}

func isResourceMissing(err error) bool {
	var se *stripego.Error
	if !errors.As(err, &se) {
		return false
	}
	// A 404: retrieve found no such object.
	return se.HTTPStatusCode == http.StatusNotFound || se.Code == stripego.ErrorCodeResourceMissing
}

func lastResponse(r *stripego.APIResponse) (json.RawMessage, http.Header) {
	if r == nil {
		return nil, http.Header{}
	}
	var raw json.RawMessage
	if r.RawJSON != nil {
		raw = append(json.RawMessage(nil), r.RawJSON...)
	}
	hdr := r.Header
	if hdr == nil {
		hdr = http.Header{}
	}
	return raw, hdr
}

func replayed(h http.Header) bool {
	return strings.EqualFold(h.Get("Idempotent-Replayed"), "true")
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

func statusOr(s stripego.PaymentIntentStatus) string {
	if s == "" {
		return "without status"
	}
	return string(s)
}
