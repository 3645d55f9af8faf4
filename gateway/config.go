package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
)

// Defaults for Config.
const (
	DefaultMaxHeaderBytes    = 16 << 10
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 15 * time.Second
	DefaultRequestTimeout    = 10 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
	// DefaultMaxWait is the longest Prefer: wait honoured; longer asks are
	// cut to it (RFC 7240 lets a server apply less than preferred).
	DefaultMaxWait = 30 * time.Second
	// DefaultPublishLease is how long a request holds the intake while it
	// publishes; a request that died while publishing is taken over after it.
	DefaultPublishLease = 10 * time.Second
	// DefaultRepublishAfter is how long after a publish a retry that still
	// finds no idempotency record answers 409 without looking further. After
	// it, the retry asks the stream whether it still holds the published
	// copy, and publishes again (with a new Nats-Msg-Id) only when it does
	// not.
	DefaultRepublishAfter = 10 * time.Minute
	// DefaultIntakeRetention keeps intake rows as long as keys are kept.
	DefaultIntakeRetention = ledger.DefaultRetention
	// DefaultQueuedRetryAfter is the Retry-After of a key that is published
	// but not yet claimed by a worker.
	DefaultQueuedRetryAfter = time.Second
	DefaultDrainTimeout     = 20 * time.Second
	// DefaultPoolSize is the PostgreSQL pool "paydedup gateway" opens
	// unless DATABASE_URL sets pool_max_conns: a connection for each of
	// the Flushers batches, and as many again for what runs beside them
	// (GETs, API key look-ups on a cache miss, the purge, the Prefer: wait
	// reads).
	DefaultPoolSize      = 2*DefaultFlushers + 8
	DefaultPurgeInterval = time.Minute
	purgeBatch           = 1000
)

// Defaults of the batched intake.
const (
	DefaultBatchSize   = 128
	DefaultBatchWindow = time.Millisecond
	DefaultFlushers    = 4
	DefaultQueueSize   = 4096
	// DefaultMerchantShare is the fraction of the queue one merchant may
	// fill; beyond it its requests are 429 while others still get in.
	DefaultMerchantShare = 0.5
)

// Config configures a Gateway. Zero values take the defaults.
type Config struct {
	// Limits bound a command (body size, largest amount), as in the worker.
	Limits payment.Limits

	MaxHeaderBytes    int
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration // reading the whole request
	// RequestTimeout bounds the work of one request, not counting a
	// Prefer: wait; the write deadline is RequestTimeout + MaxWait + 5 s.
	RequestTimeout time.Duration
	IdleTimeout    time.Duration
	MaxWait        time.Duration

	PublishLease     time.Duration
	RepublishAfter   time.Duration
	IntakeRetention  time.Duration
	QueuedRetryAfter time.Duration

	// BatchSize bounds the POSTs one batch takes in; BatchWindow is how
	// long a batch waits for one more while another batch is being
	// settled (with none, a batch is cut at once: a lone POST is never
	// held for the window); Flushers is how many batches are settled at
	// once (each holds one database connection while it runs).
	BatchSize   int
	BatchWindow time.Duration
	Flushers    int
	// QueueSize bounds the POSTs waiting for a batch: beyond it they are
	// shed with 503. MerchantShare is the fraction of the queue one
	// merchant may fill: beyond it its POSTs are 429.
	QueueSize     int
	MerchantShare float64

	// AuthFailures is how many failed authentications a source address
	// (IPv4, or an IPv6 /64) may make at once, earned back over
	// AuthFailureWindow; beyond them its requests are 429 with Retry-After,
	// without an API key look-up. Negative turns the throttle off (behind
	// a proxy every client has the proxy's address).
	AuthFailures      int
	AuthFailureWindow time.Duration
	// MaxConns bounds the open connections; one more is answered 503 and
	// closed at once.
	MaxConns int

	// DrainTimeout bounds a graceful shutdown: in-flight requests finish
	// (waiters answer 202 at once), then connections are closed.
	DrainTimeout  time.Duration
	PurgeInterval time.Duration

	// Clock tells the time for Retry-After; the system clock when nil.
	Clock      clock.Clock
	Logger     *slog.Logger
	Registerer prometheus.Registerer // nil: metrics go to a private registry
	// TracerProvider makes a server span per request (otelhttp), whose
	// context the published command carries to the worker; nil makes none,
	// and the client's own trace context travels on unchanged.
	TracerProvider trace.TracerProvider
	// Webhooks, with a Verifier, serves POST /v1/stripe/webhooks.
	Webhooks Webhooks
	// Propagator reads a request's trace context and writes the command's
	// (OTEL_PROPAGATORS); W3C trace context when nil.
	Propagator propagation.TextMapPropagator
	// Idle, when set, says whether commands wait with no worker taking
	// them (stream.Idle), and since when the workers were last seen: GET
	// then says so in a waiting payment's delay (DelayNoWorker). Asked at
	// most once a second, and only when no worker reports a pause.
	Idle func(ctx context.Context) (idle bool, since time.Time, err error)
}

// WithDefaults returns c with every zero value replaced by its default.
func (c Config) WithDefaults() Config {
	c.MaxHeaderBytes = cmp.Or(c.MaxHeaderBytes, DefaultMaxHeaderBytes)
	c.ReadHeaderTimeout = cmp.Or(c.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	c.ReadTimeout = cmp.Or(c.ReadTimeout, DefaultReadTimeout)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, DefaultRequestTimeout)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, DefaultIdleTimeout)
	c.MaxWait = cmp.Or(c.MaxWait, DefaultMaxWait)
	c.PublishLease = cmp.Or(c.PublishLease, DefaultPublishLease)
	c.RepublishAfter = cmp.Or(c.RepublishAfter, DefaultRepublishAfter)
	c.IntakeRetention = cmp.Or(c.IntakeRetention, DefaultIntakeRetention)
	c.QueuedRetryAfter = cmp.Or(c.QueuedRetryAfter, DefaultQueuedRetryAfter)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, DefaultDrainTimeout)
	c.PurgeInterval = cmp.Or(c.PurgeInterval, DefaultPurgeInterval)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.BatchWindow = cmp.Or(c.BatchWindow, DefaultBatchWindow)
	c.Flushers = cmp.Or(c.Flushers, DefaultFlushers)
	c.QueueSize = cmp.Or(c.QueueSize, DefaultQueueSize)
	c.MerchantShare = cmp.Or(c.MerchantShare, DefaultMerchantShare)
	c.AuthFailures = cmp.Or(c.AuthFailures, DefaultAuthFailures)
	c.AuthFailureWindow = cmp.Or(c.AuthFailureWindow, DefaultAuthFailureWindow)
	c.MaxConns = cmp.Or(c.MaxConns, DefaultMaxConns)
	if c.Limits.MaxBodyBytes <= 0 {
		c.Limits.MaxBodyBytes = payment.DefaultMaxBodyBytes
	}
	if c.Limits.MaxAmount <= 0 {
		c.Limits.MaxAmount = payment.DefaultMaxAmount
	}
	if c.Clock == nil {
		c.Clock = clock.System{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports contradictions, naming the setting.
func (c Config) Validate() error {
	var errs []error
	for name, d := range map[string]time.Duration{
		"read header timeout": c.ReadHeaderTimeout, "read timeout": c.ReadTimeout, "request timeout": c.RequestTimeout,
		"idle timeout": c.IdleTimeout, "max wait": c.MaxWait, "publish lease": c.PublishLease,
		"republish after": c.RepublishAfter, "intake retention": c.IntakeRetention,
		"queued retry after": c.QueuedRetryAfter, "drain timeout": c.DrainTimeout, "purge interval": c.PurgeInterval,
	} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %v", name, d))
		}
	}
	if c.MaxHeaderBytes < 1<<10 {
		errs = append(errs, fmt.Errorf("max header bytes must be at least 1 KiB, got %d", c.MaxHeaderBytes))
	}
	if c.MaxWait > 5*time.Minute {
		errs = append(errs, fmt.Errorf("max wait %v is longer than any client or proxy waits", c.MaxWait))
	}
	if c.RepublishAfter < c.PublishLease {
		errs = append(errs, fmt.Errorf("republish after %v must be at least the publish lease %v", c.RepublishAfter, c.PublishLease))
	}
	if c.BatchSize < 1 || c.BatchSize > 10000 || c.Flushers < 1 || c.QueueSize < 1 {
		errs = append(errs, fmt.Errorf("batch size (1..10000, got %d), flushers (got %d) and queue size (got %d) must be at least 1",
			c.BatchSize, c.Flushers, c.QueueSize))
	}
	if c.BatchWindow < 0 || c.BatchWindow > time.Second {
		errs = append(errs, fmt.Errorf("batch window must be within 0..1s, got %v", c.BatchWindow))
	}
	if c.MerchantShare <= 0 || c.MerchantShare > 1 {
		errs = append(errs, fmt.Errorf("merchant share must be within (0, 1], got %v", c.MerchantShare))
	}
	if c.AuthFailures > 100000 {
		errs = append(errs, fmt.Errorf("auth failures must be at most 100000, got %d", c.AuthFailures))
	}
	if c.AuthFailureWindow < time.Second || c.AuthFailureWindow > 24*time.Hour {
		errs = append(errs, fmt.Errorf("auth failure window must be within 1s..24h, got %v", c.AuthFailureWindow))
	}
	if c.MaxConns < 1 || c.MaxConns > 1000000 {
		errs = append(errs, fmt.Errorf("max conns must be within 1..1000000, got %d", c.MaxConns))
	}
	if c.Webhooks.Verifier != nil && c.Webhooks.Ledger == nil {
		errs = append(errs, errors.New("webhooks need the ledger they settle"))
	}
	if c.IntakeRetention <= c.RepublishAfter {
		errs = append(errs, fmt.Errorf("intake retention %v must exceed republish after %v", c.IntakeRetention, c.RepublishAfter))
	}
	return errors.Join(errs...)
}

// Webhooks configures POST /v1/stripe/webhooks. With a nil Verifier (no
// STRIPE_WEBHOOK_SECRET) the route is not served: it is a 404 like any
// unknown path, and nothing unsigned reaches the ledger.
type Webhooks struct {
	Verifier EventVerifier
	Ledger   Ledger
}

// EventVerifier verifies a provider's signed webhook event and reads it
// (*stripe.WebhookVerifier). Its errors wrap provider.ErrBadSignature when
// the event is not the provider's.
type EventVerifier interface {
	// CheckSignature refuses a signature header that no body could make
	// verify (malformed, ambiguous, outside the tolerance): it runs before
	// the body is read.
	CheckSignature(signature string) error
	// Verify checks the body against the header and reads the event; it
	// parses nothing before the signature verifies.
	Verify(payload []byte, signature string) (provider.Event, error)
}

// Ledger is what the webhook reads and writes of the payments ledger
// (*dedup.Store): a key's payment, and the one transition of a processing
// payment to its outcome, the statement the reconciler settles with; a
// refund the provider held pending settled to succeeded only
// (SettleRefundSucceeded reports whether this call settled it and the
// refund's status after it; ledger.ErrNotFound when the ledger has no
// such refund): an event is a hint, and only the reconciler's lookup may
// fail a refund and free its amount.
type Ledger interface {
	GetPayment(ctx context.Context, merchantID, key string) (ledger.Payment, error)
	SettlePayment(ctx context.Context, p ledger.Payment, status string, responseStatus int, response json.RawMessage) error
	SettleRefundSucceeded(ctx context.Context, merchantID, key string, c ledger.RefundCompletion) (settled bool, status string, err error)
	// RequestRefundRecheck stamps a succeeded refund for the reconciler
	// to look up again (an event says the provider failed it).
	RequestRefundRecheck(ctx context.Context, merchantID, key, refundID string) (requested bool, status string, err error)
	// GetRefund is the refund (merchantID, key); ledger.ErrNotFound when
	// none was claimed.
	GetRefund(ctx context.Context, merchantID, key string) (ledger.Refund, error)
	// RequestCancelRecheck stamps an authorized payment for the
	// reconciler to retrieve its intent (an event says the provider
	// canceled it): only the reconciler's lookup may record it canceled.
	RequestCancelRecheck(ctx context.Context, merchantID, key, chargeID string) (requested bool, status string, err error)
}
