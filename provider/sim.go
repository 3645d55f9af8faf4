package provider

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Defaults for SimConfig.
const (
	// DefaultSimKeyTTL is how long the simulator keeps an idempotency key,
	// like Stripe's 24 h window.
	DefaultSimKeyTTL = 24 * time.Hour
	// SimShutdownTimeout is how long Serve waits for in-flight requests
	// before closing their connections.
	SimShutdownTimeout = 5 * time.Second
)

// maxSimBody bounds a request body; Stripe's own limit is far larger, but no
// payment intent needs more.
const maxSimBody = 1 << 20

// Faults are the failures the simulator injects, each rolled independently
// per API request (GET and POST alike, except RateDropAfterCharge which only
// applies to POST /v1/payment_intents). All may be changed while it runs with
// SetFaults.
type Faults struct {
	// Latency is waited before a request is processed; it ends early (and
	// the connection is dropped) when the client goes away.
	Latency time.Duration
	// Jitter adds a uniform random [0, Jitter) to Latency.
	Jitter time.Duration
	// Rate5xx answers 500 api_error without processing. The client cannot
	// know that, so it sees an unknown outcome.
	Rate5xx float64
	// Rate429 answers 429 rate_limit with "Retry-After: 1", not processed.
	Rate429 float64
	// RateDropAfterCharge processes the request (the charge happens and the
	// response is saved under its idempotency key), then closes the
	// connection without answering: the case that double-charges naive
	// clients. A replayed answer can be dropped the same way.
	RateDropAfterCharge float64
	// RateFailBeforeCharge closes the connection before processing anything.
	RateFailBeforeCharge float64
}

// Validate reports the first out-of-range field by name.
func (f Faults) Validate() error {
	for _, r := range []struct {
		name string
		v    float64
	}{
		{"Rate5xx", f.Rate5xx},
		{"Rate429", f.Rate429},
		{"RateDropAfterCharge", f.RateDropAfterCharge},
		{"RateFailBeforeCharge", f.RateFailBeforeCharge},
	} {
		if math.IsNaN(r.v) || r.v < 0 || r.v > 1 {
			return fmt.Errorf("%w: Faults.%s %v is not in [0,1]", ErrInvalidConfig, r.name, r.v)
		}
	}
	if f.Latency < 0 {
		return fmt.Errorf("%w: Faults.Latency %s is negative", ErrInvalidConfig, f.Latency)
	}
	if f.Jitter < 0 {
		return fmt.Errorf("%w: Faults.Jitter %s is negative", ErrInvalidConfig, f.Jitter)
	}
	return nil
}

// SimConfig configures a Simulator. The fields of Faults, Seed, KeyTTL and
// SearchLag map one to one to the flags of `paydedup provider-sim` (e.g.
// --rate-5xx, --latency, --key-ttl); Now, OnCharge and Logger are hooks for
// tests and wiring.
type SimConfig struct {
	// Faults are the initial injected faults.
	Faults Faults
	// Seed makes ids and fault rolls reproducible; 0 picks a random seed.
	Seed int64
	// KeyTTL is how long an idempotency key is remembered; after it the same
	// key is a new request and charges again. DefaultSimKeyTTL when 0.
	KeyTTL time.Duration
	// SearchLag hides intents younger than this from search, like Stripe's
	// eventually consistent search index. Retrieve by id is never lagged.
	SearchLag time.Duration

	// Now is the clock for key expiry, search lag and timestamps; time.Now
	// when nil.
	Now func() time.Time
	// OnCharge, when set, is called synchronously for every succeeded charge,
	// after it is in the ledger and while its idempotency key is still in
	// flight (before the response is saved). Blocking in it holds the key:
	// concurrent requests with the same key get 409 idempotency_key_in_use
	// until it returns. It must not panic.
	OnCharge func(SimCharge)
	// Logger receives one line per injected fault; discarded when nil. It
	// never sees request parameters.
	Logger *slog.Logger
}

// Validate reports the first invalid field by name: rates must be in [0,1]
// and durations non-negative.
func (c SimConfig) Validate() error {
	if err := c.Faults.Validate(); err != nil {
		return err
	}
	if c.KeyTTL < 0 {
		return fmt.Errorf("%w: KeyTTL %s is negative", ErrInvalidConfig, c.KeyTTL)
	}
	if c.SearchLag < 0 {
		return fmt.Errorf("%w: SearchLag %s is negative", ErrInvalidConfig, c.SearchLag)
	}
	return nil
}

// SimCharge is one succeeded charge in the simulator's ledger.
type SimCharge struct {
	// ID is the PaymentIntent id ("pi_...").
	ID string `json:"id"`
	// ProviderKey is the Idempotency-Key the charge was made under, empty if
	// none.
	ProviderKey string `json:"provider_key"`
	// MerchantID and IdempotencyKey come from the intent's metadata.
	MerchantID     string `json:"merchant_id"`
	IdempotencyKey string `json:"idempotency_key"`
	// Amount and Currency are what was charged.
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	// Status is the intent's status, "succeeded".
	Status string `json:"status"`
	// Created is when the charge was made, on the simulator's clock.
	Created time.Time `json:"created"`
}

// SimLedger is the simulator's report, also served as JSON at GET /_sim/ledger.
type SimLedger struct {
	// Charges lists every succeeded charge in creation order.
	Charges []SimCharge `json:"charges"`
	// ChargesByKey counts succeeded charges per "merchant_id:idempotency_key";
	// any value above 1 is a double charge.
	ChargesByKey map[string]int `json:"charges_by_key"`
	// Declines counts declined payment intents (replays not included).
	Declines int `json:"declines"`
}

// Simulator is an http.Handler speaking the subset of Stripe's v1 wire format
// that paydedup uses: POST /v1/payment_intents (with idempotency keys),
// GET /v1/payment_intents/{id} and GET /v1/payment_intents/search, plus
// GET /_sim/ledger. Any non-empty Bearer key is accepted; each key is its own
// account, scoping idempotency keys and intents. It keeps every intent in
// memory for its lifetime. It is safe for concurrent use.
type Simulator struct {
	keyTTL    time.Duration
	searchLag time.Duration
	now       func() time.Time
	onCharge  func(SimCharge)
	log       *slog.Logger
	mux       *http.ServeMux

	mu       sync.Mutex
	faults   Faults
	rng      *rand.Rand
	keys     map[string]*simKey
	inserts  int
	intents  map[string]*simIntent
	order    []*simIntent
	charges  []SimCharge
	declines int
}

// simKey is one remembered idempotency key.
type simKey struct {
	params   string
	created  time.Time
	inFlight bool
	status   int
	body     []byte
}

// simIntent is a PaymentIntent as the simulator stores and renders it.
type simIntent struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	Amount             int64             `json:"amount"`
	AmountReceived     int64             `json:"amount_received"`
	CaptureMethod      string            `json:"capture_method"`
	ConfirmationMethod string            `json:"confirmation_method"`
	Created            int64             `json:"created"`
	Currency           string            `json:"currency"`
	Description        *string           `json:"description"`
	LastPaymentError   *simError         `json:"last_payment_error"`
	LatestCharge       *string           `json:"latest_charge"`
	Livemode           bool              `json:"livemode"`
	Metadata           map[string]string `json:"metadata"`
	PaymentMethod      *string           `json:"payment_method"`
	PaymentMethodTypes []string          `json:"payment_method_types"`
	Status             string            `json:"status"`

	account string
	created time.Time
}

// simError is Stripe's error object.
type simError struct {
	Type          string     `json:"type"`
	Code          string     `json:"code,omitempty"`
	DeclineCode   string     `json:"decline_code,omitempty"`
	Message       string     `json:"message"`
	Param         string     `json:"param,omitempty"`
	PaymentIntent *simIntent `json:"payment_intent,omitempty"`
}

// simDecline is the error a test payment method produces.
type simDecline struct{ code, declineCode, message string }

// declineFor returns the decline Stripe's test payment method pm produces, if
// it is one that declines.
func declineFor(pm string) (simDecline, bool) {
	switch pm {
	case "pm_card_chargeDeclined":
		return simDecline{"card_declined", "generic_decline", "Your card was declined."}, true
	case "pm_card_chargeDeclinedInsufficientFunds":
		return simDecline{"card_declined", "insufficient_funds", "Your card has insufficient funds."}, true
	case "pm_card_chargeDeclinedExpiredCard":
		return simDecline{"expired_card", "expired_card", "Your card has expired."}, true
	}
	return simDecline{}, false
}

// NewSimulator returns a Simulator for cfg. It panics if cfg.Validate fails:
// validate user input (flags) first.
func NewSimulator(cfg SimConfig) *Simulator {
	if err := cfg.Validate(); err != nil {
		panic("provider: NewSimulator: " + err.Error())
	}
	seed := uint64(cfg.Seed)
	if seed == 0 {
		seed = rand.Uint64()
	}
	s := &Simulator{
		keyTTL:    cfg.KeyTTL,
		searchLag: cfg.SearchLag,
		now:       cfg.Now,
		onCharge:  cfg.OnCharge,
		log:       cfg.Logger,
		faults:    cfg.Faults,
		rng:       rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		keys:      make(map[string]*simKey),
		intents:   make(map[string]*simIntent),
	}
	if s.keyTTL == 0 {
		s.keyTTL = DefaultSimKeyTTL
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("POST /v1/payment_intents", s.api(s.createIntent))
	s.mux.HandleFunc("GET /v1/payment_intents/search", s.api(s.searchIntents))
	s.mux.HandleFunc("GET /v1/payment_intents/{id}", s.api(s.retrieveIntent))
	s.mux.HandleFunc("GET /_sim/ledger", s.serveLedger)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeSimError(w, http.StatusNotFound, &simError{Type: "invalid_request_error",
			Message: fmt.Sprintf("Unrecognized request URL (%s: %s).", r.Method, r.URL.Path)})
	})
	return s
}

// ServeHTTP serves the Stripe subset and the ledger.
func (s *Simulator) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Serve listens on addr (HOST:PORT) and serves until ctx ends, then shuts down
// gracefully within SimShutdownTimeout. It returns nil after a clean shutdown.
func (s *Simulator) Serve(ctx context.Context, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	return s.ServeListener(ctx, ln)
}

// ServeListener is Serve on a listener the caller opened (e.g. on port 0, to
// learn the address first). It closes ln.
func (s *Simulator) ServeListener(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve simulator: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), SimShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if err != nil {
		_ = srv.Close()
	}
	<-errc
	if err != nil {
		return fmt.Errorf("shut down simulator: %w", err)
	}
	return nil
}

// SetFaults replaces the injected faults; requests already past their fault
// roll are not affected.
func (s *Simulator) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return fmt.Errorf("set faults: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = f
	return nil
}

// Faults returns the faults in force.
func (s *Simulator) Faults() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults
}

// Charges returns a copy of every succeeded charge, in creation order.
func (s *Simulator) Charges() []SimCharge {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.charges)
}

// ChargesByKey counts succeeded charges per "merchant_id:idempotency_key".
func (s *Simulator) ChargesByKey() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.chargesByKeyLocked()
}

func (s *Simulator) chargesByKeyLocked() map[string]int {
	m := make(map[string]int, len(s.charges))
	for _, c := range s.charges {
		m[c.MerchantID+":"+c.IdempotencyKey]++
	}
	return m
}

// Declines returns how many payment intents were declined.
func (s *Simulator) Declines() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.declines
}

// Ledger returns the whole report at once, consistently.
func (s *Simulator) Ledger() SimLedger {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SimLedger{
		Charges:      slices.Clone(s.charges),
		ChargesByKey: s.chargesByKeyLocked(),
		Declines:     s.declines,
	}
}

func (s *Simulator) serveLedger(w http.ResponseWriter, _ *http.Request) {
	l := s.Ledger()
	if l.Charges == nil {
		l.Charges = []SimCharge{}
	}
	writeSimJSON(w, http.StatusOK, l)
}

// roll is the fate of one request, decided when it arrives.
type roll struct {
	delay                  time.Duration
	failBefore, r429, r5xx bool
	dropAfter              bool
	requestID              string
}

func (s *Simulator) roll() roll {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.faults
	var r roll
	r.delay = f.Latency
	if f.Jitter > 0 {
		r.delay += time.Duration(s.rng.Int64N(int64(f.Jitter)))
	}
	// Every rate is drawn every time, so one seed gives one sequence of
	// fates whatever the rates are.
	r.failBefore = s.rng.Float64() < f.RateFailBeforeCharge
	r.r429 = s.rng.Float64() < f.Rate429
	r.r5xx = s.rng.Float64() < f.Rate5xx
	r.dropAfter = s.rng.Float64() < f.RateDropAfterCharge
	r.requestID = "req_" + s.randIDLocked(14)
	return r
}

// api wraps an endpoint with body parsing, latency, faults and auth.
func (s *Simulator) api(h func(http.ResponseWriter, *http.Request, string, roll)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// Read the body before waiting: only then does net/http notice a
		// client that hangs up, and cancel r.Context().
		r.Body = http.MaxBytesReader(w, r.Body, maxSimBody)
		formErr := r.ParseForm()
		fate := s.roll()
		w.Header().Set("Request-Id", fate.requestID)
		if fate.delay > 0 {
			t := time.NewTimer(fate.delay)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				dropConn(w)
				return
			}
		}
		if fate.failBefore {
			s.fault(r, "fail_before_charge")
			dropConn(w)
			return
		}
		account, ok := bearer(r)
		if !ok {
			writeSimError(w, http.StatusUnauthorized, &simError{Type: "authentication_error",
				Message: "You did not provide an API key. Provide it in the Authorization header as a Bearer token."})
			return
		}
		if fate.r429 {
			s.fault(r, "rate_limit")
			w.Header().Set("Retry-After", "1")
			writeSimError(w, http.StatusTooManyRequests, &simError{Type: "invalid_request_error", Code: "rate_limit",
				Message: "Too many requests hit the API too quickly."})
			return
		}
		if fate.r5xx {
			s.fault(r, "api_error")
			writeSimError(w, http.StatusInternalServerError, &simError{Type: "api_error",
				Message: "An unknown error occurred while processing your request."})
			return
		}
		if formErr != nil {
			writeSimError(w, http.StatusBadRequest, &simError{Type: "invalid_request_error",
				Message: "Invalid request body: " + formErr.Error()})
			return
		}
		h(w, r, account, fate)
	}
}

func (s *Simulator) fault(r *http.Request, kind string) {
	s.log.Info("fault injected", "fault", kind, "method", r.Method, "path", r.URL.Path)
}

// bearer returns the API key of an "Authorization: Bearer <key>" header.
func bearer(r *http.Request) (string, bool) {
	auth := r.Header.Get("Authorization")
	const prefix = "Bearer "
	if len(auth) <= len(prefix) || !strings.EqualFold(auth[:len(prefix)], prefix) {
		return "", false
	}
	key := strings.TrimSpace(auth[len(prefix):])
	return key, key != ""
}

// dropConn closes the client's connection without a response.
func dropConn(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	// HTTP/2 or a wrapped writer: aborting the handler resets the stream.
	panic(http.ErrAbortHandler)
}

// createParams are the validated parameters of POST /v1/payment_intents.
type createParams struct {
	amount        int64
	currency      string
	paymentMethod string
	confirm       bool
	description   *string
	metadata      map[string]string
	methodTypes   []string
}

func parseCreate(form url.Values) (createParams, *simError) {
	var p createParams
	invalid := func(param, code, msg string) (createParams, *simError) {
		return createParams{}, &simError{Type: "invalid_request_error", Code: code, Param: param, Message: msg}
	}
	switch a := form.Get("amount"); {
	case a == "":
		return invalid("amount", "parameter_missing", "Missing required param: amount.")
	default:
		n, err := strconv.ParseInt(a, 10, 64)
		if err != nil {
			return invalid("amount", "parameter_invalid_integer", "Invalid integer: "+a)
		}
		if n <= 0 {
			return invalid("amount", "parameter_invalid_integer", "This value must be greater than or equal to 1.")
		}
		p.amount = n
	}
	p.currency = form.Get("currency")
	if p.currency == "" {
		return invalid("currency", "parameter_missing", "Missing required param: currency.")
	}
	if !isCurrency(p.currency) {
		return invalid("currency", "parameter_invalid_string", "Invalid currency: "+p.currency+".")
	}
	switch c := form.Get("confirm"); c {
	case "", "false":
	case "true":
		p.confirm = true
	default:
		return invalid("confirm", "parameter_invalid_boolean", "Invalid boolean: "+c)
	}
	p.paymentMethod = form.Get("payment_method")
	switch {
	case p.paymentMethod == "" && p.confirm:
		return invalid("payment_method", "parameter_missing", "Missing required param: payment_method.")
	case p.paymentMethod != "" && !strings.HasPrefix(p.paymentMethod, "pm_"):
		return invalid("payment_method", "resource_missing", "No such PaymentMethod: '"+p.paymentMethod+"'")
	}
	if form.Has("description") {
		d := form.Get("description")
		p.description = &d
	}
	p.metadata = map[string]string{}
	for k, vs := range form {
		switch {
		case strings.HasPrefix(k, "metadata[") && strings.HasSuffix(k, "]"):
			p.metadata[k[len("metadata["):len(k)-1]] = vs[0]
		case strings.HasPrefix(k, "payment_method_types["):
			p.methodTypes = append(p.methodTypes, vs...)
		}
	}
	slices.Sort(p.methodTypes)
	if len(p.methodTypes) == 0 {
		p.methodTypes = []string{"card"}
	}
	return p, nil
}

func isCurrency(c string) bool {
	if len(c) != 3 {
		return false
	}
	for i := range len(c) {
		if c[i] < 'a' || c[i] > 'z' {
			return false
		}
	}
	return true
}

func (s *Simulator) createIntent(w http.ResponseWriter, r *http.Request, account string, fate roll) {
	p, perr := parseCreate(r.PostForm)
	if perr != nil {
		// Like Stripe, a request that fails validation saves nothing under
		// its idempotency key.
		writeSimError(w, http.StatusBadRequest, perr)
		return
	}
	key := strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	if key == "" {
		status, body := s.process(account, "", p)
		s.respond(w, r, fate, status, body, false)
		return
	}
	w.Header().Set("Idempotency-Key", key)

	scoped := account + "\x00" + key
	params := r.PostForm.Encode() // sorted by name: a canonical form
	now := s.now()
	s.mu.Lock()
	e := s.keys[scoped]
	if e != nil && !e.inFlight && now.Sub(e.created) >= s.keyTTL {
		delete(s.keys, scoped)
		e = nil
	}
	switch {
	case e == nil:
		e = &simKey{params: params, created: now, inFlight: true}
		s.keys[scoped] = e
		s.sweepLocked(now)
	case e.params != params:
		s.mu.Unlock()
		writeSimError(w, http.StatusBadRequest, &simError{Type: "idempotency_error",
			Message: "Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '" + key + "' if you meant to execute a different request."})
		return
	case e.inFlight:
		s.mu.Unlock()
		writeSimError(w, http.StatusConflict, &simError{Type: "invalid_request_error", Code: "idempotency_key_in_use",
			Message: "There is currently another in-progress request using this Stripe token (probably the same request). Try again later."})
		return
	default:
		status, body := e.status, e.body
		s.mu.Unlock()
		s.respond(w, r, fate, status, body, true)
		return
	}
	s.mu.Unlock()

	done := false
	defer func() {
		if !done {
			// OnCharge panicked: forget the key rather than hold it forever.
			s.mu.Lock()
			delete(s.keys, scoped)
			s.mu.Unlock()
		}
	}()
	status, body := s.process(account, key, p)
	s.mu.Lock()
	e.status, e.body, e.inFlight = status, body, false
	s.mu.Unlock()
	done = true
	s.respond(w, r, fate, status, body, false)
}

// sweepLocked forgets expired keys now and then, so a long-running simulator
// does not keep every key forever.
func (s *Simulator) sweepLocked(now time.Time) {
	s.inserts++
	if s.inserts%1024 != 0 {
		return
	}
	for k, e := range s.keys {
		if !e.inFlight && now.Sub(e.created) >= s.keyTTL {
			delete(s.keys, k)
		}
	}
}

// respond writes a charge response, or drops the connection after the work
// is done when the request's fate says so.
func (s *Simulator) respond(w http.ResponseWriter, r *http.Request, fate roll, status int, body []byte, replayed bool) {
	if fate.dropAfter {
		s.fault(r, "drop_after_charge")
		dropConn(w)
		return
	}
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	writeSimRaw(w, status, body)
}

// process performs a create: it charges or declines and records the intent.
func (s *Simulator) process(account, key string, p createParams) (int, []byte) {
	now := s.now()
	s.mu.Lock()
	in := &simIntent{
		ID:                 "pi_" + s.randIDLocked(24),
		Object:             "payment_intent",
		Amount:             p.amount,
		CaptureMethod:      "automatic",
		ConfirmationMethod: "automatic",
		Created:            now.Unix(),
		Currency:           p.currency,
		Description:        p.description,
		Metadata:           p.metadata,
		PaymentMethodTypes: p.methodTypes,
		account:            account,
		created:            now,
	}
	if p.paymentMethod != "" {
		pm := p.paymentMethod
		in.PaymentMethod = &pm
	}
	var (
		status  = http.StatusOK
		charged bool
		charge  SimCharge
		decline *simError
	)
	d, declined := declineFor(p.paymentMethod)
	switch {
	case !p.confirm:
		in.Status = "requires_confirmation"
	case declined:
		in.Status = "requires_payment_method"
		in.PaymentMethod = nil
		in.LastPaymentError = &simError{Type: "card_error", Code: d.code, DeclineCode: d.declineCode, Message: d.message}
		decline = &simError{Type: "card_error", Code: d.code, DeclineCode: d.declineCode, Message: d.message, PaymentIntent: in}
		status = http.StatusPaymentRequired
		s.declines++
	default:
		in.Status = "succeeded"
		in.AmountReceived = p.amount
		ch := "ch_" + s.randIDLocked(24)
		in.LatestCharge = &ch
		charged = true
		charge = SimCharge{
			ID:             in.ID,
			ProviderKey:    key,
			MerchantID:     p.metadata[MetadataMerchantID],
			IdempotencyKey: p.metadata[MetadataIdempotencyKey],
			Amount:         p.amount,
			Currency:       p.currency,
			Status:         in.Status,
			Created:        now,
		}
		s.charges = append(s.charges, charge)
	}
	s.intents[in.ID] = in
	s.order = append(s.order, in)
	var body []byte
	if decline != nil {
		body = mustJSON(struct {
			Error *simError `json:"error"`
		}{decline})
	} else {
		body = mustJSON(in)
	}
	s.mu.Unlock()

	if charged && s.onCharge != nil {
		s.onCharge(charge)
	}
	return status, body
}

const idAlphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

func (s *Simulator) randIDLocked(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = idAlphabet[s.rng.IntN(len(idAlphabet))]
	}
	return string(b)
}

func (s *Simulator) retrieveIntent(w http.ResponseWriter, r *http.Request, account string, _ roll) {
	id := r.PathValue("id")
	s.mu.Lock()
	in, ok := s.intents[id]
	var body []byte
	if ok && in.account == account {
		body = mustJSON(in)
	}
	s.mu.Unlock()
	if body == nil {
		writeSimError(w, http.StatusNotFound, &simError{Type: "invalid_request_error", Code: "resource_missing",
			Param: "intent", Message: "No such payment_intent: '" + id + "'"})
		return
	}
	writeSimRaw(w, http.StatusOK, body)
}

// searchPagePrefix marks the simulator's opaque page tokens.
const searchPagePrefix = "simpage_"

func (s *Simulator) searchIntents(w http.ResponseWriter, r *http.Request, account string, _ roll) {
	clauses, err := ParseSearchQuery(r.Form.Get("query"))
	if err != nil {
		writeSimError(w, http.StatusBadRequest, &simError{Type: "invalid_request_error", Code: "parameter_invalid_string",
			Param: "query", Message: err.Error()})
		return
	}
	limit := 10
	if l := r.Form.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 100 {
			writeSimError(w, http.StatusBadRequest, &simError{Type: "invalid_request_error", Code: "parameter_invalid_integer",
				Param: "limit", Message: "limit must be an integer between 1 and 100."})
			return
		}
		limit = n
	}
	offset := 0
	if pg := r.Form.Get("page"); pg != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(pg, searchPagePrefix))
		if err != nil || !strings.HasPrefix(pg, searchPagePrefix) || n < 0 {
			writeSimError(w, http.StatusBadRequest, &simError{Type: "invalid_request_error",
				Param: "page", Message: "Invalid page token."})
			return
		}
		offset = n
	}

	now := s.now()
	s.mu.Lock()
	var matched []json.RawMessage
	for i := len(s.order) - 1; i >= 0; i-- { // newest first, like Stripe
		in := s.order[i]
		if in.account != account || now.Sub(in.created) < s.searchLag || !matchClauses(in, clauses) {
			continue
		}
		matched = append(matched, mustJSON(in))
	}
	s.mu.Unlock()

	page := struct {
		Object   string            `json:"object"`
		Data     []json.RawMessage `json:"data"`
		HasMore  bool              `json:"has_more"`
		NextPage *string           `json:"next_page"`
		URL      string            `json:"url"`
	}{Object: "search_result", Data: []json.RawMessage{}, URL: "/v1/payment_intents/search"}
	if offset < len(matched) {
		end := min(offset+limit, len(matched))
		page.Data = matched[offset:end]
		if end < len(matched) {
			page.HasMore = true
			next := searchPagePrefix + strconv.Itoa(end)
			page.NextPage = &next
		}
	}
	writeSimJSON(w, http.StatusOK, page)
}

func matchClauses(in *simIntent, clauses []SearchClause) bool {
	for _, c := range clauses {
		v, ok := in.Metadata[c.Key]
		if !ok || v != c.Value {
			return false
		}
	}
	return true
}

// SearchClause is one metadata['key']:'value' term of a search query.
type SearchClause struct {
	// Key is the metadata key.
	Key string
	// Value is the exact value the key must have.
	Value string
}

// ParseSearchQuery parses the subset of Stripe's search query language the
// simulator supports: metadata['key']:'value' clauses (single or double
// quotes, backslash escapes) joined by AND. Anything else is an error.
func ParseSearchQuery(q string) ([]SearchClause, error) {
	p := &queryParser{s: q}
	var out []SearchClause
	for {
		p.skipSpace()
		c, err := p.clause()
		if err != nil {
			return nil, err
		}
		out = append(out, c)
		p.skipSpace()
		if p.done() {
			return out, nil
		}
		if !p.keyword("AND") {
			return nil, p.errorf("expected AND")
		}
	}
}

type queryParser struct {
	s   string
	pos int
}

func (p *queryParser) done() bool { return p.pos >= len(p.s) }

func (p *queryParser) skipSpace() {
	for !p.done() && (p.s[p.pos] == ' ' || p.s[p.pos] == '\t') {
		p.pos++
	}
}

func (p *queryParser) errorf(format string, args ...any) error {
	return fmt.Errorf("invalid search query at offset %d: %s", p.pos, fmt.Sprintf(format, args...))
}

func (p *queryParser) literal(lit string) bool {
	if strings.HasPrefix(p.s[p.pos:], lit) {
		p.pos += len(lit)
		return true
	}
	return false
}

// keyword consumes kw followed by white space.
func (p *queryParser) keyword(kw string) bool {
	rest := p.s[p.pos:]
	if len(rest) > len(kw) && rest[:len(kw)] == kw && (rest[len(kw)] == ' ' || rest[len(kw)] == '\t') {
		p.pos += len(kw)
		return true
	}
	return false
}

func (p *queryParser) clause() (SearchClause, error) {
	if p.done() {
		return SearchClause{}, p.errorf("expected a clause")
	}
	if !p.literal("metadata[") {
		return SearchClause{}, p.errorf("only metadata['key']:'value' clauses are supported")
	}
	key, err := p.quoted()
	if err != nil {
		return SearchClause{}, err
	}
	if !p.literal("]") {
		return SearchClause{}, p.errorf("expected ]")
	}
	if !p.literal(":") {
		return SearchClause{}, p.errorf("expected :")
	}
	val, err := p.quoted()
	if err != nil {
		return SearchClause{}, err
	}
	return SearchClause{Key: key, Value: val}, nil
}

// quoted reads a '...' or "..." string in which a backslash escapes the next
// byte.
func (p *queryParser) quoted() (string, error) {
	if p.done() || (p.s[p.pos] != '\'' && p.s[p.pos] != '"') {
		return "", p.errorf("expected a quoted string")
	}
	q := p.s[p.pos]
	p.pos++
	var b strings.Builder
	for !p.done() {
		c := p.s[p.pos]
		switch {
		case c == '\\':
			if p.pos+1 >= len(p.s) {
				return "", p.errorf("unterminated escape")
			}
			b.WriteByte(p.s[p.pos+1])
			p.pos += 2
		case c == q:
			p.pos++
			return b.String(), nil
		default:
			b.WriteByte(c)
			p.pos++
		}
	}
	return "", p.errorf("unterminated string")
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// Only strings, numbers and maps of strings are marshalled here.
		panic("provider: simulator: encode response: " + err.Error())
	}
	return b
}

func writeSimError(w http.ResponseWriter, status int, e *simError) {
	writeSimJSON(w, status, struct {
		Error *simError `json:"error"`
	}{e})
}

func writeSimJSON(w http.ResponseWriter, status int, v any) {
	writeSimRaw(w, status, mustJSON(v))
}

func writeSimRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
