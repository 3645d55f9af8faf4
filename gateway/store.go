package gateway

import (
	"context"
	"time"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// Records is what the gateway reads of the worker's idempotency store
// (*dedup.Store): a key's record, and the ledger for a key whose record was
// purged, one key at a time or many at once. For a batch of POSTs the
// gateway's Store reads them itself, on the batch's one round trip
// (Store.ReadBatch). The gateway never writes them.
type Records interface {
	Get(ctx context.Context, merchantID, key string) (ledger.Record, error)
	GetPayment(ctx context.Context, merchantID, key string) (ledger.Payment, error)
	GetMany(ctx context.Context, refs []ledger.KeyRef) ([]ledger.Record, error)
}

// Store is the gateway's own store (*pgstore.Store): its intake guard rows,
// taken in a batch of POSTs at a time (see batch.go), the API keys it
// authenticates, and the refunds it shows (read only).
type Store interface {
	GetIntake(ctx context.Context, merchantID, key string) (ledger.Intake, error)
	// IntakeKind is the kind of the operation whose guard row holds the
	// key ("" for a payment's, or one taken in before migration 00031).
	IntakeKind(ctx context.Context, merchantID, key string) (string, error)
	AcquireNewIntakes(ctx context.Context, reqs []ledger.ClaimRequest, apiKeys [][]byte, lease, retention time.Duration) ([]ledger.IntakeResult, error)
	AcquireIntakes(ctx context.Context, reqs []ledger.ClaimRequest, lease, retention time.Duration) ([]ledger.IntakeResult, error)
	ReadBatch(ctx context.Context, hashes [][]byte, refs []ledger.KeyRef) (ledger.BatchReads, error)
	IntakesPublished(ctx context.Context, pubs []ledger.Published, holdFor time.Duration) ([]bool, error)
	IntakePublished(ctx context.Context, in ledger.Intake, seq uint64, holdFor time.Duration) error
	AbandonIntake(ctx context.Context, in ledger.Intake) error
	ReleaseIntake(ctx context.Context, in ledger.Intake) error
	PurgeIntakes(ctx context.Context, limit int) (int, error)
	Authenticate(ctx context.Context, apiKey string) (merchantID string, err error)
	// GetRefund is the worker's row of the refund (merchantID, key), the
	// refund's own key; ledger.ErrNotFound when none was claimed.
	GetRefund(ctx context.Context, merchantID, key string) (ledger.Refund, error)
	// GetPaymentOp is the worker's row of the capture or cancel
	// (merchantID, key), the operation's own key; ledger.ErrNotFound when
	// none was claimed.
	GetPaymentOp(ctx context.Context, merchantID, key string) (ledger.PaymentOp, error)
	// PaymentLife is the status of the payment's ledger row (moved by a
	// capture or a cancel) and what a capture received.
	PaymentLife(ctx context.Context, merchantID, key string) (status string, received int64, err error)
	// RefundsOf lists the refunds of the payment (merchantID, paymentKey),
	// oldest first, the first pgstore.MaxRefundsShown; with how many there
	// are and the amount refunded (succeeded, or pending at the provider),
	// over all of them.
	RefundsOf(ctx context.Context, merchantID, paymentKey string) (refunds []ledger.Refund, total int, refunded int64, err error)
	// RefusalOf is the reason the worker refused the command it consumed
	// at stream sequence seq under (merchantID, key), from its refused
	// outcome event; ok false when there is none.
	RefusalOf(ctx context.Context, merchantID, key string, seq uint64) (reason string, ok bool, err error)
	// WorkerPauses is the pause the workers report now, if any (see
	// consumer.PauseNoter).
	WorkerPauses(ctx context.Context) (ledger.WorkerPause, bool, error)
}

// Completions wakes a waiter when a key may have completed
// (*pgstore.Listener).
type Completions interface {
	Subscribe(merchantID, key string) *ledger.Subscription
}

// Publisher publishes a validated command to the worker's stream.
// stream.CommandPublisher implements it.
type Publisher interface {
	// Check builds the message Publish would publish and decodes it as the
	// worker will; a *payment.ValidationError is why the worker would
	// dead-letter it. extra holds headers to add (trace context).
	Check(cmd *payment.Command, extra map[string]string) error
	// Publish publishes the checked message and returns its stream
	// sequence after the PubAck. republish > 0 numbers a new copy of a
	// command whose first copy the stream no longer holds. An error that
	// wraps stream.ErrRefused is a refusal (nothing stored); any other is
	// an unknown outcome (the command may be stored).
	Publish(ctx context.Context, cmd *payment.Command, extra map[string]string, republish int) (uint64, error)
	// Stored reports whether the stream still holds the command of
	// (merchantID, key) at seq.
	Stored(ctx context.Context, merchantID, key string, seq uint64) (bool, error)
}
