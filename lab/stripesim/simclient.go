package stripesim

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/paydedup/paydedup/provider"
)

// Client is a Provider that calls a Simulator directly, without HTTP: no
// stripe-go, form encoding, JSON parsing or connections, so that a benchmark
// measures the service rather than the client library. Against the same
// simulator it behaves as the Stripe adapter does over HTTP: the same
// Outcomes (Response bytes included), the same *Error classes and fields, and
// the same fault rolls, idempotency keys, accounts, key TTL, ledger and
// OnCharge hook, shared with HTTP requests: a key first used over HTTP
// replays to the client with the same account and parameters, and the
// reverse.
//
// Where a network hides what happened, it stands in for it: a dropped
// connection is a ClassUnknown *Error wrapping io.EOF, and the latency of
// Faults is waited in the caller's goroutine and cut short by ctx or the
// client's timeout. Unlike net/http on a reused keep-alive connection, it
// never resends a request on its own. It is safe for concurrent use.
type Client struct {
	sim     *Simulator
	account string
	timeout time.Duration
}

var _ provider.Provider = (*Client)(nil)

// Client returns a Client for the account of apiKey, the key an HTTP
// client would send as its Bearer token (stripe.Config.SecretKey); white space
// around it is ignored, as the HTTP simulator ignores it. An empty key makes
// every call fail as a request without an API key does (401, ClassRetryable).
// Calls are bounded by 30 s, like the adapter's by default.
func (s *Simulator) Client(apiKey string) *Client {
	account := strings.TrimSpace(apiKey)
	if account != "" {
		s.mu.Lock()
		account = s.internLocked(account)
		s.mu.Unlock()
	}
	return &Client{sim: s, account: account, timeout: defaultClientTimeout}
}

// defaultClientTimeout bounds a Client's calls unless WithTimeout says
// otherwise: the Stripe adapter's default timeout.
const defaultClientTimeout = 30 * time.Second

// WithTimeout returns a copy of c whose every Charge and Lookup is bounded by
// d, as stripe.Config.Timeout bounds the adapter's; d <= 0 means the default,
// 30 s.
func (c *Client) WithTimeout(d time.Duration) *Client {
	cc := *c
	cc.timeout = d
	if d <= 0 {
		cc.timeout = defaultClientTimeout
	}
	return &cc
}

// errKeyHeader is what net/http answers, without sending anything, for an
// Idempotency-Key that is not a valid header value.
var errKeyHeader = errors.New(`net/http: invalid header field value for "Idempotency-Key"`)

// Charge creates and confirms a PaymentIntent under req.ProviderKey, as
// stripe.Client.Charge does: a decline (402 card_error, or 400 on the parameters) is
// an Outcome with Declined set; every other failure is an *Error.
func (c *Client) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	if err := provider.CheckProviderKey(req.ProviderKey); err != nil {
		return nil, err
	}
	if !validHeaderValue(req.ProviderKey) {
		return nil, noAnswer(errKeyHeader)
	}
	start := time.Now()
	s := c.sim
	fate, reply, err := c.call(ctx, start, true, http.MethodPost, simPathCreate)
	switch {
	case err != nil:
		return nil, noAnswer(err)
	case reply != nil:
		return c.chargeReply(reply)
	}

	p := chargeParams(req)
	bp := simBufs.Get().(*[]byte)
	form, bodyLen := appendChargeForm((*bp)[:0], &p)
	params := sha256.Sum256(form)
	*bp = form
	putSimBuf(bp)
	if bodyLen > maxSimBody {
		return c.chargeReply(simReplyBodyTooLarge)
	}
	if e := p.checkCharge(); e != nil {
		return c.chargeReply(simReplyFor(http.StatusBadRequest, e))
	}
	res, in := s.create(c.account, req.ProviderKey, params, &p)
	// Only OnCharge blocks for long: without it, skip the clock.
	if err := c.late(ctx, start, s.onCharge == nil); err != nil {
		// The answer came after the deadline.
		return nil, noAnswer(err)
	}
	switch res {
	case createMismatch:
		return c.chargeReply(mismatchReply(req.ProviderKey))
	case createInFlight:
		return c.chargeReply(simReplyKeyInUse)
	}
	if fate.dropAfter {
		s.fault("drop_after_charge", http.MethodPost, simPathCreate)
		return nil, noAnswer(errSimConnectionClosed)
	}
	out, err := c.settle(ctx, start, in, req.ProviderKey)
	if err != nil {
		return nil, err
	}
	out.Replayed = res == createReplayed
	return out, nil
}

// settle is the adapter's settle: an intent left requiring action is
// canceled, under provider.CancelKey, before it counts as declined; a
// failed cancel is an unknown outcome.
func (c *Client) settle(ctx context.Context, start time.Time, in *simIntent, providerKey string) (*provider.Outcome, error) {
	if in.status != simRequiresAction {
		return in.outcome(""), nil
	}
	if providerKey == "" {
		return nil, &provider.Error{Class: provider.ClassUnknown, HTTPStatus: http.StatusOK,
			Message: fmt.Sprintf("payment intent %s requires_action and no provider key to cancel it under", in.id)}
	}
	path := simPathCreate + "/" + in.id + "/cancel"
	_, reply, err := c.call(ctx, start, false, http.MethodPost, path)
	var cerr error
	switch {
	case err != nil:
		cerr = noAnswer(err)
	case reply != nil:
		f := reply.failure()
		cerr = f.LookupError()
	default:
		canceled, _, r := c.sim.cancel(c.account, provider.CancelKey(providerKey, in.id), in.id, cancelDigest(in.id, "cancellation_reason=abandoned"))
		if r == nil {
			return canceled.outcome(provider.DeclineAuthenticationRequired), nil
		}
		f := r.failure()
		cerr = f.LookupError()
	}
	return nil, &provider.Error{Class: provider.ClassUnknown, Message: fmt.Sprintf("payment intent %s requires_action; cancel failed: %v", in.id, cerr), Err: cerr}
}

// Lookup finds what the simulator has under the key without charging, as
// stripe.Client.Lookup does: it retrieves req.ChargeID when given (falling back to
// search if there is no such intent), else searches by metadata merchant_id
// and idempotency_key, subject to the search lag. Each retrieve and each page
// of search is one API request, rolled for faults like an HTTP GET.
func (c *Client) Lookup(ctx context.Context, req provider.LookupRequest) (provider.LookupResult, error) {
	start := time.Now()
	if req.ChargeID != "" {
		in, f, err := c.retrieve(ctx, start, true, req.ChargeID)
		switch {
		case err != nil:
			return provider.LookupResult{}, fmt.Errorf("retrieve payment intent: %w", noAnswer(err))
		case f == nil:
			return c.lookupByID(ctx, start, in, req)
		case !resourceMissing(f):
			return provider.LookupResult{}, fmt.Errorf("retrieve payment intent: %w", f.LookupError())
		}
	}
	if req.MerchantID == "" || req.IdempotencyKey == "" {
		return provider.LookupResult{}, &provider.Error{Class: provider.ClassMismatch, Message: "lookup needs merchant id and idempotency key", Err: provider.ErrInvalidRequest}
	}

	// The clauses of SearchQuery(req.MerchantID, req.IdempotencyKey), which
	// ParseSearchQuery gives back exactly.
	clauses := [...]SearchClause{
		{Key: provider.MetadataIdempotencyKey, Value: req.IdempotencyKey},
		{Key: provider.MetadataMerchantID, Value: req.MerchantID},
	}
	var hits []string
	for offset := 0; ; {
		_, reply, err := c.call(ctx, start, offset == 0 && req.ChargeID == "", http.MethodGet, simPathSearch)
		switch {
		case err != nil:
			return provider.LookupResult{}, fmt.Errorf("search payment intents: %w", noAnswer(err))
		case reply != nil:
			f := reply.failure()
			return provider.LookupResult{}, fmt.Errorf("search payment intents: %w", f.LookupError())
		}
		// The page size the adapter asks for.
		page, more := c.sim.searchPage(c.account, clauses[:], offset, maxSearchLimit)
		for _, in := range page {
			if err := provider.CheckIntent(req, in.facts()); err != nil {
				return provider.LookupResult{}, err
			}
			hits = append(hits, in.id)
		}
		if !more {
			break
		}
		offset += len(page)
	}
	var found []*provider.Outcome
	for _, id := range hits {
		in, f, err := c.retrieve(ctx, start, false, id)
		switch {
		case err != nil:
			return provider.LookupResult{}, fmt.Errorf("retrieve payment intent %s found by search: %w", id, noAnswer(err))
		case f != nil:
			return provider.LookupResult{}, fmt.Errorf("retrieve payment intent %s found by search: %w", id, f.LookupError())
		}
		res, err := c.lookupByID(ctx, start, in, req)
		if err != nil {
			return provider.LookupResult{}, err
		}
		found = append(found, res.Outcome)
	}
	return provider.SearchVerdict(found)
}

// call is the client's side of the HTTP handlers' api wrapper: the fate roll,
// the latency and the faults that come before any processing. It returns the
// fate of a request let through, or the reply (401, 429, 500) or transport
// error that ended it. first marks the call's first request, sent at start.
func (c *Client) call(ctx context.Context, start time.Time, first bool, method, path string) (roll, *simReply, error) {
	if err := c.late(ctx, start, first); err != nil {
		// net/http sends nothing once the request's context has ended.
		return roll{}, nil, err
	}
	fate := c.sim.roll(false)
	if err := c.sleep(ctx, start, fate.delay); err != nil {
		return fate, nil, err
	}
	reply, drop := c.sim.admit(fate, c.account, method, path)
	if drop {
		return fate, nil, errSimConnectionClosed
	}
	return fate, reply, nil
}

// sleep waits a request's latency d, cut short by ctx or by the client's
// timeout (counted from start), which then ends the call with
// context.DeadlineExceeded as the adapter's timeout does.
func (c *Client) sleep(ctx context.Context, start time.Time, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	left := c.timeout - time.Since(start)
	if d < left {
		return sleepCtx(ctx, d)
	}
	if err := sleepCtx(ctx, left); err != nil {
		return err
	}
	return context.DeadlineExceeded
}

// late returns the error a call started at start meets once ctx or the
// client's timeout has ended, else nil; early skips the timeout, known not to
// have passed.
func (c *Client) late(ctx context.Context, start time.Time, early bool) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if !early && time.Since(start) >= c.timeout {
		return context.DeadlineExceeded
	}
	return nil
}

// noAnswer is the *Error for a call that got no answer, as the adapter makes
// it of its transport's error.
func noAnswer(err error) *provider.Error {
	return &provider.Error{Class: provider.Classify(0, "", "", err), Err: err}
}

// chargeReply is Charge's answer to an error reply.
func (c *Client) chargeReply(r *simReply) (*provider.Outcome, error) {
	f := r.failure()
	if provider.Classify(f.HTTPStatus, f.Type, f.Code, nil) == provider.ClassDeclined {
		f.Response = renderSim(func(b []byte) []byte { return appendErrorJSON(b, r.err, nil) })
	}
	return f.ChargeResult()
}

// failure is r as the adapter reads an error answer. No error reply of the
// simulator carries Idempotent-Replayed or an intent: a decline that made an
// intent answers through simIntent.outcome.
func (r *simReply) failure() provider.Rejection {
	return provider.Rejection{
		HTTPStatus:  r.status,
		Type:        r.err.Type,
		Code:        r.err.Code,
		DeclineCode: r.err.DeclineCode,
		Message:     r.err.Message,
		RetryAfter:  r.retryAfter,

		RateLimitReason: r.reason,
	}
}

// resourceMissing reports a 404: retrieve found no such object.
func resourceMissing(f *provider.Rejection) bool {
	return f.HTTPStatus == http.StatusNotFound || f.Code == "resource_missing"
}

// retrieve is GET /v1/payment_intents/{id}: the intent, or the failure the
// adapter would read, or a transport error.
func (c *Client) retrieve(ctx context.Context, start time.Time, first bool, id string) (*simIntent, *provider.Rejection, error) {
	if id == "." || id == ".." {
		// net/http's router redirects these paths to one no endpoint
		// serves: a 404 that no fault is rolled for.
		if err := c.late(ctx, start, first); err != nil {
			return nil, nil, err
		}
		f := missingIntentReply(id).failure()
		return nil, &f, nil
	}
	_, reply, err := c.call(ctx, start, first, http.MethodGet, simPathCreate+"/"+id)
	if err != nil {
		return nil, nil, err
	}
	if reply == nil && id == "search" {
		// The router serves this path as the search endpoint, which finds
		// no query in the request.
		_, qerr := ParseSearchQuery("")
		reply = badQueryReply(qerr)
	}
	if reply == nil {
		if in := c.sim.intent(c.account, id); in != nil {
			return in, nil, nil
		}
		reply = missingIntentReply(id)
	}
	f := reply.failure()
	return nil, &f, nil
}

// lookupByID is the adapter's lookupByID for a retrieved intent.
func (c *Client) lookupByID(ctx context.Context, start time.Time, in *simIntent, req provider.LookupRequest) (provider.LookupResult, error) {
	if err := provider.CheckIntent(req, in.facts()); err != nil {
		return provider.LookupResult{}, err
	}
	out, err := c.settle(ctx, start, in, req.ProviderKey)
	if err != nil {
		return provider.LookupResult{}, err
	}
	return provider.LookupResult{Found: true, Outcome: out}, nil
}

// facts are in's fields as the adapter decodes them: from JSON, in which
// each invalid UTF-8 byte of a metadata value became U+FFFD (afterJSON).
func (in *simIntent) facts() provider.IntentFacts {
	key, _ := in.meta(provider.MetadataIdempotencyKey)
	merchant, _ := in.meta(provider.MetadataMerchantID)
	return provider.IntentFacts{ID: in.id, MerchantID: afterJSON(merchant), IdempotencyKey: afterJSON(key),
		Amount: in.amount, Currency: in.currency}
}

// outcome is what the Stripe adapter makes of the intent in, whether it
// arrives as a create's answer or from a lookup: a succeeded intent is a
// charge, a processing one Processing; any other is a decline whose Response
// has the shape of Stripe's 402 error (for the simulator's declines, exactly
// the 402 body it sends). code, when not empty, is the decline's reason
// over the intent's own (a canceled requires_action).
func (in *simIntent) outcome(code string) *provider.Outcome {
	if in.status == simSucceeded || in.status == simProcessing || in.status == simRequiresCapture {
		status := http.StatusOK
		if in.status == simProcessing {
			status = http.StatusAccepted
		}
		return &provider.Outcome{
			ChargeID:         in.id,
			Status:           in.status,
			Processing:       in.status == simProcessing,
			Authorized:       in.status == simRequiresCapture,
			AmountCapturable: in.capturable,
			HTTPStatus:       status,
			Response:         renderSim(func(b []byte) []byte { return appendIntentJSON(b, in) }),
		}
	}
	var e simError
	reason := in.status
	switch d := in.decline; {
	case code != "":
		e = simError{Type: "card_error", Code: code, Message: "The payment needed the customer to authenticate and was canceled."}
		reason = code
	case d != nil:
		e = d.cardError()
		reason = cmp.Or(d.declineCode, d.code, reason)
	default:
		// Stopped short of succeeding (requires_confirmation, canceled):
		// declinedIntent's defaults.
		e = simError{Type: "card_error", Message: "The payment intent is " + in.status + "."}
	}
	return &provider.Outcome{
		ChargeID:    in.id,
		Status:      in.status,
		Declined:    true,
		DeclineCode: reason,
		HTTPStatus:  http.StatusPaymentRequired,
		Response:    renderSim(func(b []byte) []byte { return appendErrorJSON(b, &e, in) }),
	}
}

// chargeParams are the parameters the adapter sends for req, as parseCreate
// would read them back.
func chargeParams(req provider.ChargeRequest) createParams {
	md := make([]simMeta, 0, len(req.Metadata)+2)
	for k, v := range req.Metadata {
		if k != provider.MetadataMerchantID && k != provider.MetadataIdempotencyKey {
			md = append(md, simMeta{k, v})
		}
	}
	md = append(md, simMeta{provider.MetadataMerchantID, req.MerchantID}, simMeta{provider.MetadataIdempotencyKey, req.IdempotencyKey})
	slices.SortFunc(md, cmpMetaKey)
	return createParams{
		amount:         req.Amount,
		currency:       req.Currency,
		paymentMethod:  req.PaymentMethod,
		confirm:        true,
		offSession:     !req.OnSession,
		captureManual:  req.ManualCapture,
		description:    req.Description,
		hasDescription: req.Description != "",
		metadata:       md,
		methodTypes:    methodTypesFor(req.PaymentMethod),
	}
}

// checkCharge runs parseCreate's checks, in its order, on parameters that
// chargeParams built: those a well-formed form can still fail.
func (p *createParams) checkCharge() *simError {
	if e := checkAmount(p.amount); e != nil {
		return e
	}
	if e := checkCurrency(p.currency); e != nil {
		return e
	}
	return checkPaymentMethod(p.paymentMethod, p.confirm)
}

// appendChargeForm appends the canonical form of the create the adapter sends
// for p, built by chargeParams: what url.Values.Encode makes of the body the
// HTTP handler parses (names sorted, query-escaped), so that its digest
// matches the one an HTTP request of the adapter leaves under its key. It
// also returns the length of that body as stripe-go sends it, which escapes
// no bracket in a name, for the simulator's body limit.
func appendChargeForm(b []byte, p *createParams) ([]byte, int) {
	start := len(b)
	brackets := 4 // automatic_payment_methods[...] twice
	b = append(b, "amount="...)
	b = strconv.AppendInt(b, p.amount, 10)
	b = append(b, "&automatic_payment_methods%5Ballow_redirects%5D=never&automatic_payment_methods%5Benabled%5D=true"...)
	if p.captureManual {
		b = append(b, "&capture_method=manual"...)
	}
	b = append(b, "&confirm=true&currency="...)
	b = appendQueryEscape(b, p.currency)
	if p.hasDescription {
		b = append(b, "&description="...)
		b = appendQueryEscape(b, p.description)
	}
	md := p.metadata
	if !slices.IsSortedFunc(md, cmpFormKey) {
		md = slices.Clone(md)
		slices.SortFunc(md, cmpFormKey)
	}
	for _, m := range md {
		b = append(b, "&metadata%5B"...)
		b = appendQueryEscape(b, m.key)
		b = append(b, "%5D="...)
		b = appendQueryEscape(b, m.value)
		brackets += 2 + strings.Count(m.key, "[") + strings.Count(m.key, "]")
	}
	if p.offSession {
		b = append(b, "&off_session=true"...)
	} else {
		b = append(b, "&off_session=false"...)
	}
	b = append(b, "&payment_method="...)
	b = appendQueryEscape(b, p.paymentMethod)
	// Each bracket is three bytes escaped, one on the wire.
	return b, len(b) - start - 2*brackets
}

// cmpFormKey orders metadata entries as their form names "metadata[key]"
// sort, which is not always the order of the keys: "a1]" sorts before "a]".
func cmpFormKey(a, b simMeta) int {
	n := min(len(a.key), len(b.key))
	if c := strings.Compare(a.key[:n], b.key[:n]); c != 0 {
		return c
	}
	switch {
	case len(a.key) == len(b.key):
		return 0
	case len(a.key) < len(b.key):
		// a's "]" meets b's next byte; if equal, a's name ends first.
		if b.key[n] >= ']' {
			return -1
		}
		return 1
	default:
		if a.key[n] >= ']' {
			return 1
		}
		return -1
	}
}

const upperHex = "0123456789ABCDEF"

// queryPlain marks the bytes url.QueryEscape leaves as they are.
var queryPlain = func() (t [256]bool) {
	for c := range 256 {
		t[c] = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			c == '-' || c == '_' || c == '.' || c == '~'
	}
	return t
}()

// appendQueryEscape appends url.QueryEscape(s).
func appendQueryEscape(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case queryPlain[c]:
			b = append(b, c)
		case c == ' ':
			b = append(b, '+')
		default:
			b = append(b, '%', upperHex[c>>4], upperHex[c&0xF])
		}
	}
	return b
}

// validHeaderValue reports whether net/http sends v as a header value: no
// control byte but tab.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}
