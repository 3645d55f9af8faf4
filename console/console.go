// Package console is the operator's web page (paydedup console): the
// stream's backlog and the consumer's lag, pending and stuck idempotency
// rows, dead letters grouped by reason with their headers and bodies, replay
// of one letter or a selection after a confirmation, and a payment lookup by
// merchant and key (the key's row, its ledger row and the provider's stored
// outcome).
//
// It is server-rendered (html/template escapes everything a message may
// carry) and works without JavaScript. It answers only to localhost, IP
// addresses and configured host names, so a web page that rebinds its own
// name to the listener reads nothing. Reading is open to whoever reaches
// the listener, which the command binds to loopback by default; replay, the
// only thing that changes state, needs the operator token (at least 128
// bits, guessed at a throttled rate): a server-side session that logout
// ends and that expires, in a cookie (HttpOnly, SameSite=Strict, Secure
// when configured), a CSRF token in every form, POST only, and net/http's
// cross-origin protection (Sec-Fetch-Site and Origin). Without a token the
// console is read-only. Card data never reaches a page: shown JSON loses
// card details, every text from a message or an answer has its card
// numbers masked and its control bytes escaped (redact.go).
package console

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// Defaults for Config.
const (
	// DefaultGrace is when a pending row counts as stuck: the reconciler's
	// default grace.
	DefaultGrace = 2 * time.Minute
	// DefaultLetterLimit bounds the dead letters the overview reads.
	DefaultLetterLimit = 500
	// DefaultSessionTTL is how long a login lasts.
	DefaultSessionTTL = 8 * time.Hour
	// MinTokenLen is the shortest operator token accepted.
	MinTokenLen = 16
	// DefaultLoginRate is how many wrong logins a second are checked on
	// average, and DefaultLoginBurst how many at once.
	DefaultLoginRate  = 1.0
	DefaultLoginBurst = 10
	requestTimeout    = 15 * time.Second
)

// Store is what the console reads of the idempotency store (*dedup.Store).
type Store interface {
	Stats(ctx context.Context, grace time.Duration) (ledger.Stats, error)
	KindStats(ctx context.Context, grace time.Duration) (ledger.KindStats, error)
	Get(ctx context.Context, merchantID, key string) (ledger.Record, error)
	GetPayment(ctx context.Context, merchantID, key string) (ledger.Payment, error)
}

// Lifecycles reads what moved a payment after its own outcome, the read
// the gateway's GET shows a payment by (*pgstore.Store).
type Lifecycles interface {
	Lifecycle(ctx context.Context, merchantID, key string) (ledger.Lifecycle, error)
}

// Config configures a Console.
type Config struct {
	// Stream is the topology, with the DLQ key that verifies dead letters
	// (and that replay needs).
	Stream stream.Config
	// Lifecycles reads a payment's captures, cancels and refunds for its
	// page; nil leaves them out.
	Lifecycles Lifecycles
	// Token is the operator token replay needs (PAYDEDUP_CONSOLE_TOKEN);
	// empty serves the console read-only. At least MinTokenLen bytes.
	Token string
	// ReadNeedsLogin makes every page need the login, not only replay (the
	// command sets it when the listener is not on loopback).
	ReadNeedsLogin bool
	// Grace: a pending row older than this is stuck. DefaultGrace when 0.
	Grace time.Duration
	// KeyRetention is the store's key retention, which replay enforces
	// (dlq.ReplayOptions.KeyRetention); dlq.DefaultKeyRetention when 0.
	KeyRetention time.Duration
	// ReplayRate bounds republishes per second (dlq.DefaultReplayRate when 0).
	ReplayRate float64
	// LetterLimit bounds the dead letters shown; DefaultLetterLimit when 0.
	LetterLimit int
	// SessionTTL is how long a login lasts; DefaultSessionTTL when 0.
	SessionTTL time.Duration
	// Hosts are the host names the console answers to besides localhost and
	// IP addresses (PAYDEDUP_CONSOLE_HOSTS): any other Host header is
	// refused, so a web page rebinding its own name to this address reads
	// nothing.
	Hosts []string
	// SecureCookie marks the session cookie Secure even on a plain HTTP
	// request (a TLS proxy in front); a TLS request always gets it.
	SecureCookie bool
	// LoginRate and LoginBurst bound wrong logins: LoginRate a second on
	// average, LoginBurst at once (DefaultLoginRate and DefaultLoginBurst
	// when 0); beyond them a login is answered 429 without being checked.
	LoginRate  float64
	LoginBurst int
	// Now is the clock sessions expire by; time.Now when nil.
	Now    func() time.Time
	Logger *slog.Logger
}

// Console serves the operator's page.
type Console struct {
	js    jetstream.JetStream
	store Store
	cfg   Config
	log   *slog.Logger
	auth  *auth
	hosts map[string]bool
	tmpl  *template.Template
}

//go:embed templates/*.html
var templateFS embed.FS

// ErrConfig is wrapped by New's configuration errors.
var ErrConfig = errors.New("invalid console configuration")

// New returns a console reading js and store.
func New(js jetstream.JetStream, store Store, cfg Config) (*Console, error) {
	cfg.Stream = cfg.Stream.WithDefaults()
	cfg.Grace = cmp.Or(cfg.Grace, DefaultGrace)
	cfg.KeyRetention = cmp.Or(cfg.KeyRetention, dlq.DefaultKeyRetention)
	cfg.ReplayRate = cmp.Or(cfg.ReplayRate, dlq.DefaultReplayRate)
	cfg.LetterLimit = cmp.Or(cfg.LetterLimit, DefaultLetterLimit)
	cfg.SessionTTL = cmp.Or(cfg.SessionTTL, DefaultSessionTTL)
	cfg.LoginRate = cmp.Or(cfg.LoginRate, DefaultLoginRate)
	cfg.LoginBurst = cmp.Or(cfg.LoginBurst, DefaultLoginBurst)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Token != "" {
		if err := ValidateToken(cfg.Token); err != nil {
			return nil, err
		}
	}
	if cfg.ReadNeedsLogin && cfg.Token == "" {
		return nil, fmt.Errorf("%w: reads need a login but no token is set", ErrConfig)
	}
	if cfg.Grace < 0 || cfg.KeyRetention < 0 || cfg.ReplayRate < 0 || cfg.LetterLimit < 0 || cfg.SessionTTL < 0 || cfg.LoginRate < 0 || cfg.LoginBurst < 0 {
		return nil, fmt.Errorf("%w: negative grace, key retention, rate, limit, session TTL or login rate", ErrConfig)
	}
	hosts, err := hostNames(cfg.Hosts)
	if err != nil {
		return nil, err
	}
	a, err := newAuth(cfg)
	if err != nil {
		return nil, err
	}
	t, err := template.New("").Funcs(funcs).ParseFS(templateFS, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("parse console templates: %w", err)
	}
	return &Console{js: js, store: store, cfg: cfg, log: cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)), auth: a, hosts: hosts, tmpl: t}, nil
}

// ReadOnly reports whether replay is off: no token, or no valid DLQ key.
func (c *Console) ReadOnly() bool { return c.readOnlyReason() != "" }

func (c *Console) readOnlyReason() string {
	switch {
	case c.cfg.Token == "":
		return "read-only: PAYDEDUP_CONSOLE_TOKEN is not set, so replay is off"
	case stream.ValidateDLQKey(c.cfg.Stream.DLQKey) != nil:
		return "read-only: PAYDEDUP_DLQ_KEY is not set (or too short), so letters cannot be verified or replayed"
	}
	return ""
}

// Handler returns the console's routes.
func (c *Console) Handler() http.Handler {
	mux := http.NewServeMux()
	read := func(h http.HandlerFunc) http.Handler {
		if c.cfg.ReadNeedsLogin {
			return c.auth.requireSession(h)
		}
		return h
	}
	mux.Handle("GET /{$}", read(c.overview))
	mux.Handle("GET /letters/{seq}", read(c.letter))
	mux.Handle("GET /payment", read(c.payment))
	mux.Handle("GET /login", http.HandlerFunc(c.loginPage))
	mux.Handle("POST /login", http.HandlerFunc(c.login))
	mux.Handle("POST /logout", c.auth.requireSession(http.HandlerFunc(c.logout)))
	mux.Handle("POST /replay", c.auth.requireSession(http.HandlerFunc(c.replay)))
	// Every state change is a POST above; the cross-origin check refuses
	// a cross-site POST before any handler runs, including the login. The
	// Host check comes first: a page that rebinds its own name to this
	// address is same-origin to itself, and would read every page.
	cop := http.NewCrossOriginProtection()
	return securityHeaders(c.checkHost(cop.Handler(mux)))
}

// securityHeaders keeps the page out of frames and caches and forbids
// scripts and styles from anywhere but the page itself.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self' 'unsafe-inline'; script-src 'none'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

// page is what every template gets.
type page struct {
	Title    string
	ReadOnly string // why replay is off; empty when it is on
	LoggedIn bool
	CSRF     string
	Flash    string
	Errors   []string
	Data     any
}

func (c *Console) page(r *http.Request, title string, data any) page {
	p := page{Title: title, ReadOnly: c.readOnlyReason(), Data: data, Flash: flashes[r.URL.Query().Get("flash")]}
	if s, ok := c.auth.session(r); ok {
		p.LoggedIn, p.CSRF = true, c.auth.csrf(s)
	}
	return p
}

func (c *Console) render(w http.ResponseWriter, status int, name string, p page) {
	for i, e := range p.Errors {
		p.Errors[i] = shown(e) // an error may quote a message's subject or header
	}
	var b strings.Builder
	if err := c.tmpl.ExecuteTemplate(&b, name, p); err != nil {
		c.log.Error("render console page", "page", name, "error", err)
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	// The page as a whole is masked too: escaping for HTML, or two fields
	// side by side, can bring digits together that no field held alone.
	_, _ = w.Write([]byte(redact.PANs(b.String())))
}

// refuse answers a refused request with a page that says why.
func (c *Console) refuse(w http.ResponseWriter, r *http.Request, status int, why string) {
	p := c.page(r, http.StatusText(status), nil)
	p.Errors = []string{why}
	c.render(w, status, "message.html", p)
}

// ---------------------------------------------------------------------------
// Overview

type overviewData struct {
	Now       time.Time
	Grace     time.Duration
	Stats     *ledger.Stats
	Kinds     []kindRow
	Consumer  *stream.ConsumerStats
	Lag       uint64
	Counts    []reasonCount
	Total     uint64
	Groups    []letterGroup
	Shown     int
	Limit     int
	Truncated bool
	Stream    stream.Config
	// Kind keeps only the letters of this kind (?kind=); LetterKinds
	// counts the letters read by kind.
	Kind        string
	LetterKinds []reasonCount
}

// kindRow is one kind's rows on the overview: by status in the order the
// row moves, and its stuck ones.
type kindRow struct {
	Kind     string
	Statuses []reasonCount
	Stuck    int64
}

// kinds are the kinds of command, in the order the overview lists them.
var kinds = []string{payment.KindCharge, payment.KindAuthorize, payment.KindCapture, payment.KindCancel, payment.KindRefund}

// statusOrder is the order a kind's statuses are listed in: as its rows
// move.
var statusOrder = []string{"pending", "unknown", "processing", "completed", "succeeded", "failed", "refused"}

func viewKinds(ks ledger.KindStats) []kindRow {
	var out []kindRow
	for _, k := range kinds {
		kc, ok := ks.Kinds[k]
		if !ok {
			continue
		}
		row := kindRow{Kind: k, Stuck: kc.Stuck}
		for _, st := range statusOrder {
			if n, ok := kc.ByStatus[st]; ok {
				row.Statuses = append(row.Statuses, reasonCount{st, uint64(max(n, 0))})
			}
		}
		out = append(out, row)
	}
	return out
}

type reasonCount struct {
	Reason string
	Count  uint64
}

type letterGroup struct {
	Reason     string
	Replayable bool
	Letters    []letterView
}

// letterView is a dead letter as the page shows it: redacted.
type letterView struct {
	Seq            uint64
	Reason         string
	MerchantID     string
	IdempotencyKey string
	// Kind is the command's kind its body names; PaymentKey the payment
	// a refund, a capture or a cancel acts on.
	Kind        string
	PaymentKey  string
	Deliveries  uint64
	FailedAt    time.Time
	Stored      time.Time
	Error       string
	OrigSubject string
	Verified    bool
	Unverified  string
	KeyID       string // the DLQ key that verified it (Dlq-Key-Id)
	PreviousKey bool   // that key is one of PAYDEDUP_DLQ_PREVIOUS_KEYS
	Invalid     string
	Truncated   bool
	Headers     []headerView
	Body        string
	BodyLen     int
}

type headerView struct{ Name, Value string }

// viewLetter passes every text of a letter through shown: whoever
// published it wrote its body, headers and subject, and a letter published
// straight to the DLQ's subjects its reason and Dlq-* headers too.
func viewLetter(d dlq.Info) letterView {
	v := letterView{Seq: d.Seq, Reason: shown(d.Reason), MerchantID: shown(d.MerchantID), IdempotencyKey: shown(d.IdempotencyKey),
		Kind: shown(d.Kind), PaymentKey: shown(d.PaymentKey),
		Deliveries: d.Deliveries, FailedAt: d.FailedAt, Stored: d.Stored, Error: shown(d.Error), OrigSubject: shown(d.OrigSubject),
		Verified: d.Verified, Unverified: shown(d.Unverified), KeyID: d.KeyID, PreviousKey: d.PreviousKey, Invalid: shown(d.Invalid), Truncated: d.Truncated,
		Body: redact.ShownBody(d.Data), BodyLen: len(d.Data)}
	for _, k := range slices.Sorted(maps.Keys(d.Header)) {
		for _, val := range d.Header[k] {
			v.Headers = append(v.Headers, headerView{Name: shown(k), Value: shown(val)})
		}
	}
	return v
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	d := overviewData{Now: time.Now(), Grace: c.cfg.Grace, Limit: c.cfg.LetterLimit, Stream: c.cfg.Stream, Kind: r.URL.Query().Get("kind")}
	if d.Kind != "" && !slices.Contains(kinds, d.Kind) {
		c.refuse(w, r, http.StatusBadRequest, "kind is one of "+strings.Join(kinds, ", "))
		return
	}
	p := c.page(r, "paydedup console", nil)
	if st, err := c.store.Stats(ctx, c.cfg.Grace); err != nil {
		p.Errors = append(p.Errors, "idempotency store: "+err.Error())
	} else {
		d.Stats, d.Now = &st, st.Now
	}
	if ks, err := c.store.KindStats(ctx, c.cfg.Grace); err != nil {
		p.Errors = append(p.Errors, "rows by kind: "+err.Error())
	} else {
		d.Kinds = viewKinds(ks)
	}
	if cs, err := stream.ConsumerState(ctx, c.js, c.cfg.Stream); err != nil {
		p.Errors = append(p.Errors, "consumer: "+err.Error())
	} else {
		d.Consumer = &cs
		d.Lag = cs.NumPending + uint64(cs.NumAckPending)
	}
	if counts, err := dlq.Counts(ctx, c.js, c.cfg.Stream); err != nil {
		p.Errors = append(p.Errors, "dead letters: "+err.Error())
	} else {
		for reason, n := range counts {
			d.Counts = append(d.Counts, reasonCount{shown(reason), n})
			d.Total += n
		}
		slices.SortFunc(d.Counts, func(a, b reasonCount) int { return strings.Compare(a.Reason, b.Reason) })
	}
	if d.Total > 0 {
		letters, err := dlq.List(ctx, c.js, c.cfg.Stream, dlq.Filter{Limit: c.cfg.LetterLimit})
		if err != nil {
			p.Errors = append(p.Errors, "dead letters: "+err.Error())
		}
		d.Shown, d.Truncated = len(letters), len(letters) == c.cfg.LetterLimit && d.Total > uint64(len(letters))
		byReason := map[string]*letterGroup{}
		byKind := map[string]uint64{}
		for _, l := range letters {
			byKind[l.Kind]++
			if d.Kind != "" && l.Kind != d.Kind {
				continue
			}
			g := byReason[l.Reason]
			if g == nil {
				g = &letterGroup{Reason: shown(l.Reason), Replayable: stream.ReplayableReason(l.Reason) && l.Reason != stream.ReasonKeyReused}
				byReason[l.Reason] = g
			}
			g.Letters = append(g.Letters, viewLetter(l))
		}
		for _, g := range byReason {
			d.Groups = append(d.Groups, *g)
		}
		for _, k := range slices.Sorted(maps.Keys(byKind)) {
			d.LetterKinds = append(d.LetterKinds, reasonCount{shown(cmp.Or(k, "unreadable")), byKind[k]})
		}
		slices.SortFunc(d.Groups, func(a, b letterGroup) int { return strings.Compare(a.Reason, b.Reason) })
	}
	p.Data = d
	c.render(w, http.StatusOK, "overview.html", p)
}

func (c *Console) letter(w http.ResponseWriter, r *http.Request) {
	seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
	if err != nil || seq == 0 {
		c.refuse(w, r, http.StatusNotFound, "not a dead-letter sequence")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	d, err := dlq.Get(ctx, c.js, c.cfg.Stream, seq)
	switch {
	case errors.Is(err, dlq.ErrNotFound):
		c.refuse(w, r, http.StatusNotFound, fmt.Sprintf("no dead letter %d (already replayed, or expired)", seq))
		return
	case err != nil:
		c.refuse(w, r, http.StatusServiceUnavailable, err.Error())
		return
	}
	c.render(w, http.StatusOK, "letter.html", c.page(r, fmt.Sprintf("dead letter %d", seq), viewLetter(d)))
}

// ---------------------------------------------------------------------------
// Payment lookup

type paymentData struct {
	MerchantID     string
	IdempotencyKey string
	Searched       bool
	Record         *recordView
	Ledger         *ledger.Payment
	NoRecord       bool
	NoLedger       bool
	// State says in words what the ledger row means for a payment whose
	// row was purged (with a row, recordView.State says it).
	State string
	// Life is the payment's lifecycle: its amounts, captures, cancels and
	// refunds; nil when not read.
	Life *lifeView
}

// lifeView is a payment's lifecycle as its page shows it: the status and
// amounts the HTTP API shows (ledger.LifeOf), and its captures, cancels
// and refunds with their own keys, amounts and statuses, redacted.
type lifeView struct {
	Status                                     string
	AmountCapturable, AmountReceived, Refunded *int64
	Ops                                        []opView
	Refunds                                    []opView
	RefundsTotal                               int
}

// opView is a capture, a cancel or a refund on its payment's page.
type opView struct {
	Kind, IdempotencyKey, Status, Reason string
	Amount, AmountReceived               int64
	Currency                             string
	CreatedAt, CompletedAt               time.Time
}

func viewLife(st ledger.PaymentState, l ledger.Lifecycle) *lifeView {
	life := ledger.LifeOf(st, l)
	v := &lifeView{Status: shown(life.Status), AmountCapturable: life.AmountCapturable, AmountReceived: life.AmountReceived,
		Refunded: life.AmountRefunded, RefundsTotal: l.RefundsTotal}
	for _, o := range l.Ops {
		v.Ops = append(v.Ops, opView{Kind: shown(o.Kind), IdempotencyKey: shown(o.IdempotencyKey), Status: shown(o.Status), Reason: shown(o.Reason),
			Amount: o.Amount, AmountReceived: o.AmountReceived, Currency: shown(o.Currency), CreatedAt: o.CreatedAt, CompletedAt: o.CompletedAt})
	}
	for _, r := range l.Refunds {
		v.Refunds = append(v.Refunds, opView{Kind: payment.KindRefund, IdempotencyKey: shown(r.IdempotencyKey), Status: shown(r.Status),
			Reason: shown(r.Reason), Amount: r.Amount, Currency: shown(r.Currency), CreatedAt: r.CreatedAt, CompletedAt: r.CompletedAt})
	}
	return v
}

// recordView is an idempotency row as the page shows it: no request hash,
// every text redacted (a provider echoes a merchant's description and
// metadata into its answer and its errors).
type recordView struct {
	ledger.Record
	Response string
	// State says in words what the row's status means for the payment.
	State string
}

// stateWords says what a payment's client-visible state (ledger.StateOf
// over the rows the lookup read) means. The console reads no intake, so a
// payment waiting for an operator shows its record's state, retrying:
// those words say that a dead-lettered message waits for an operator
// instead. maybe_charged (maybeCharged) matters only while the key is
// pending: a completed row keeps it, and its outcome says what happened.
func stateWords(st ledger.PaymentState, maybeCharged bool) string {
	switch {
	case st.Status == ledger.StateSucceeded:
		return "completed: charged"
	case st.Status == ledger.StateDeclined:
		return "completed: declined, never charged"
	case st.Status == ledger.StateAuthorized:
		return "completed: authorized, the amount held by the provider, not moved"
	case st.Status == ledger.StateProcessing && st.Completed:
		return "completed as processing: the provider accepted it and money may still move; the reconciler records its final answer"
	case st.Status == ledger.StateProcessing && maybeCharged:
		return "in flight, maybe charged: a provider call may have charged without its answer reaching us; the next holder or the reconciler asks the provider before charging again"
	case st.Status == ledger.StateProcessing:
		return "in flight: a worker holds it, or a redelivery takes it up"
	case st.Status == ledger.StateRetrying:
		return "not charged: the last attempt failed (last error below). A redelivery of its message tries again; if the message was dead-lettered (max_deliveries, provider_rejected), it waits for an operator: see the dead letters on the overview"
	}
	return string(st.Status)
}

// recordState says what a row's status means for the payment, from what
// the row knows.
func recordState(rec ledger.Record) string {
	words := stateWords(ledger.StateOf(nil, &rec, nil), rec.Status == ledger.StatusPending && rec.MaybeCharged)
	if rec.Status == ledger.StatusCompleted {
		words += ": the provider's outcome is below"
	}
	return words
}

func viewRecord(rec ledger.Record) *recordView {
	v := &recordView{Record: rec, Response: redact.ShownBody(rec.Response), State: recordState(rec)}
	v.Record.RequestHash, v.Record.Response = nil, nil
	for _, f := range []*string{&v.MerchantID, &v.IdempotencyKey, &v.ProviderKey, &v.Currency, &v.LockedBy, &v.ChargeID, &v.LastError, &v.TraceID} {
		*f = shown(*f)
	}
	v.Status = ledger.Status(shown(string(v.Status)))
	return v
}

func viewPayment(p ledger.Payment) *ledger.Payment {
	for _, f := range []*string{&p.MerchantID, &p.IdempotencyKey, &p.ProviderKey, &p.ChargeID, &p.Status, &p.Currency} {
		*f = shown(*f)
	}
	return &p
}

func (c *Console) payment(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := paymentData{MerchantID: strings.TrimSpace(q.Get("merchant")), IdempotencyKey: q.Get("key")}
	p := c.page(r, "payment lookup", nil)
	if d.MerchantID != "" || d.IdempotencyKey != "" {
		d.Searched = true
		ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
		defer cancel()
		var recp *ledger.Record
		var payp *ledger.Payment
		rec, err := c.store.Get(ctx, d.MerchantID, d.IdempotencyKey)
		switch {
		case errors.Is(err, ledger.ErrNotFound):
			d.NoRecord = true
		case err != nil:
			p.Errors = append(p.Errors, "idempotency row: "+err.Error())
		default:
			d.Record, recp = viewRecord(rec), &rec
		}
		pay, err := c.store.GetPayment(ctx, d.MerchantID, d.IdempotencyKey)
		switch {
		case errors.Is(err, ledger.ErrNotFound):
			d.NoLedger = true
		case err != nil:
			p.Errors = append(p.Errors, "ledger row: "+err.Error())
		default:
			d.Ledger, payp = viewPayment(pay), &pay
			if d.NoRecord {
				d.State = stateWords(ledger.StateOf(nil, nil, &pay), false)
			}
		}
		if c.cfg.Lifecycles != nil && (recp != nil || payp != nil) {
			if l, err := c.cfg.Lifecycles.Lifecycle(ctx, d.MerchantID, d.IdempotencyKey); err != nil {
				p.Errors = append(p.Errors, "captures, cancels and refunds: "+err.Error())
			} else {
				d.Life = viewLife(ledger.StateOf(nil, recp, payp), l)
			}
		}
	}
	// The form shows back what was searched for, masked like the rest.
	d.MerchantID, d.IdempotencyKey = shown(d.MerchantID), shown(d.IdempotencyKey)
	p.Data = d
	c.render(w, http.StatusOK, "payment.html", p)
}

// ---------------------------------------------------------------------------
// Replay

type replayData struct {
	Seqs      []uint64
	Report    dlq.ReplayReport
	Confirmed bool
}

// replay is POST /replay with seq=N (repeated) or one=N: without confirm=yes it is a
// dry run that shows what would happen and asks for the confirmation; with
// it, the replay itself.
func (c *Console) replay(w http.ResponseWriter, r *http.Request) {
	if why := c.readOnlyReason(); why != "" {
		c.refuse(w, r, http.StatusForbidden, why)
		return
	}
	if err := r.ParseForm(); err != nil {
		c.refuse(w, r, http.StatusBadRequest, "unreadable form")
		return
	}
	if !c.auth.checkCSRF(r, r.PostForm.Get("csrf")) {
		c.refuse(w, r, http.StatusForbidden, "the form's CSRF token is missing or wrong: reload the page and try again")
		return
	}
	// A letter's own button sends one=N, and replays it alone whatever
	// else is ticked; "Replay selected" sends the ticked seq=N.
	raw := r.PostForm["seq"]
	if one := r.PostForm.Get("one"); one != "" {
		raw = []string{one}
	}
	var seqs []uint64
	for _, s := range raw {
		seq, err := strconv.ParseUint(s, 10, 64)
		if err != nil || seq == 0 {
			c.refuse(w, r, http.StatusBadRequest, fmt.Sprintf("%q is not a dead-letter sequence", s))
			return
		}
		seqs = append(seqs, seq)
	}
	if len(seqs) == 0 {
		c.refuse(w, r, http.StatusBadRequest, "no dead letter selected")
		return
	}
	confirmed := r.PostForm.Get("confirm") == "yes"
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout+time.Duration(float64(len(seqs))/c.cfg.ReplayRate*float64(time.Second)))
	defer cancel()
	rep, err := dlq.Replay(ctx, c.js, c.cfg.Stream, dlq.ReplayOptions{
		Seqs: seqs, DryRun: !confirmed, KeyRetention: c.cfg.KeyRetention, Rate: c.cfg.ReplayRate,
	})
	if err != nil {
		c.refuse(w, r, http.StatusServiceUnavailable, err.Error())
		return
	}
	for i := range rep.Results {
		res := &rep.Results[i]
		for _, f := range []*string{&res.Reason, &res.MerchantID, &res.IdempotencyKey, &res.Subject, &res.MsgID, &res.Detail} {
			*f = shown(*f)
		}
	}
	if confirmed {
		c.log.Info("dead letters replayed from the console", "requested", len(seqs), "replayed", rep.Replayed,
			"skipped", rep.Skipped, "refused", rep.Refused, "not_found", rep.NotFound, "failed", rep.Failed)
	}
	title := "confirm replay"
	if confirmed {
		title = "replay done"
	}
	c.render(w, http.StatusOK, "replay.html", c.page(r, title, replayData{Seqs: seqs, Report: rep, Confirmed: confirmed}))
}

var funcs = template.FuncMap{
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"ago": func(now, t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return now.Sub(t).Round(time.Second).String()
	},
	"dash":    func(s string) string { return cmp.Or(s, "-") },
	"outcome": func(o dlq.ReplayOutcome) string { return strings.ReplaceAll(string(o), "_", " ") },
}

// Serve serves the console on ln until ctx ends, then lets requests in
// flight finish for a few seconds.
func (c *Console) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: c.Handler(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 15 * time.Second,
		WriteTimeout: 2 * time.Minute, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10,
		ErrorLog: slog.NewLogLogger(c.log.Handler(), slog.LevelWarn)}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("serve console: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("stop console: %w", err)
	}
	<-done
	return nil
}

// Loopback reports whether a listen address is on loopback only
// ("127.0.0.1:8089", "[::1]:0", "localhost:8089"); an empty host (every
// interface) is not.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
