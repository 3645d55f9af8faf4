package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/paydedup/paydedup/budget"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/stream"
)

// Store is what the processor needs from the idempotency store.
type Store interface {
	ClaimBatch(ctx context.Context, holder string, lease time.Duration, reqs []ledger.ClaimRequest) ([]ledger.ClaimResult, error)
	Heartbeat(ctx context.Context, l ledger.Lease, d time.Duration) (ledger.Lease, error)
	Complete(ctx context.Context, l ledger.Lease, c ledger.Completion) error
	CompleteBatch(ctx context.Context, items []ledger.CompleteItem) ([]error, error)
	Fail(ctx context.Context, l ledger.Lease, reason string) (ledger.Status, error)
	Release(ctx context.Context, l ledger.Lease, reason string) error
	// RecordRefusal writes the outcome event of a command the worker
	// refused, once per refused message, and reports whether it wrote it.
	RecordRefusal(ctx context.Context, r ledger.Refusal) (bool, error)
	// ProviderKeyWindow is how long after a key's first claim the store
	// lets its provider call go out blind (without a lookup first).
	ProviderKeyWindow() time.Duration
}

// Charger is what the processor needs from the payment provider.
type Charger interface {
	Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error)
}

// settleTimeout bounds the store writes that record a result; they run even
// when the work context was cancelled by a drain, so an outcome the provider
// gave is not thrown away.
const settleTimeout = 10 * time.Second

// Processor is the business step: claim the key, call the provider with the
// stored provider key, record the outcome. It never sees a message.
type Processor struct {
	store     Store
	charger   Charger
	cfg       Config
	logger    *slog.Logger
	committer *committer
	observer  Observer        // set by NewWorker; NopObserver until then
	calls     *callLimit      // the provider calls in flight: an adaptive limit up to Concurrency
	gate      *gate           // pauses the worker while the provider or PostgreSQL is out
	stop      <-chan struct{} // closed when the worker stops: rate-limited waits end
	work      context.Context // the worker's work context, cancelled by a drain past its deadline; nil without a worker
	waits     rateWaits       // payments waiting for a rate limit or the budget
}

// NewProcessor returns a processor. cfg must have passed Validate.
func NewProcessor(store Store, charger Charger, cfg Config, logger *slog.Logger) *Processor {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg = cfg.WithDefaults()
	return &Processor{store: store, charger: charger, cfg: cfg, logger: logger, observer: NopObserver{},
		committer: newCommitter(store, cfg.CommitBatch, cfg.CommitWait),
		calls:     newCallLimit(cfg.Concurrency, time.Now), gate: newGate(cfg.PauseFirst, cfg.PauseLongest, cfg.Clock.Now)}
}

// Claim claims a batch of commands in one round trip.
func (p *Processor) Claim(ctx context.Context, cmds []*payment.Command) ([]ledger.ClaimResult, error) {
	return p.claim(ctx, cmds, nil)
}

// claim is Claim with the messages' trace ids (nil or one per command).
func (p *Processor) claim(ctx context.Context, cmds []*payment.Command, traceIDs []string) ([]ledger.ClaimResult, error) {
	reqs := make([]ledger.ClaimRequest, len(cmds))
	for i, c := range cmds {
		reqs[i] = ledger.NewClaimRequest(c)
		if traceIDs != nil {
			reqs[i].TraceID = traceIDs[i]
		}
	}
	start := time.Now()
	res, err := p.store.ClaimBatch(ctx, p.cfg.Holder, p.cfg.Lease, reqs)
	if err != nil {
		return nil, fmt.Errorf("claim batch: %w", err)
	}
	p.gate.storeWorks()
	p.observer.Claimed(time.Since(start), len(reqs))
	return res, nil
}

// claimFailed is the result of a message whose batch could not be claimed:
// retried later, and held through the pause when PostgreSQL is unreachable.
func (p *Processor) claimFailed(err error) Result {
	return Result{Kind: Retry, Delay: 2 * time.Second, Err: err, pause: p.gate.storeFailed(err)}
}

// Handle acts on one claim result. Only a claimed or re-acquired key calls
// the provider; progress is called while the call runs (the worker uses it
// to tell JetStream the message is still being worked on).
func (p *Processor) Handle(ctx context.Context, cmd *payment.Command, claim ledger.ClaimResult, progress func()) Result {
	log := p.logger.With("merchant_id", cmd.MerchantID, "idempotency_key", cmd.IdempotencyKey)
	if claim.Outcome == ledger.Claimed || claim.Outcome == ledger.Reacquired {
		log = log.With("attempt", claim.Lease.Attempt)
	}
	var pr progresser
	if progress != nil {
		pr = progressFunc(progress)
	}
	return p.handle(ctx, cmd, claim, pr, log)
}

// progresser is told while a provider call runs; a jetstream.Msg is one
// (InProgress).
type progresser interface{ InProgress() error }

// progressFunc is a func as a progresser.
type progressFunc func()

func (f progressFunc) InProgress() error { f(); return nil }

// handle is Handle for a claim whose log carries the message's attributes
// and, for a claimed or re-acquired key, its attempt.
func (p *Processor) handle(ctx context.Context, cmd *payment.Command, claim ledger.ClaimResult, progress progresser, log *slog.Logger) Result {
	switch claim.Outcome {
	case ledger.Claimed, ledger.Reacquired:
		return p.charge(ctx, cmd, *claim.Lease, progress, log)
	case ledger.Duplicate:
		return Result{Kind: Duplicate, Attempt: claim.Record.Attempts}
	case ledger.InFlight:
		return Result{Kind: InFlight, Delay: claim.RetryIn, Err: errors.New("another worker holds the key's lease")}
	case ledger.Mismatch:
		if claim.FromLedger {
			return Result{Kind: DeadLetter, Reason: stream.ReasonKeyReused,
				Err: errors.New("idempotency key reused with a different payment: the key's record was purged and the ledger's payment under it has another amount or currency")}
		}
		return Result{Kind: DeadLetter, Reason: stream.ReasonKeyReused,
			Err: errors.New("idempotency key reused with a different payment: the request fingerprint differs from the stored one")}
	case ledger.NeedsLookup:
		return Result{Kind: Retry, Delay: claim.RetryIn,
			Err: fmt.Errorf("%s past the provider's key window: only a provider lookup (the reconciler) may resolve it", claim.Record.Status)}
	}
	return Result{Kind: Retry, Err: fmt.Errorf("unexpected claim outcome %v", claim.Outcome)}
}

// charge calls the provider under a held lease and records the outcome, in
// four steps: a call slot under the lease (takeSlot), the provider call
// with its heartbeat (call), what the answer shows of the provider
// (observe), and the outcome's record (record).
func (p *Processor) charge(ctx context.Context, cmd *payment.Command, lease ledger.Lease, progress progresser, log *slog.Logger) Result {
	// No call starts later than this under the claim: the start-up check
	// (NewWorker) allows a claim's calls a lease past it, and no more,
	// inside the provider's key lifetime.
	waitUntil := p.cfg.Clock.Now().Add(p.cfg.MaxWaitUnderLease)
	s, failed, ok := p.takeSlot(ctx, cmd, lease, progress, log, waitUntil)
	defer s.done()
	if !ok {
		return failed
	}
	a := p.call(ctx, cmd, &s, progress, log, waitUntil)
	p.observe(cmd, &a)
	leaseLost := a.beat.stop()
	return p.record(ctx, s.lease, &a, leaseLost, log)
}

// callSlot is a payment's provider call slot, taken under its lease: the
// context and heartbeat its call runs under, the lease as the heartbeat
// left it, and what to undo when the charge ends.
type callSlot struct {
	ctx    context.Context
	cancel context.CancelFunc
	beat   *beater
	lease  ledger.Lease
	undo   []func() // run last first, as defers are
}

// done undoes what taking the slot set up.
func (s *callSlot) done() {
	for i := len(s.undo) - 1; i >= 0; i-- {
		s.undo[i]()
	}
}

// takeSlot starts the call's heartbeat and takes a provider call slot,
// waiting for one under the lease when the slots are held. When the wait
// fails it releases the lease if it still holds it and returns the
// message's result and false.
func (p *Processor) takeSlot(ctx context.Context, cmd *payment.Command, lease ledger.Lease, progress progresser, log *slog.Logger, waitUntil time.Time) (callSlot, Result, bool) {
	// Within ctx's deadline when that comes first (the worker's batch
	// context has it): then no timer of its own.
	callCtx, cancel := context.WithTimeout(ctx, p.callBudget())
	s := callSlot{ctx: callCtx, cancel: cancel, lease: lease, undo: []func(){cancel}}

	// The heartbeat starts before the wait for a call slot, so the lease
	// cannot run out while the payment queues for the provider.
	s.beat = p.heartbeat(callCtx, cancel, lease, progress, log)
	if p.calls.acquire(callCtx, cmd.MerchantID) != nil {
		// The slots are held by calls that wait for the provider's rate
		// limit or the fleet's budget: this payment waits too, under its
		// lease, rather than spend a delivery (see slotUnderLease). Only a
		// drain, a stop, a lost lease or a failed heartbeat end the wait.
		lost := s.beat.stop()
		werr := errLeaseLost
		if !lost {
			s.lease = s.beat.current()
			base, release := p.detach(ctx)
			s.undo = append(s.undo, release)
			werr = p.slotUnderLease(base, &s.lease, cmd.MerchantID, progress, waitUntil)
			if werr == nil {
				s.ctx, s.cancel = context.WithTimeout(base, p.callBudget())
				s.undo = append(s.undo, s.cancel)
				s.beat = p.heartbeat(s.ctx, s.cancel, s.lease, progress, log)
			}
		}
		if werr != nil {
			if !errors.Is(werr, ledger.ErrLeaseLost) && !errors.Is(werr, errLeaseLost) {
				p.release(context.WithoutCancel(ctx), s.lease, "no provider call slot before the deadline", log)
			}
			// PostgreSQL out during the wait: the message is held through
			// the pause, not nakked (no delivery spent), as a completion
			// that failed alike.
			return s, Result{Kind: Retry, Err: fmt.Errorf("wait for a provider call slot: %w", werr), Attempt: s.lease.Attempt,
				pause: p.gate.storeFailed(werr), stopped: errors.Is(werr, errStopping)}, false
		}
	}
	return s, Result{}, true
}

// answer is the provider's answer to a payment's call, and what observe
// reads from it.
type answer struct {
	out      *provider.Outcome
	err      error
	start    time.Time // when the call started
	beat     *beater   // the heartbeat of the last call under the lease
	storeErr error     // a heartbeat's failure that ended a rate-limited wait

	outage string          // set by observe: the pause cause the call shows, if any
	down   bool            // set by observe: the call ended unavailable
	rl     *provider.Error // set by observe: still rate-limited
}

// call calls the provider in slot s, waits out its rate limit under the
// lease, and frees the slot with what the call taught the limit.
func (p *Processor) call(ctx context.Context, cmd *payment.Command, s *callSlot, progress progresser, log *slog.Logger, waitUntil time.Time) answer {
	callCtx, lease := s.ctx, s.lease
	start := time.Now()
	req := provider.ChargeRequest{
		ProviderKey:    lease.ProviderKey,
		MerchantID:     cmd.MerchantID,
		IdempotencyKey: cmd.IdempotencyKey,
		Amount:         cmd.Amount,
		Currency:       cmd.Currency,
		PaymentMethod:  cmd.PaymentMethod,
		Description:    cmd.Description,
		Metadata:       providerMetadata(cmd.Metadata, lease.TraceID),
		// The kind the claim stored (in its provider key) decides, as
		// it decides for whoever resolves the row later.
		ManualCapture: ledger.KindOfProviderKey(lease.ProviderKey) == payment.KindAuthorize,
	}
	// The time the budget held the call back (its waits for a token, the
	// backoff after its refusals) is recorded apart: it is not the
	// provider's latency, which the limit learns from.
	waits := budget.WithWaitRecorder(callCtx)
	out, err := provider.ChargeWithRetry(waits, p.charger, req, p.cfg.ProviderTry)
	// The limit learns from the first call alone: a rate-limited wait
	// below is the budget's, not the provider's latency.
	budgetWait := budget.Waited(waits)
	took, signal := time.Since(start)-budgetWait, signalOf(callCtx, err)
	s.cancel()
	if budgetWait > 0 {
		p.calls.heldBack(budgetWait)
	}
	beat := s.beat
	var storeErr error // a heartbeat's failure that ended a rate-limited wait
	if err != nil && provider.RateLimitOf(err) != nil {
		p.calls.heldBack(-1)
		// The payment keeps its call slot while it waits: the provider
		// asks for fewer requests, and a slot freed would only send
		// another payment into the same limit.
		out, err, beat, storeErr = p.rateLimited(ctx, beat, req, err, progress, log, waitUntil)
	}
	p.calls.release(took, signal)
	return answer{out: out, err: err, start: start, beat: beat, storeErr: storeErr}
}

// observe tells the pause gate and the observer what the answer shows of
// the provider and the API key, and notes it in a.
func (p *Processor) observe(cmd *payment.Command, a *answer) {
	err := a.err
	result := "charged"
	switch {
	case err != nil:
		result = provider.ClassOf(err).String()
	case a.out.Declined:
		result = "declined"
	case a.out.Processing:
		result = "processing"
	case a.out.Authorized:
		result = "authorized"
	}
	// Any answer from the provider but a refusal shows the key works again;
	// only one that is not "unavailable" shows the provider works. A call
	// that ended unavailable counts towards an outage (see OutageAnswers).
	a.down = providerUnavailable(err)
	a.rl = provider.RateLimitOf(err)
	if a.rl != nil {
		// Still rate-limited: the wait ended without a call (a stop, a
		// drain, a heartbeat that failed). A rate limit shows neither an
		// outage nor a working provider; only the key works.
		if a.rl.HTTPStatus != 0 {
			p.gate.keyWorks()
		}
	} else {
		a.outage = p.gateAnswer(cmd, err, a.down)
	}
	p.observer.ProviderCalled(time.Since(a.start), result)
}

// gateAnswer tells the pause gate what a provider call of cmd that ended
// with err (nil: an answer; down: providerUnavailable(err)) and no rate
// limit shows, and returns the pause it causes: provider_unavailable when
// the call makes (or finds) an outage, "" otherwise.
func (p *Processor) gateAnswer(cmd *payment.Command, err error, down bool) string {
	switch {
	case err == nil:
		p.gate.answered()
	case down:
		if answeredNotRefused(err) {
			p.gate.keyWorks()
		}
		if p.gate.unavailable(cmd.MerchantID+":"+cmd.IdempotencyKey, err) {
			return PauseProviderUnavailable
		}
	case answeredNotRefused(err):
		p.gate.answered()
	}
	return ""
}

// providerAnswered is the pause gate's path for a provider call of any
// kind of command but the charge's (whose call observe and recordFailure
// tell): it tells the gate what the call, ended with err (nil: an
// answer), shows, and returns the Result's pause (provider_auth for a
// refused API key, provider_unavailable for an outage) and unavailable
// (the call ended as the outage rule counts, providerUnavailable). A
// result carrying them is probed on its last delivery and held through
// the pause as a charge's is (Worker.outlast), instead of spending its
// deliveries.
func (p *Processor) providerAnswered(cmd *payment.Command, err error) (pause string, unavailable bool) {
	if rl := provider.RateLimitOf(err); rl != nil {
		// The account's budget speaking: no outage, the key works.
		if rl.HTTPStatus != 0 {
			p.gate.keyWorks()
		}
		return "", false
	}
	if err != nil && provider.ClassOf(err) == provider.ClassUnauthorized {
		p.gate.close(PauseProviderAuth, err)
		return PauseProviderAuth, false
	}
	down := providerUnavailable(err)
	return p.gateAnswer(cmd, err, down), down
}

// record writes the answer's outcome under the lease and returns the
// message's result. The writes must happen even if ctx was cancelled by a
// drain, and all of them within settleTimeout from here. The context with
// that deadline is made only where a write uses it: a completion hands the
// deadline to the group commit, whose leader alone makes one per batch
// (the others wait for its flush), rather than a timer per payment. The
// group commit does not see ctx's cancellation either.
func (p *Processor) record(ctx context.Context, lease ledger.Lease, a *answer, leaseLost bool, log *slog.Logger) Result {
	deadline := time.Now().Add(settleTimeout)
	if a.err == nil {
		return p.recordCharge(ctx, deadline, lease, a.out, log)
	}
	sctx, scancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer scancel()
	return p.recordFailure(sctx, lease, a, leaseLost, log)
}

// recordCharge completes the key with the provider's outcome.
func (p *Processor) recordCharge(ctx context.Context, deadline time.Time, lease ledger.Lease, out *provider.Outcome, log *slog.Logger) Result {
	c := ledger.CompletionFor(ledger.KindOfProviderKey(lease.ProviderKey), out, ledger.SummaryIfNoBody)
	cerr := p.committer.Complete(ctx, deadline, lease, c)
	switch {
	case cerr == nil:
		p.gate.storeWorks()
		res := Result{Kind: Completed, Attempt: lease.Attempt}
		if out.Declined {
			res.Kind = Declined
		}
		// Attrs, not key-value pairs: no string is put in an interface.
		log.LogAttrs(ctx, slog.LevelInfo, "payment completed", slog.String("charge_id", out.ChargeID), slog.Bool("declined", out.Declined),
			slog.Bool("processing", c.Processing), slog.Bool("authorized", c.Authorized), slog.String("decline_code", out.DeclineCode), slog.Bool("replayed", out.Replayed))
		return res
	case errors.Is(cerr, ledger.ErrLeaseLost):
		// Another holder took over; it calls with the same provider key,
		// gets this same outcome replayed, and completes the row.
		log.Warn("lease lost before completing; the new holder will record the outcome", "charge_id", out.ChargeID)
		return Result{Kind: Retry, Delay: time.Second, Err: cerr, Attempt: lease.Attempt}
	}
	sctx, scancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer scancel()
	switch {
	case errors.Is(cerr, ledger.ErrLedgerConflict):
		log.Error("ledger conflict: provider charge already recorded under another key", "charge_id", out.ChargeID, "error", cerr)
		p.release(sctx, lease, cerr.Error(), log)
		return Result{Kind: DeadLetter, Reason: stream.ReasonLedgerConflict, Err: cerr, Attempt: lease.Attempt}
	default:
		// The provider charged but we could not record it. The row stays
		// pending; the redelivery re-calls with the same key and gets the
		// outcome replayed.
		log.Error("could not record the outcome; the redelivery will replay it", "charge_id", out.ChargeID, "error", cerr)
		p.release(sctx, lease, cerr.Error(), log)
		return Result{Kind: Retry, Err: cerr, Attempt: lease.Attempt, pause: p.gate.storeFailed(cerr)}
	}
}

// recordFailure records a call that ended without an outcome, by the
// error's class, on sctx (settleTimeout, no cancellation).
func (p *Processor) recordFailure(sctx context.Context, lease ledger.Lease, a *answer, leaseLost bool, log *slog.Logger) Result {
	err, rl, outage, down := a.err, a.rl, a.outage, a.down
	if leaseLost {
		return Result{Kind: Retry, Delay: time.Second, Err: fmt.Errorf("lease lost during the provider call: %w", err), Attempt: lease.Attempt}
	}
	if rl != nil {
		// Not executed, but the row is neither failed (nothing about the
		// payment failed) nor left leased (the worker lets it go): released
		// for the next delivery, which calls under the same provider key.
		p.release(sctx, lease, err.Error(), log)
		log.Info("provider rate limit outlasted the wait; released for a redelivery", "reason", rl.RateLimitReason, "error", err)
		// A heartbeat that found PostgreSQL out holds the message through
		// the pause rather than spend its delivery.
		return Result{Kind: Retry, Delay: rl.RetryAfter, Err: err, Attempt: lease.Attempt, pause: p.gate.storeFailed(a.storeErr), stopped: p.stopping()}
	}
	res := Result{Attempt: lease.Attempt}
	var perr *provider.Error
	errors.As(err, &perr)
	switch provider.ClassOf(err) {
	case provider.ClassMismatch:
		p.release(sctx, lease, err.Error(), log)
		return Result{Kind: DeadLetter, Reason: stream.ReasonProviderMismatch, Err: err, Attempt: lease.Attempt}
	case provider.ClassRejected:
		// Not charged (the provider refused the request), so the row may
		// become failed: a replay after someone fixed the cause re-acquires
		// it. But it is no decline, and no retry of the same request helps.
		if _, ferr := p.store.Fail(sctx, lease, err.Error()); ferr != nil {
			log.Warn("could not record a rejected request", "error", ferr)
		}
		log.Error("provider rejected the request; dead-lettered for a person", "error", err)
		return Result{Kind: DeadLetter, Reason: stream.ReasonProviderRejected, Err: err, Attempt: lease.Attempt}
	case provider.ClassUnauthorized:
		// The API key is bad or revoked: every payment would fail alike.
		// Not charged; the worker stops fetching for a while (readiness
		// fails) rather than fail or dead-letter the stream.
		if _, ferr := p.store.Fail(sctx, lease, err.Error()); ferr != nil {
			log.Warn("could not record a refused API key", "error", ferr)
		}
		pause := p.gate.close(PauseProviderAuth, err)
		log.Error("provider refused the API key; pausing consumption", "error", err, "pause", pause.String())
		return Result{Kind: Retry, Delay: pause, Err: err, Attempt: lease.Attempt, pause: PauseProviderAuth}
	case provider.ClassRetryable:
		status, ferr := p.store.Fail(sctx, lease, err.Error())
		if ferr != nil {
			log.Warn("could not record a known-not-charged failure", "error", ferr)
		}
		res.Kind, res.Err, res.pause, res.unavailable = Retry, err, outage, down
		if perr != nil {
			res.Delay = perr.RetryAfter
		}
		log.Info("provider refused the charge before processing; will retry", "status", status, "error", err)
		return res
	default: // unknown outcome: it may have charged
		p.release(sctx, lease, err.Error(), log)
		log.Warn("provider outcome unknown; row left pending for a redelivery or the reconciler", "error", err)
		return Result{Kind: Retry, Err: err, Attempt: lease.Attempt, pause: outage, unavailable: down}
	}
}

// Prober is the optional part of a Charger that asks the provider about a
// key without moving money; every provider.Provider is one (Lookup). The
// worker asks it on a message's last delivery, after a provider call that
// ended unavailable, to tell an outage from the message's own failure. A
// Charger without it is never asked: the message runs out of deliveries.
type Prober interface {
	Lookup(ctx context.Context, req provider.LookupRequest) (provider.LookupResult, error)
}

// providerDown asks the provider, without charging, what it has under
// cmd's key, and reports whether that call too ended unavailable (a 429,
// a 5xx, no answer): then the provider, not this payment, is failing, and
// the worker pauses (cause provider_unavailable) as for an outage of many
// keys. Any other answer shows the provider working. It also returns the
// probe's error; false, nil when the charger cannot be asked.
func (p *Processor) providerDown(ctx context.Context, cmd *payment.Command) (bool, error) {
	prober, ok := p.charger.(Prober)
	if !ok {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ProviderTry.AttemptTimeout)
	defer cancel()
	_, err := prober.Lookup(ctx, provider.LookupRequest{MerchantID: cmd.MerchantID, IdempotencyKey: cmd.IdempotencyKey,
		Amount: cmd.Amount, Currency: cmd.Currency})
	switch {
	case err == nil:
		p.gate.answered()
	case probeUnanswered(err):
		if answeredNotRefused(err) {
			p.gate.keyWorks()
		}
		p.gate.close(PauseProviderUnavailable, err)
		return true, err
	case answeredNotRefused(err):
		p.gate.answered()
	}
	return false, err
}

// probeUnanswered reports whether a probe's error shows the provider
// failing (providerUnavailable) rather than answering. A lookup's own
// verdicts (a foreign intent, several charges under one key) carry neither
// a status nor a transport error: they are answers.
func probeUnanswered(err error) bool {
	var perr *provider.Error
	if !providerUnavailable(err) || !errors.As(err, &perr) {
		return false
	}
	return perr.HTTPStatus != 0 || (perr.Err != nil && !errors.Is(perr.Err, provider.ErrForeignIntent))
}

// answeredNotRefused reports whether err is an answer of the provider
// other than a refusal of the API key. (Apart from charge, so that the
// target errors.As needs is not allocated on every call.)
func answeredNotRefused(err error) bool {
	var perr *provider.Error
	return errors.As(err, &perr) && perr.HTTPStatus != 0 && perr.Class != provider.ClassUnauthorized
}

func (p *Processor) release(ctx context.Context, lease ledger.Lease, reason string, log *slog.Logger) {
	if err := p.store.Release(ctx, lease, reason); err != nil && !errors.Is(err, ledger.ErrLeaseLost) {
		log.Warn("could not release the lease; it will expire", "error", err)
	}
}

// callBudget is how long a provider call may take under a held lease,
// from the wait for a call slot to the last retry: the lease less a tenth.
func (p *Processor) callBudget() time.Duration { return p.cfg.Lease - p.cfg.Lease/10 }

// heartbeat extends the lease and reports progress every third of the
// lease while the provider call runs. If the lease is lost it cancels the
// call: another holder now owns the key. Its stop ends it and reports
// whether the lease was lost; it waits for a heartbeat under way.
//
// A timer, not a goroutine with a ticker: almost every call ends long before
// the first beat, and a goroutine, a ticker and its channel per payment
// would be allocated for nothing. Its state is one
// struct, not variables captured one by one by closures.
func (p *Processor) heartbeat(ctx context.Context, cancel context.CancelFunc, lease ledger.Lease, progress progresser, log *slog.Logger) *beater {
	h := &beater{p: p, ctx: ctx, cancel: cancel, lease: lease, progress: progress, log: log, every: p.cfg.Lease / 3}
	h.mu.Lock()
	h.t = time.AfterFunc(h.every, h.beat)
	h.mu.Unlock()
	return h
}

// beater is one payment's heartbeat (see Processor.heartbeat).
type beater struct {
	p        *Processor
	ctx      context.Context
	cancel   context.CancelFunc
	progress progresser
	log      *slog.Logger
	every    time.Duration

	mu      sync.Mutex // held by a beat while it runs
	lease   ledger.Lease
	stopped bool
	lost    bool
	t       *time.Timer
}

func (h *beater) beat() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped || h.ctx.Err() != nil {
		return
	}
	if h.progress != nil {
		_ = h.progress.InProgress()
	}
	l, err := h.p.extend(h.ctx, h.lease)
	switch {
	case errors.Is(err, ledger.ErrLeaseLost):
		h.log.Warn("lease lost during the provider call; cancelling it")
		h.lost = true
		h.cancel()
		return
	case err != nil:
		h.log.Warn("lease heartbeat failed", "error", err)
	default:
		h.lease = l
	}
	h.t.Reset(h.every)
}

// extend extends lease by a lease from now. A drain or a stop does not
// cut the statement short, only its own bound (a third of the lease): a
// statement cut off after the database ran it can commit after the
// release that follows, and hold the key from the next worker for a
// lease, which spends its deliveries on in-flight naks.
func (p *Processor) extend(ctx context.Context, lease ledger.Lease) (ledger.Lease, error) {
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.Lease/3)
	defer cancel()
	return p.store.Heartbeat(hctx, lease, p.cfg.Lease)
}

// current is the lease as the last heartbeat left it.
func (h *beater) current() ledger.Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lease
}

// markLost records a lease found lost after the beat stopped.
func (h *beater) markLost() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lost = true
}

func (h *beater) stop() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
	h.t.Stop()
	return h.lost
}

// providerMetadata is the command's metadata plus the trace id stored with
// the claim. It must be identical on every call under one provider key: the
// provider compares a replayed request's parameters with the first.
func providerMetadata(md map[string]string, traceID string) map[string]string {
	if traceID == "" {
		return md
	}
	out := make(map[string]string, len(md)+1)
	for k, v := range md {
		out[k] = v
	}
	out[MetadataTraceID] = traceID
	return out
}
