package ledger

import "time"

// Intake is the HTTP gateway's guard row for one (merchant, key): it makes
// one request out of many concurrent first requests the publisher of the
// command. The worker's claim in idempotency_keys comes later, after the
// message is consumed, so until then this row is what concurrent requests
// meet. It is not a claim: the worker never reads it, and a command
// published twice is still charged once (the claim decides).
type Intake struct {
	MerchantID     string
	IdempotencyKey string
	RequestHash    []byte
	Amount         int64
	Currency       string
	// Attempt fences publishers: each takeover adds one.
	Attempt int
	// LockedUntil is, while publishing, the end of the publisher's lease;
	// once published, when a retry that still finds no idempotency record
	// may publish again.
	LockedUntil time.Time
	PublishedAt time.Time // zero until the PubAck was received
	// StreamSeq is the stream sequence of the published copy (its PubAck);
	// 0 until published.
	StreamSeq uint64
	CreatedAt time.Time
	ExpiresAt time.Time
	// DeadLetterReason is set once the worker dead-lettered the published
	// copy: the intake is then terminal until it expires. DeadLetterError
	// is the dead letter's error text.
	DeadLetterReason string
	DeadLetterError  string
	DeadLetteredAt   time.Time
	// OperatorReason is set once the worker dead-lettered a copy of the
	// key for an operator (provider_rejected, max_deliveries...): not
	// final, a replay may still charge it. OperatorError is the letter's
	// error text, OperatorAt when it was filed (database time): the
	// payment waits for an operator while its record has not changed
	// since (WaitsForOperator).
	OperatorReason string
	OperatorError  string
	OperatorAt     time.Time
}

// Published reports whether the command was published (PubAck received).
func (in Intake) Published() bool { return !in.PublishedAt.IsZero() }

// DeadLettered reports whether the worker dead-lettered the published copy.
func (in Intake) DeadLettered() bool { return in.DeadLetterReason != "" }

// WaitsForOperator reports whether the payment waits for an operator: a
// copy of it was dead-lettered for an operator and no worker has claimed
// the key since. rec is the key's record, nil when it has none. A
// completed record, or one changed after the letter (a replay was
// claimed), shows its own state.
func (in Intake) WaitsForOperator(rec *Record) bool {
	if in.OperatorReason == "" || in.DeadLettered() {
		return false
	}
	if rec == nil {
		return true
	}
	return rec.Status != StatusCompleted && !rec.UpdatedAt.After(in.OperatorAt)
}

// IntakeOutcome is what the gateway store's AcquireIntakes found.
type IntakeOutcome int

// Intake outcomes.
const (
	// IntakeAcquired: the caller is the publisher (the row was new, expired,
	// or its lock had passed).
	IntakeAcquired IntakeOutcome = iota + 1
	// IntakeHeld: another request is publishing, or published recently.
	IntakeHeld
	// IntakeMismatch: the key is held for a different request fingerprint.
	IntakeMismatch
	// IntakeDeadLettered: the worker dead-lettered this request's published
	// command; the answer is final (Intake carries the reason).
	IntakeDeadLettered
	// IntakeReadFirst: AcquireNewIntakes left the request alone; it is
	// decided by its API key, record and ledger row first (ReadBatch), then
	// by AcquireIntakes.
	IntakeReadFirst
)

func (o IntakeOutcome) String() string {
	switch o {
	case IntakeAcquired:
		return "acquired"
	case IntakeHeld:
		return "held"
	case IntakeMismatch:
		return "mismatch"
	case IntakeDeadLettered:
		return "dead_lettered"
	case IntakeReadFirst:
		return "read_first"
	}
	return "unknown"
}

// IntakeResult is the result of the gateway store's AcquireIntakes.
type IntakeResult struct {
	Outcome IntakeOutcome
	Intake  Intake
}

// Published is one publish to record with the gateway store's
// IntakesPublished.
type Published struct {
	Intake Intake
	Seq    uint64
}

// BatchReads is what a batch of POSTs reads before it takes its keys in.
type BatchReads struct {
	Active   map[string]string // the active API keys among the hashes, to their merchant
	Records  []Record          // the keys' records that exist (dedup.Store.GetMany)
	Payments []Payment         // the keys' ledger rows that exist (dedup.Store.PaymentsFor)
}

// WorkerPause is what the paused workers report: the cause most of them
// give, since when the earliest of those paused, and how many do.
type WorkerPause struct {
	Cause   string
	Since   time.Time
	Workers int
	// RetryAt is the soonest of those workers' next tries (zero when none
	// says: a worker that predates migration 00019).
	RetryAt time.Time
}
