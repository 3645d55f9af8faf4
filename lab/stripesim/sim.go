package stripesim

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
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

	"github.com/paydedup/paydedup/provider"
)

// Defaults for Config.
const (
	// DefaultKeyTTL is how long the simulator keeps an idempotency key,
	// like Stripe's 24 h window.
	DefaultKeyTTL = 24 * time.Hour
	// DefaultProcessingDelay is how long a bank debit stays processing
	// (Stripe's test bank accounts settle within minutes; real ones take
	// days).
	DefaultProcessingDelay = 2 * time.Second
	// DefaultCaptureWindow is how long an authorization (an intent left
	// requires_capture) can be captured before the provider cancels it:
	// 7 days for most cards at Stripe.
	DefaultCaptureWindow = 7 * 24 * time.Hour
	// ShutdownTimeout is how long Serve waits for in-flight requests
	// before closing their connections.
	ShutdownTimeout = 5 * time.Second
)

// maxSimBody bounds a request body; Stripe's own limit is far larger, but no
// payment intent needs more.
const maxSimBody = 1 << 20

// Faults are the failures the simulator injects, each rolled independently
// per API request (GET and POST alike, except RateDropAfterCharge which only
// applies to the POSTs that act: create, capture, cancel, refund). All may be changed while it runs with
// SetFaults. A Client's calls are rolled the same way; where a connection
// would be closed, it returns a ClassUnknown *Error wrapping io.EOF.
type Faults struct {
	// Latency is waited before a request is processed; it ends early (and
	// the connection is dropped) when the client goes away, or for a
	// Client when its ctx ends or its timeout passes.
	Latency time.Duration
	// Jitter adds a uniform random [0, Jitter) to Latency.
	Jitter time.Duration
	// Rate5xx answers 500 api_error without processing. The client cannot
	// know that, so it sees an unknown outcome.
	Rate5xx float64
	// Rate429 answers 429 rate_limit with "Retry-After: 1", not processed.
	Rate429 float64
	// RateDropAfterCharge processes the request (the charge, capture,
	// cancel or refund happens and the response is saved under its
	// idempotency key), then closes the connection without answering: the
	// case that double-charges (or double-refunds) naive clients. A
	// replayed answer can be dropped the same way.
	RateDropAfterCharge float64
	// RateFailBeforeCharge closes the connection before processing anything.
	RateFailBeforeCharge float64
	// RateRefundFail answers a refund pending, then fails it after
	// Config.ProcessingDelay (failure_reason expired_or_canceled_card), as
	// a card's refund can fail days later at Stripe: its money is back and
	// may be refunded again. Drawn once per refund made, not per request.
	RateRefundFail float64
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
		{"RateRefundFail", f.RateRefundFail},
	} {
		if math.IsNaN(r.v) || r.v < 0 || r.v > 1 {
			return fmt.Errorf("%w: Faults.%s %v is not in [0,1]", provider.ErrInvalidConfig, r.name, r.v)
		}
	}
	if f.Latency < 0 {
		return fmt.Errorf("%w: Faults.Latency %s is negative", provider.ErrInvalidConfig, f.Latency)
	}
	if f.Jitter < 0 {
		return fmt.Errorf("%w: Faults.Jitter %s is negative", provider.ErrInvalidConfig, f.Jitter)
	}
	return nil
}

// Config configures a Simulator. The fields of Faults, Model, Seed, KeyTTL
// and SearchLag map one to one to the flags of `paydedup provider-sim`
// (e.g. --rate-5xx, --latency, --latency-median, --rate-limit, --key-ttl);
// Now, OnCharge and Logger are hooks for tests and wiring.
type Config struct {
	// Faults are the initial injected faults.
	Faults Faults
	// Model is the provider's latency and account limits (model.go); its
	// zero value answers at once, without limits. Counted in Stats.
	Model Model
	// Seed makes ids and fault rolls reproducible; 0 picks a random seed.
	Seed int64
	// KeyTTL is how long an idempotency key is remembered; after it the same
	// key is a new request and charges again. DefaultKeyTTL when 0.
	KeyTTL time.Duration
	// SearchLag hides intents younger than this from search, like Stripe's
	// eventually consistent search index. Retrieve by id is never lagged.
	SearchLag time.Duration
	// ProcessingDelay is how long an intent of a bank-debit test method
	// (pm_usBankAccount_success, pm_usBankAccount_accountClosed) stays
	// processing before it succeeds or fails; DefaultProcessingDelay when 0.
	ProcessingDelay time.Duration
	// CaptureWindow is how long an authorization can be captured; after
	// it the simulator cancels the intent, as Stripe does.
	// DefaultCaptureWindow when 0.
	CaptureWindow time.Duration

	// WebhookURL, when set, receives the events of intents that settle
	// after processing (payment_intent.succeeded, payment_intent.
	// payment_failed), and of refunds that fail after pending
	// (refund.updated), signed with WebhookSecret as Stripe signs them
	// (Stripe-Signature): a comma-separated list signs with each, as
	// Stripe does while an endpoint's secret is rolled. Close stops them.
	WebhookURL    string
	WebhookSecret string
	// WebhookClient posts them; a client of its own when nil.
	WebhookClient *http.Client

	// Now is the clock for key expiry, search lag and timestamps; time.Now
	// when nil.
	Now func() time.Time
	// OnCharge, when set, is called synchronously for every succeeded charge,
	// after it is in the ledger and while its idempotency key is still in
	// flight (before the response is saved). Blocking in it holds the key:
	// concurrent requests with the same key get 409 idempotency_key_in_use
	// until it returns. It must not panic.
	OnCharge func(Charge)
	// Logger receives one line per injected fault; discarded when nil. It
	// never sees request parameters.
	Logger *slog.Logger
}

// Validate reports the first invalid field by name: rates must be in [0,1]
// and durations non-negative.
func (c Config) Validate() error {
	if err := c.Faults.Validate(); err != nil {
		return err
	}
	if err := c.Model.Validate(); err != nil {
		return err
	}
	if c.KeyTTL < 0 {
		return fmt.Errorf("%w: KeyTTL %s is negative", provider.ErrInvalidConfig, c.KeyTTL)
	}
	if c.SearchLag < 0 {
		return fmt.Errorf("%w: SearchLag %s is negative", provider.ErrInvalidConfig, c.SearchLag)
	}
	if c.CaptureWindow < 0 {
		return fmt.Errorf("%w: CaptureWindow %s is negative", provider.ErrInvalidConfig, c.CaptureWindow)
	}
	if c.ProcessingDelay < 0 {
		return fmt.Errorf("%w: ProcessingDelay %s is negative", provider.ErrInvalidConfig, c.ProcessingDelay)
	}
	if (c.WebhookURL == "") != (c.WebhookSecret == "") {
		return fmt.Errorf("%w: WebhookURL and WebhookSecret go together", provider.ErrInvalidConfig)
	}
	return nil
}

// Charge is one succeeded charge in the simulator's ledger.
type Charge struct {
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

// Ledger is the simulator's report, also served as JSON at GET /_sim/ledger.
type Ledger struct {
	// Charges lists every succeeded charge in creation order.
	Charges []Charge `json:"charges"`
	// ChargesByKey counts succeeded charges per "merchant_id:idempotency_key";
	// any value above 1 is a double charge.
	ChargesByKey map[string]int `json:"charges_by_key"`
	// Declines counts declined payment intents (replays not included).
	Declines int `json:"declines"`
	// Refunds lists every refund made, in creation order, as it stands.
	Refunds []Refund `json:"refunds,omitempty"`
	// Captures and Cancels list every capture and every cancel the
	// simulator executed, in order: a replay under the same key is not
	// one, a refused request is not one. Two for one intent, or two
	// under one provider key, would be an operation executed twice.
	Captures []IntentOp `json:"captures,omitempty"`
	Cancels  []IntentOp `json:"cancels,omitempty"`
}

// Simulator is an http.Handler speaking the subset of Stripe's v1 wire format
// that paydedup uses: POST /v1/payment_intents (with idempotency keys),
// GET /v1/payment_intents/{id} and GET /v1/payment_intents/search, the
// operations after a charge (capture, cancel, POST and GET /v1/refunds:
// lifecycle.go), plus
// GET /_sim/ledger and GET /_sim/stats. Any non-empty Bearer key is accepted; each key is its own
// account, scoping idempotency keys and intents. Client returns a Provider
// that calls the same simulator without HTTP. It keeps every intent in memory
// for its lifetime, about 330 bytes each with its key (store.go). It is safe
// for concurrent use.
type Simulator struct {
	keyTTL     time.Duration
	searchLag  time.Duration
	processing time.Duration
	captureWin time.Duration
	now        func() time.Time
	onCharge   func(Charge)
	log        *slog.Logger
	mux        *http.ServeMux
	hooks      *hooks // nil without a WebhookURL
	model      Model
	lim        *limiter

	mu      sync.Mutex
	faults  Faults
	rng     *rand.Rand
	keys    map[simKeyID]simKey
	inserts int
	// keysExpire is a time before which no key expires (zero: unknown), so
	// that a sweep need not look at every key when none can have expired.
	keysExpire time.Time
	// accounts and accountNames intern the accounts: simRec.account and
	// simKeyID.account are indexes in accountNames.
	accounts     map[string]uint32
	accountNames []string
	// recs holds every intent as it stands, in creation order; ids finds
	// one by id (its key is a piece of the intent's packed strings).
	recs simRecs
	ids  map[string]int32
	// firsts keeps an intent as its create made it once it has changed
	// (settled, canceled): what its create key replays.
	firsts map[int32]simRec
	// keyMeta is what the in-flight and cancel keys remember (simKey).
	keyMeta map[simKeyID]simKeyMeta
	// strTable and strIndex intern short strings that recur (store.go).
	strTable []string
	strIndex map[string]uint32
	declines int
	// captured is what a capture took of a manual-capture intent, by its
	// place; refunds are an intent's refunds, oldest first; opKeys are
	// the keys of captures and refunds (lifecycle.go).
	captured map[int32]int64
	refunds  map[int32][]*simRefund
	refundN  int
	opKeys   map[simKeyID]*simOpKey
	// captureLog and cancelLog are every capture and cancel the
	// simulator executed (never a replay, never a refusal), in order: a
	// record for the ledger's report (lifecycle.go), read by no answer.
	captureLog, cancelLog []simOpRec
}

// Intent statuses the simulator produces.
const (
	simSucceeded             = "succeeded"
	simRequiresPaymentMethod = "requires_payment_method"
	simRequiresConfirmation  = "requires_confirmation"
	simRequiresAction        = "requires_action"
	simProcessing            = "processing"
	simCanceled              = "canceled"
	simRequiresCapture       = "requires_capture"
)

// simIntent is a PaymentIntent unpacked from its simRec (store.go) to render
// an answer (simjson.go): the fields that vary. Its strings are pieces of
// the record's packed string.
type simIntent struct {
	id string
	// providerKey is the Idempotency-Key it was created under, "" if none.
	providerKey    string
	currency       string
	description    string
	hasDescription bool
	// paymentMethod is "" when the intent has none (or lost it to a decline).
	paymentMethod string
	// latestCharge is the charge id of a succeeded intent, else "".
	latestCharge string
	// manual is an intent created with capture_method=manual; capturable
	// is what it holds for capture, received what a capture took.
	manual               bool
	capturable, received int64
	status               string
	// decline is the card error of a declined intent, else nil.
	decline     *simDecline
	amount      int64
	created     time.Time
	metadata    []simMeta // sorted by key, keys unique
	methodTypes []string  // sorted
}

// simMeta is one metadata entry.
type simMeta struct{ key, value string }

func cmpMetaKey(a, b simMeta) int { return strings.Compare(a.key, b.key) }

// meta returns the metadata value for key and whether it is set.
func (in *simIntent) meta(key string) (string, bool) {
	lo, hi := 0, len(in.metadata)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if in.metadata[m].key < key {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(in.metadata) && in.metadata[lo].key == key {
		return in.metadata[lo].value, true
	}
	return "", false
}

// httpStatus is the status of the create answer that made in.
func (in *simIntent) httpStatus() int {
	if in.decline != nil {
		return http.StatusPaymentRequired
	}
	return http.StatusOK
}

// simError is Stripe's error object.
type simError struct {
	Type, Code, DeclineCode, Message, Param string
}

// simDecline is the error a test payment method produces.
type simDecline struct{ code, declineCode, message string }

// The declines of Stripe's test payment methods.
var (
	simGenericDecline    = &simDecline{"card_declined", "generic_decline", "Your card was declined."}
	simInsufficientFunds = &simDecline{"card_declined", "insufficient_funds", "Your card has insufficient funds."}
	simExpiredCard       = &simDecline{"expired_card", "expired_card", "Your card has expired."}
	// simAuthRequired is what an off-session charge of a card that needs
	// 3-D Secure gets.
	simAuthRequired = &simDecline{provider.DeclineAuthenticationRequired, provider.DeclineAuthenticationRequired,
		"Your card was declined. This transaction requires authentication."}
	// simAccountClosed is how pm_usBankAccount_accountClosed ends.
	simAccountClosed = &simDecline{"payment_method_provider_decline", "account_closed", "The customer's bank account has been closed."}
)

// Stripe's test payment methods with a behaviour other than charging at
// once or declining.
const (
	// pmAuthRequired needs 3-D Secure: requires_action on-session, a 402
	// authentication_required off-session.
	pmAuthRequired = "pm_card_authenticationRequired"
	// pmBankSuccess and pmBankAccountClosed are ACH Direct Debit test
	// accounts: processing, then succeeded or failed.
	pmBankSuccess       = "pm_usBankAccount_success"
	pmBankAccountClosed = "pm_usBankAccount_accountClosed"
)

// simCardOnly is the payment_method_types of almost every intent, shared by
// them all: never modify it.
var simCardOnly = []string{"card"}

// The simulator's fixed error answers.
var (
	simReplyUnauthorized = &simReply{status: http.StatusUnauthorized, err: &simError{Type: "authentication_error",
		Message: "You did not provide an API key. Provide it in the Authorization header as a Bearer token."}}
	simReplyRateLimited = &simReply{status: http.StatusTooManyRequests, retryAfter: time.Second, err: &simError{
		Type: "invalid_request_error", Code: "rate_limit", Message: "Too many requests hit the API too quickly."}}
	simReplyServerError = &simReply{status: http.StatusInternalServerError, err: &simError{Type: "api_error",
		Message: "An unknown error occurred while processing your request."}}
	simReplyKeyInUse = &simReply{status: http.StatusConflict, err: &simError{Type: "invalid_request_error", Code: "idempotency_key_in_use",
		Message: "There is currently another in-progress request using this Stripe token (probably the same request). Try again later."}}
	// simReplyBodyTooLarge is what the handler answers when ParseForm fails
	// on a body over maxSimBody.
	simReplyBodyTooLarge = &simReply{status: http.StatusBadRequest, err: &simError{Type: "invalid_request_error",
		Message: "Invalid request body: " + (&http.MaxBytesError{Limit: maxSimBody}).Error()}}
)

// errSimConnectionClosed stands in Client's errors for a connection the
// HTTP simulator closes without answering.
var errSimConnectionClosed = fmt.Errorf("simulator closed the connection without a response: %w", io.EOF)

// declineFor returns the decline Stripe's test payment method pm produces, or
// nil for one that charges.
func declineFor(pm string) *simDecline {
	switch pm {
	case "pm_card_chargeDeclined":
		return simGenericDecline
	case "pm_card_chargeDeclinedInsufficientFunds":
		return simInsufficientFunds
	case "pm_card_chargeDeclinedExpiredCard":
		return simExpiredCard
	}
	return nil
}

// simReply is an error answer: what the HTTP handler writes, and what the
// client turns into the *Error or declined Outcome the Stripe adapter would
// make of it.
type simReply struct {
	status int
	err    *simError
	// retryAfter is the Retry-After header, in whole seconds; 0 for none.
	retryAfter time.Duration
	// reason is the Stripe-Rate-Limited-Reason header; "" for none.
	reason string
}

func simReplyFor(status int, e *simError) *simReply { return &simReply{status: status, err: e} }

// mismatchReply is the idempotency_error for key.
func mismatchReply(key string) *simReply {
	return simReplyFor(http.StatusBadRequest, &simError{Type: "idempotency_error",
		Message: "Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '" + key + "' if you meant to execute a different request."})
}

// New returns a Simulator for cfg. It panics if cfg.Validate fails:
// validate user input (flags) first.
func New(cfg Config) *Simulator {
	if err := cfg.Validate(); err != nil {
		panic("stripesim: New: " + err.Error())
	}
	seed := uint64(cfg.Seed)
	if seed == 0 {
		seed = rand.Uint64()
	}
	s := &Simulator{
		keyTTL:     cfg.KeyTTL,
		searchLag:  cfg.SearchLag,
		processing: cmp.Or(cfg.ProcessingDelay, DefaultProcessingDelay),
		captureWin: cmp.Or(cfg.CaptureWindow, DefaultCaptureWindow),
		now:        cfg.Now,
		onCharge:   cfg.OnCharge,
		log:        cfg.Logger,
		faults:     cfg.Faults,
		model:      cfg.Model,
		lim:        newLimiter(cfg.Model),
		rng:        rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		keys:       make(map[simKeyID]simKey),
		accounts:   make(map[string]uint32),
		ids:        make(map[string]int32),
		firsts:     make(map[int32]simRec),
		captured:   make(map[int32]int64),
		refunds:    make(map[int32][]*simRefund),
		opKeys:     make(map[simKeyID]*simOpKey),
		keyMeta:    make(map[simKeyID]simKeyMeta),
		strIndex:   make(map[string]uint32),
	}
	if s.keyTTL == 0 {
		s.keyTTL = DefaultKeyTTL
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if cfg.WebhookURL != "" {
		client := cfg.WebhookClient
		if client == nil {
			client = &http.Client{Timeout: webhookTimeout}
		}
		ctx, cancel := context.WithCancel(context.Background())
		s.hooks = &hooks{url: cfg.WebhookURL, secret: cfg.WebhookSecret, client: client, log: s.log,
			timers: map[*time.Timer]struct{}{}, ctx: ctx, cancel: cancel}
	}
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("POST "+simPathCreate, s.api(KindCreate, s.createIntent))
	s.mux.HandleFunc("GET "+simPathSearch, s.api(KindSearch, s.searchIntents))
	s.mux.HandleFunc("GET "+simPathCreate, s.api(KindList, s.listIntents))
	s.mux.HandleFunc("GET "+simPathCreate+"/{id}", s.api(KindRetrieve, s.retrieveIntent))
	s.mux.HandleFunc("POST "+simPathCreate+"/{id}/cancel", s.api(KindCancel, s.cancelIntent))
	s.mux.HandleFunc("POST "+simPathCreate+"/{id}/capture", s.api(KindCapture, s.captureIntent))
	s.mux.HandleFunc("POST "+simPathRefunds, s.api(KindRefund, s.createRefund))
	s.mux.HandleFunc("GET "+simPathRefunds, s.api(KindRefundList, s.listRefunds))
	s.mux.HandleFunc("GET /_sim/ledger", s.serveLedger)
	s.mux.HandleFunc("GET /_sim/stats", s.serveStats)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeSimError(w, http.StatusNotFound, &simError{Type: "invalid_request_error",
			Message: fmt.Sprintf("Unrecognized request URL (%s: %s).", r.Method, r.URL.Path)})
	})
	return s
}

// The API paths the simulator serves.
const (
	simPathCreate = "/v1/payment_intents"
	simPathSearch = "/v1/payment_intents/search"
)

// ServeHTTP serves the Stripe subset and the ledger.
func (s *Simulator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if dotSegment(r.URL.Path) {
		writeUnrecognized(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// Serve listens on addr (HOST:PORT) and serves until ctx ends, then shuts down
// gracefully within ShutdownTimeout. It returns nil after a clean shutdown.
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
	sctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
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
func (s *Simulator) Charges() []Charge {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.chargesLocked()
}

// chargesLocked lists the succeeded intents as ledger entries; nil when there
// are none.
func (s *Simulator) chargesLocked() []Charge {
	var out []Charge
	now := s.now()
	for ord := range s.recs.len() {
		if r := s.currentLocked(int32(ord), now); r.statusIs(simSucceeded) {
			c := r.charge(s.strTable)
			if r.flags&recManualCapture != 0 {
				c.Amount = s.captured[int32(ord)]
			}
			out = append(out, c)
		}
	}
	return out
}

// ChargesByKey counts succeeded charges per "merchant_id:idempotency_key".
func (s *Simulator) ChargesByKey() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	// As chargesByKey(s.chargesLocked()), without the list of charges.
	m := make(map[string]int)
	now := s.now()
	for ord := range s.recs.len() {
		if r := s.currentLocked(int32(ord), now); r.statusIs(simSucceeded) {
			merchant, _ := r.meta(s.strTable, provider.MetadataMerchantID)
			key, _ := r.meta(s.strTable, provider.MetadataIdempotencyKey)
			m[merchant+":"+key]++
		}
	}
	return m
}

func chargesByKey(charges []Charge) map[string]int {
	m := make(map[string]int, len(charges))
	for _, c := range charges {
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
func (s *Simulator) Ledger() Ledger {
	s.mu.Lock()
	defer s.mu.Unlock()
	charges := s.chargesLocked()
	return Ledger{
		Charges:      charges,
		ChargesByKey: chargesByKey(charges),
		Declines:     s.declines,
		Refunds:      s.refundsLocked(),
		Captures:     s.opRecsLocked(s.captureLog),
		Cancels:      s.opRecsLocked(s.cancelLog),
	}
}

func (s *Simulator) serveLedger(w http.ResponseWriter, _ *http.Request) {
	l := s.Ledger()
	if l.Charges == nil {
		l.Charges = []Charge{}
	}
	body, err := json.Marshal(l)
	if err != nil {
		// Only strings, numbers, times and maps of strings are marshalled.
		panic("stripesim: encode ledger: " + err.Error())
	}
	writeSimRaw(w, http.StatusOK, body)
}

// The shared core: everything below up to the HTTP handlers is used by both
// the handlers and Client, in the same order, so that both see one fault
// sequence, one key store and one set of intents.

// roll is the fate of one request, decided when it arrives.
type roll struct {
	delay                  time.Duration
	failBefore, r429, r5xx bool
	dropAfter              bool
	requestID              string
}

// roll draws a request's fate. Every request draws the same numbers whether
// or not it wants the Request-Id (withID), so one seed gives one sequence of
// fates and ids whichever way requests arrive.
func (s *Simulator) roll(withID bool) roll {
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
	if withID {
		r.requestID = "req_" + s.randIDLocked(14)
	} else {
		for range 14 {
			s.rng.IntN(len(idAlphabet))
		}
	}
	// Drawn last, and only with a model latency, so that a seed gives the
	// fates it gave before the model existed.
	if s.model.LatencyMedian > 0 {
		r.delay += s.model.Latency(s.rng.NormFloat64())
	}
	return r
}

// sleepCtx waits d, or until ctx ends, which it reports with ctx's cause (as
// net/http reports a request whose context ended).
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		t.Stop()
		return context.Cause(ctx)
	}
}

// admit applies the rest of a request's fate once its latency has passed:
// drop when the connection is to be closed before anything is processed, or
// the reply (401, 429, 500) that answers it unprocessed; neither lets the
// request through. account is "" when the request carries no API key.
func (s *Simulator) admit(fate roll, account, method, path string) (reply *simReply, drop bool) {
	switch {
	case fate.failBefore:
		s.fault("fail_before_charge", method, path)
		return nil, true
	case account == "":
		return simReplyUnauthorized, false
	case fate.r429:
		s.fault("rate_limit", method, path)
		return simReplyRateLimited, false
	case fate.r5xx:
		s.fault("api_error", method, path)
		return simReplyServerError, false
	}
	return nil, false
}

func (s *Simulator) fault(kind, method, path string) {
	s.log.Info("fault injected", "fault", kind, "method", method, "path", path)
}

// createParams are the validated parameters of POST /v1/payment_intents.
type createParams struct {
	amount         int64
	currency       string
	paymentMethod  string
	confirm        bool
	offSession     bool
	captureManual  bool
	description    string
	hasDescription bool
	metadata       []simMeta // sorted by key; process takes it over
	methodTypes    []string  // sorted; process takes it over
}

func invalidParam(param, code, msg string) *simError {
	return &simError{Type: "invalid_request_error", Code: code, Param: param, Message: msg}
}

// The checks below are shared by parseCreate and the client, which call them
// in the order parseCreate does.

func checkAmount(n int64) *simError {
	if n <= 0 {
		return invalidParam("amount", "parameter_invalid_integer", "This value must be greater than or equal to 1.")
	}
	return nil
}

func checkCurrency(c string) *simError {
	if c == "" {
		return invalidParam("currency", "parameter_missing", "Missing required param: currency.")
	}
	if !isCurrency(c) {
		return invalidParam("currency", "parameter_invalid_string", "Invalid currency: "+c+".")
	}
	return nil
}

func checkPaymentMethod(pm string, confirm bool) *simError {
	switch {
	case pm == "" && confirm:
		return invalidParam("payment_method", "parameter_missing", "Missing required param: payment_method.")
	case pm != "" && !strings.HasPrefix(pm, "pm_"):
		return invalidParam("payment_method", "resource_missing", "No such PaymentMethod: '"+pm+"'")
	}
	return nil
}

// createParamNames are the parameters of POST /v1/payment_intents the
// simulator knows, besides metadata[...] and payment_method_types[n].
var createParamNames = map[string]bool{
	"amount": true, "currency": true, "payment_method": true, "confirm": true, "description": true,
	"off_session": true, "capture_method": true, "automatic_payment_methods[enabled]": true, "automatic_payment_methods[allow_redirects]": true,
}

// unknownParam is Stripe's answer to a parameter it does not know: the
// first, in name order, that known does not accept.
func unknownParam(form url.Values, known func(string) bool) *simError {
	names := make([]string, 0, len(form))
	for k := range form {
		if !known(k) {
			names = append(names, k)
		}
	}
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	return invalidParam(names[0], "parameter_unknown", "Received unknown parameter: "+names[0])
}

func isCreateParam(k string) bool {
	return createParamNames[k] || isMetadataParam(k) || strings.HasPrefix(k, "payment_method_types[")
}

// parseBool reads a boolean parameter as Stripe does.
func parseBool(form url.Values, name string) (bool, *simError) {
	switch c := form.Get(name); c {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	default:
		return false, invalidParam(name, "parameter_invalid_boolean", "Invalid boolean: "+c)
	}
}

func parseCreate(form url.Values) (createParams, *simError) {
	var p createParams
	if e := unknownParam(form, isCreateParam); e != nil {
		return p, e
	}
	a := form.Get("amount")
	if a == "" {
		return p, invalidParam("amount", "parameter_missing", "Missing required param: amount.")
	}
	n, err := strconv.ParseInt(a, 10, 64)
	if err != nil {
		return p, invalidParam("amount", "parameter_invalid_integer", "Invalid integer: "+a)
	}
	if e := checkAmount(n); e != nil {
		return p, e
	}
	p.amount = n
	p.currency = form.Get("currency")
	if e := checkCurrency(p.currency); e != nil {
		return p, e
	}
	var e *simError
	if p.confirm, e = parseBool(form, "confirm"); e != nil {
		return p, e
	}
	if p.offSession, e = parseBool(form, "off_session"); e != nil {
		return p, e
	}
	switch m := form.Get("capture_method"); m {
	case "", "automatic", "automatic_async":
	case "manual":
		p.captureManual = true
	default:
		return p, invalidParam("capture_method", "parameter_invalid_string", "Invalid capture_method: must be one of automatic, automatic_async, or manual")
	}
	p.paymentMethod = form.Get("payment_method")
	if e := checkPaymentMethod(p.paymentMethod, p.confirm); e != nil {
		return p, e
	}
	if form.Has("description") {
		p.description, p.hasDescription = form.Get("description"), true
	}
	entries := 0
	for k := range form {
		if isMetadataParam(k) {
			entries++
		}
	}
	p.metadata = make([]simMeta, 0, entries)
	for k, vs := range form {
		switch {
		case isMetadataParam(k):
			p.metadata = append(p.metadata, simMeta{k[len("metadata[") : len(k)-1], vs[0]})
		case strings.HasPrefix(k, "payment_method_types["):
			p.methodTypes = append(p.methodTypes, vs...)
		}
	}
	slices.SortFunc(p.metadata, cmpMetaKey)
	slices.Sort(p.methodTypes)
	if len(p.methodTypes) == 0 {
		p.methodTypes = methodTypesFor(p.paymentMethod)
	}
	return p, nil
}

// simBankOnly is the payment_method_types of a bank-debit intent, shared:
// never modify it.
var simBankOnly = []string{"us_bank_account"}

// methodTypesFor is the payment_method_types of an intent created with
// automatic payment methods for pm.
func methodTypesFor(pm string) []string {
	if strings.HasPrefix(pm, "pm_usBankAccount") {
		return simBankOnly
	}
	return simCardOnly
}

func isMetadataParam(k string) bool {
	return strings.HasPrefix(k, "metadata[") && strings.HasSuffix(k, "]")
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

// createResult is what the key store made of a create.
type createResult uint8

const (
	// createFresh: processed now (charged, declined or left unconfirmed).
	createFresh createResult = iota
	// createReplayed: answered from the key's first request.
	createReplayed
	// createMismatch: the key was first used with other parameters.
	createMismatch
	// createInFlight: the key's first request is still being processed.
	createInFlight
)

// create runs a validated create for account under idempotency key ("" for
// none); params is the digest of the request's canonical form, compared with
// the one the key was first used with. It returns the intent that answers a
// fresh or replayed create.
func (s *Simulator) create(account, key string, params [sha256.Size]byte, p *createParams) (createResult, *simIntent) {
	now := s.now()
	if key == "" {
		in, _ := s.process(account, "", params, now, p)
		return createFresh, in
	}
	s.mu.Lock()
	id := simKeyID{key, s.accountLocked(account)}
	e, ok := s.keys[id]
	var meta simKeyMeta
	if ok {
		meta = s.keyMetaLocked(id, e)
	}
	if ok && !e.inFlight() && now.Sub(meta.created) >= s.keyTTL {
		s.forgetKeyLocked(id)
		ok = false
	}
	if !ok && s.opKeyTakenLocked(id, now) {
		s.mu.Unlock()
		return createMismatch, nil
	}
	switch {
	case !ok:
		// The key is the request's string while in flight; once the intent
		// is stored, the copy in its packed strings (below).
		s.keys[id] = simKey{ord: -1, kind: keyInFlight}
		s.keyMeta[id] = simKeyMeta{params, now}
		s.sweepLocked(now)
	case meta.params != params:
		s.mu.Unlock()
		return createMismatch, nil
	case e.inFlight():
		s.mu.Unlock()
		return createInFlight, nil
	default:
		in := s.answerLocked(e)
		s.mu.Unlock()
		return createReplayed, in
	}
	s.mu.Unlock()

	done := false
	defer func() {
		if !done {
			// OnCharge panicked: forget the key rather than hold it forever.
			s.mu.Lock()
			s.forgetKeyLocked(id)
			s.mu.Unlock()
		}
	}()
	in, ord := s.process(account, key, params, now, p)
	s.mu.Lock()
	// Storing under an equal key replaces the map's copy of the key's
	// string with this one, which the intent's record holds anyway; the
	// record holds its params and time too.
	delete(s.keyMeta, id)
	s.keys[simKeyID{in.providerKey, id.account}] = simKey{ord: ord, kind: keyCreate}
	s.mu.Unlock()
	done = true
	return createFresh, in
}

// internLocked returns the one copy of account the simulator keeps.
func (s *Simulator) internLocked(account string) string {
	return s.accountNames[s.accountLocked(account)]
}

// sweepLocked forgets expired keys now and then, so a long-running simulator
// does not keep every key forever. now is when the latest key was created.
func (s *Simulator) sweepLocked(now time.Time) {
	if exp := now.Add(s.keyTTL); s.keysExpire.IsZero() || exp.Before(s.keysExpire) {
		s.keysExpire = exp
	}
	s.inserts++
	if s.inserts%1024 != 0 || now.Before(s.keysExpire) {
		return
	}
	var next time.Time
	for k, e := range s.keys {
		created := s.keyMetaLocked(k, e).created
		if !e.inFlight() && now.Sub(created) >= s.keyTTL {
			s.forgetKeyLocked(k)
			continue
		}
		if exp := created.Add(s.keyTTL); next.IsZero() || exp.Before(next) {
			next = exp
		}
	}
	s.keysExpire = next
}

// intentIDLen is the length of "pi_" and "ch_" ids.
const intentIDLen = 3 + 24

// process performs a create at now under key with params (its digest):
// it charges or declines and stores the intent, keeping none of p's memory.
// It returns the intent and its place.
func (s *Simulator) process(account, key string, params [sha256.Size]byte, now time.Time, p *createParams) (*simIntent, int32) {
	d := declineFor(p.paymentMethod)
	r := simRec{amount: p.amount, created: now, params: params}
	status := simSucceeded
	switch {
	case !p.confirm:
		status = simRequiresConfirmation
	case d != nil:
		status, r.decline = simRequiresPaymentMethod, declineIndex(d)
	case p.paymentMethod == pmAuthRequired && p.offSession:
		status, r.decline = simRequiresPaymentMethod, declineIndex(simAuthRequired)
	case p.paymentMethod == pmAuthRequired:
		status = simRequiresAction
	case p.paymentMethod == pmBankSuccess || p.paymentMethod == pmBankAccountClosed:
		status = simProcessing
		r.pending = &simPending{settleAt: now.Add(s.processing)}
		if p.paymentMethod == pmBankAccountClosed {
			r.pending.fails = simAccountClosed
		}
	}
	if p.captureManual {
		r.flags |= recManualCapture
		if status == simSucceeded {
			// Authorized: held until a capture, a cancel or the window's end.
			status = simRequiresCapture
		}
	}
	r.status = statusIndex(status)
	if p.hasDescription {
		r.flags |= recHasDescription
	}
	hasCharge := status == simSucceeded || status == simProcessing || status == simRequiresCapture
	pm := p.paymentMethod
	if r.decline != 0 {
		pm = ""
	}
	switch {
	case slices.Equal(p.methodTypes, simCardOnly):
	case slices.Equal(p.methodTypes, simBankOnly):
		r.flags |= recBankOnly
	default:
		r.flags |= recOwnTypes
	}

	// The packed strings (store.go), built in a recycled buffer.
	bp := simBufs.Get().(*[]byte)
	s.mu.Lock()
	b := s.appendRandIDLocked((*bp)[:0], "pi_")
	if hasCharge {
		b = s.appendRandIDLocked(b, "ch_")
	} else {
		b = appendPacked(b, "")
	}
	b = s.appendShortLocked(b, p.currency)
	b = appendPacked(b, key)
	b = s.appendShortLocked(b, pm)
	b = s.appendShortLocked(b, p.description)
	b = binary.AppendUvarint(b, uint64(len(p.metadata)))
	for _, m := range p.metadata {
		b = s.appendShortLocked(s.appendShortLocked(b, m.key), m.value)
	}
	if r.flags&recOwnTypes != 0 {
		b = binary.AppendUvarint(b, uint64(len(p.methodTypes)))
		for _, t := range p.methodTypes {
			b = s.appendShortLocked(b, t)
		}
	}
	r.strs = string(b)
	r.account = s.accountLocked(account)
	account = s.accountNames[r.account]
	if r.decline != 0 {
		s.declines++
	}
	ord := s.recs.add(r)
	id := r.id()
	s.ids[id] = ord
	tbl := s.strTable
	s.mu.Unlock()
	*bp = b
	putSimBuf(bp)

	if r.statusIs(simSucceeded) && s.onCharge != nil {
		s.onCharge(r.charge(tbl))
	}
	if r.statusIs(simProcessing) && s.hooks != nil {
		s.scheduleWebhook(account, id, s.processing)
	}
	if r.statusIs(simRequiresCapture) && s.hooks != nil {
		s.scheduleExpiryWebhook(account, id, s.captureWin)
	}
	return r.view(tbl), ord
}

// appendRandIDLocked appends, in place, prefix and a random id of
// intentIDLen in all.
func (s *Simulator) appendRandIDLocked(b []byte, prefix string) []byte {
	b = binary.AppendUvarint(b, uint64(intentIDLen)<<1)
	b = append(b, prefix...)
	for range intentIDLen - len(prefix) {
		b = append(b, idAlphabet[s.rng.IntN(len(idAlphabet))])
	}
	return b
}

const idAlphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

func (s *Simulator) randIDLocked(n int) string {
	var b strings.Builder
	b.Grow(n)
	for range n {
		b.WriteByte(idAlphabet[s.rng.IntN(len(idAlphabet))])
	}
	return b.String()
}

// publishLocked puts r, a new state of the intent at ord, in the place of
// the old, keeping the first for its create key.
func (s *Simulator) publishLocked(ord int32, r simRec) {
	if _, ok := s.firsts[ord]; !ok {
		s.firsts[ord] = *s.recs.at(ord)
	}
	*s.recs.at(ord) = r
}

// currentLocked returns the intent at ord as it stands at now: a processing
// intent whose time has come is replaced by its settled state (succeeded, or
// failed back to requires_payment_method with its decline and without its
// payment method, as Stripe leaves a failed bank debit).
func (s *Simulator) currentLocked(ord int32, now time.Time) simRec {
	r := *s.recs.at(ord)
	if r.statusIs(simRequiresCapture) && !now.Before(r.created.Add(s.captureWin)) {
		// The authorization expired: the provider cancels it.
		r.status = statusIndex(simCanceled)
		s.publishLocked(ord, r)
		return r
	}
	if !r.statusIs(simProcessing) || now.Before(r.pending.settleAt) {
		return r
	}
	fails := r.pending.fails
	r.pending = nil
	if fails != nil {
		r.status, r.decline = statusIndex(simRequiresPaymentMethod), declineIndex(fails)
		r.flags |= recLostPaymentMethod
		s.declines++
	} else {
		r.status = statusIndex(simSucceeded)
	}
	s.publishLocked(ord, r)
	return r
}

// findLocked returns the place of account's intent id.
func (s *Simulator) findLocked(account, id string) (int32, bool) {
	ord, ok := s.ids[id]
	if !ok {
		return 0, false
	}
	a, ok := s.accounts[account]
	return ord, ok && s.recs.at(ord).account == a
}

// intent returns account's intent id as it stands now, nil when there is
// none.
func (s *Simulator) intent(account, id string) *simIntent {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if ord, ok := s.findLocked(account, id); ok {
		r := s.currentLocked(ord, now)
		return s.viewLocked(ord, &r)
	}
	return nil
}

// cancelable are the statuses from which Stripe cancels an intent.
var cancelable = []string{simRequiresPaymentMethod, "requires_capture", simRequiresConfirmation, simRequiresAction, simProcessing}

// cancel runs POST /v1/payment_intents/{id}/cancel for account under
// idempotency key ("" for none; params is the digest of the request). It
// returns the canceled intent (fresh, or replayed from the key), or the
// reply that refused it.
func (s *Simulator) cancel(account, key, id string, params [sha256.Size]byte) (*simIntent, bool, *simReply) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if key != "" {
		kid := simKeyID{key, s.accountLocked(account)}
		if e, ok := s.keys[kid]; ok {
			meta := s.keyMetaLocked(kid, e)
			if e.inFlight() || now.Sub(meta.created) < s.keyTTL {
				switch {
				case meta.params != params:
					return nil, false, mismatchReply(key)
				case e.inFlight():
					return nil, false, simReplyKeyInUse
				}
				return s.answerLocked(e), true, nil
			}
		}
		if s.opKeyTakenLocked(kid, now) {
			return nil, false, mismatchReply(key)
		}
	}
	ord, ok := s.findLocked(account, id)
	if !ok {
		return nil, false, missingIntentReply(id)
	}
	r := s.currentLocked(ord, now)
	if status := simStatuses[r.status]; !slices.Contains(cancelable, status) {
		return nil, false, simReplyFor(http.StatusBadRequest, &simError{Type: "invalid_request_error", Code: "payment_intent_unexpected_state",
			Message: "You cannot cancel this PaymentIntent because it has a status of " + status + ". Only a PaymentIntent with one of the following statuses may be canceled: " +
				strings.Join(cancelable, ", ") + "."})
	}
	r.status, r.decline, r.pending = statusIndex(simCanceled), 0, nil
	s.publishLocked(ord, r)
	s.cancelLog = append(s.cancelLog, simOpRec{ord: ord, key: strings.Clone(key), amount: r.amount, at: now})
	in := s.viewLocked(ord, &r)
	if key != "" {
		kid := simKeyID{strings.Clone(key), s.accountLocked(account)}
		s.keys[kid] = simKey{ord: ord, kind: keyCancel}
		s.keyMeta[kid] = simKeyMeta{params, now}
		s.sweepLocked(now)
	}
	return in, false, nil
}

// searchPage returns account's intents whose metadata match every clause,
// newest first (like Stripe), leaving out the first offset and those younger
// than the search lag, at most limit of them; more reports that others
// follow.
func (s *Simulator) searchPage(account string, clauses []SearchClause, offset, limit int) (page []*simIntent, more bool) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.accounts[account]
	if !ok {
		return nil, false
	}
	for i := s.recs.len() - 1; i >= 0; i-- {
		r := s.recs.at(int32(i))
		if r.account != a || now.Sub(r.created) < s.searchLag || !r.matches(s.strTable, clauses) {
			continue
		}
		c := s.currentLocked(int32(i), now)
		switch {
		case offset > 0:
			offset--
		case len(page) == limit:
			return page, true
		default:
			page = append(page, s.viewLocked(int32(i), &c))
		}
	}
	return page, false
}

// The HTTP front end.

// api wraps an endpoint of kind (KindCreate…) with body parsing, the
// account's limits, latency, faults and auth.
func (s *Simulator) api(kind string, h func(http.ResponseWriter, *http.Request, string, roll)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// Read the body before waiting: only then does net/http notice a
		// client that hangs up, and cancel r.Context().
		r.Body = http.MaxBytesReader(w, r.Body, maxSimBody)
		formErr := r.ParseForm()
		fate := s.roll(true)
		w.Header().Set("Request-Id", fate.requestID)
		account, _ := bearer(r)
		// Stripe's limiters answer before anything else is done, and
		// at once.
		limited, release := s.lim.enter(kind, account, s.now())
		switch limited {
		case ReasonGlobalRate:
			writeSimReply(w, simReplyGlobalRate)
			return
		case ReasonGlobalConcurrency:
			writeSimReply(w, simReplyGlobalConcurrency)
			return
		}
		defer release()
		if err := sleepCtx(r.Context(), fate.delay); err != nil {
			dropConn(w)
			return
		}
		s.lim.slept(fate.delay)
		reply, drop := s.admit(fate, account, r.Method, r.URL.Path)
		if reply == simReplyRateLimited {
			s.lim.injected()
		}
		switch {
		case drop:
			dropConn(w)
			return
		case reply != nil:
			writeSimReply(w, reply)
			return
		case formErr != nil:
			writeSimError(w, http.StatusBadRequest, &simError{Type: "invalid_request_error",
				Message: "Invalid request body: " + formErr.Error()})
			return
		}
		h(w, r, account, fate)
	}
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

func (s *Simulator) createIntent(w http.ResponseWriter, r *http.Request, account string, fate roll) {
	p, perr := parseCreate(r.PostForm)
	if perr != nil {
		// Like Stripe, a request that fails validation saves nothing under
		// its idempotency key.
		writeSimError(w, http.StatusBadRequest, perr)
		return
	}
	key := strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	var params [sha256.Size]byte
	if key != "" {
		w.Header().Set("Idempotency-Key", key)
		// Encode sorts by name: a canonical form of what was sent.
		params = sha256.Sum256([]byte(r.PostForm.Encode()))
	}
	res, in := s.create(account, key, params, &p)
	switch res {
	case createMismatch:
		writeSimReply(w, mismatchReply(key))
	case createInFlight:
		writeSimReply(w, simReplyKeyInUse)
	default:
		if fate.dropAfter {
			s.fault("drop_after_charge", r.Method, r.URL.Path)
			dropConn(w)
			return
		}
		if res == createReplayed {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		writeSimRendered(w, in.httpStatus(), func(b []byte) []byte { return appendCreateAnswer(b, in) })
	}
}

func (s *Simulator) retrieveIntent(w http.ResponseWriter, r *http.Request, account string, _ roll) {
	id := r.PathValue("id")
	in := s.intent(account, id)
	if in == nil {
		writeSimReply(w, missingIntentReply(id))
		return
	}
	writeSimRendered(w, http.StatusOK, func(b []byte) []byte { return appendIntentJSON(b, in) })
}

func (s *Simulator) cancelIntent(w http.ResponseWriter, r *http.Request, account string, fate roll) {
	id := r.PathValue("id")
	if e := cancelParams(r.PostForm); e != nil {
		writeSimError(w, http.StatusBadRequest, e)
		return
	}
	key := strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	var params [sha256.Size]byte
	if key != "" {
		w.Header().Set("Idempotency-Key", key)
		params = cancelDigest(id, r.PostForm.Encode())
	}
	in, replayed, reply := s.cancel(account, key, id, params)
	if reply != nil {
		writeSimReply(w, reply)
		return
	}
	if fate.dropAfter {
		s.fault("drop_after_charge", r.Method, r.URL.Path)
		dropConn(w)
		return
	}
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	writeSimRendered(w, http.StatusOK, func(b []byte) []byte { return appendIntentJSON(b, in) })
}

// cancelReasons are Stripe's cancellation_reason values a caller may send.
var cancelReasons = []string{"duplicate", "fraudulent", "requested_by_customer", "abandoned"}

// cancelParams checks the parameters of a cancel.
func cancelParams(form url.Values) *simError {
	if e := unknownParam(form, func(k string) bool { return k == "cancellation_reason" }); e != nil {
		return e
	}
	if r := form.Get("cancellation_reason"); r != "" && !slices.Contains(cancelReasons, r) {
		return invalidParam("cancellation_reason", "parameter_invalid_string", "Invalid cancellation_reason: must be one of "+strings.Join(cancelReasons, ", "))
	}
	return nil
}

// cancelDigest is the digest a cancel of id with the encoded form leaves
// under its key: never that of a create, so a key used for one and then the
// other is a mismatch, as at Stripe.
func cancelDigest(id, form string) [sha256.Size]byte {
	return sha256.Sum256([]byte("cancel " + id + "?" + form))
}

func missingIntentReply(id string) *simReply {
	return simReplyFor(http.StatusNotFound, &simError{Type: "invalid_request_error", Code: "resource_missing",
		Param: "intent", Message: "No such payment_intent: '" + id + "'"})
}

// maxSearchLimit is the largest page a search may ask for, as at Stripe.
const maxSearchLimit = 100

// searchPagePrefix marks the simulator's opaque page tokens.
const searchPagePrefix = "simpage_"

func (s *Simulator) searchIntents(w http.ResponseWriter, r *http.Request, account string, _ roll) {
	if e := unknownParam(r.Form, func(k string) bool { return k == "query" || k == "limit" || k == "page" }); e != nil {
		writeSimError(w, http.StatusBadRequest, e)
		return
	}
	clauses, err := ParseSearchQuery(r.Form.Get("query"))
	if err != nil {
		writeSimReply(w, badQueryReply(err))
		return
	}
	limit := 10
	if l := r.Form.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxSearchLimit {
			writeSimError(w, http.StatusBadRequest, invalidParam("limit", "parameter_invalid_integer",
				"limit must be an integer between 1 and 100."))
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
	page, more := s.searchPage(account, clauses, offset, limit)
	writeSimRendered(w, http.StatusOK, func(b []byte) []byte { return appendSearchPage(b, page, more, offset) })
}

func badQueryReply(err error) *simReply {
	return simReplyFor(http.StatusBadRequest, invalidParam("query", "parameter_invalid_string", err.Error()))
}

func writeSimReply(w http.ResponseWriter, r *simReply) {
	if r.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(int64(r.retryAfter/time.Second), 10))
	}
	if r.reason != "" {
		w.Header().Set(HeaderRateLimitedReason, r.reason)
	}
	writeSimError(w, r.status, r.err)
}

func writeSimError(w http.ResponseWriter, status int, e *simError) {
	writeSimRendered(w, status, func(b []byte) []byte { return appendErrorJSON(b, e, nil) })
}

// writeSimRendered writes the JSON body render appends, rendered into a
// recycled buffer (Write does not keep it).
func writeSimRendered(w http.ResponseWriter, status int, render func([]byte) []byte) {
	bp := simBufs.Get().(*[]byte)
	*bp = render((*bp)[:0])
	writeSimRaw(w, status, *bp)
	putSimBuf(bp)
}

func writeSimRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
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
