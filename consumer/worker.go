package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/stream"
)

// fetchWait is how long an idle fetch waits for a message. It bounds how
// long a stop takes to be noticed.
const fetchWait = time.Second

// reserveGather is how long a saturated worker (fewer than half a fetch
// batch of slots free) waits for settling messages to free more before it
// fetches: fewer, bigger claims (see reserve).
const reserveGather = time.Millisecond

// A failed fetch is retried after fetchRetryBase, doubling up to
// fetchRetryMax while failures continue.
const (
	fetchRetryBase = 100 * time.Millisecond
	fetchRetryMax  = 3 * time.Second
)

// Observer receives what the worker does; metrics implement it. A nil
// Observer observes nothing. An observer that wants only some of the
// events embeds NopObserver and implements those.
type Observer interface {
	// Settled reports one message's result and fate.
	Settled(kind Kind, action Action)
	// InFlight moves the count of payments in their provider call and commit.
	InFlight(delta int)
	// Claimed reports one batch claim: its duration and size.
	Claimed(d time.Duration, n int)
	// Committed reports one group commit: its duration and size.
	Committed(d time.Duration, n int)
	// ProviderCalled reports one ChargeWithRetry: its duration and result
	// ("charged", "declined", or the provider.Class name of the error).
	ProviderCalled(d time.Duration, result string)
}

// NopObserver observes nothing. Embed it in an Observer to implement only
// the methods it needs.
type NopObserver struct{}

// Settled implements Observer.
func (NopObserver) Settled(Kind, Action) {}

// InFlight implements Observer.
func (NopObserver) InFlight(int) {}

// Claimed implements Observer.
func (NopObserver) Claimed(time.Duration, int) {}

// Committed implements Observer.
func (NopObserver) Committed(time.Duration, int) {}

// ProviderCalled implements Observer.
func (NopObserver) ProviderCalled(time.Duration, string) {}

// LatencyObserver is an optional extension of Observer: it also receives
// how long each message took from its fetch to its settling.
type LatencyObserver interface {
	SettledIn(kind Kind, d time.Duration)
}

// Worker is the JetStream adapter around a Processor: it fetches batches,
// decodes and validates, claims each batch in one round trip, runs provider
// calls under an adaptive limit (up to Concurrency), and acks, naks or
// dead-letters each message by decide. Run it once.
type Worker struct {
	cfg      Config
	nc       *nats.Conn
	js       jetstream.JetStream
	proc     *Processor
	logger   *slog.Logger
	observer Observer
	tracer   trace.Tracer
	tracing  bool // SetTracer was called: spans are made per message
	prop     propagation.TextMapPropagator
	intake   IntakeMarker

	draining  atomic.Bool
	lanes     *laneManager    // nil when cfg.Lanes is 0
	openLanes atomic.Int64    // lanes open at the manager's last pass
	gather    time.Duration   // reserve's wait when saturated; 0: reserveGather
	stop      <-chan struct{} // closed when Run's context ends: held messages are let go
}

// NewWorker validates cfg and returns a worker on the connection, reporting
// to obs (nil observes nothing). intake is told of the final dead letters of
// commands the gateway published (see IntakeMarker); nil where no gateway
// publishes on the stream. Spans are created with the global-free tracer set by SetTracer;
// without one, a no-op tracer costs nothing.
func NewWorker(nc *nats.Conn, proc *Processor, cfg Config, logger *slog.Logger, obs Observer, intake IntakeMarker) (*Worker, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("worker configuration: %w", err)
	}
	if err := stream.ValidateDLQKey(cfg.Stream.DLQKey); err != nil {
		return nil, fmt.Errorf("worker configuration: %w", err)
	}
	// A claim taken at the end of the key window may call the provider up to
	// MaxWaitUnderLease later (waiting for a call slot or a rate limit), and
	// that call may last a lease: it must still meet a provider that
	// remembers the key, or it charges a second time.
	if w := proc.store.ProviderKeyWindow(); w+cfg.Lease+proc.cfg.MaxWaitUnderLease >= provider.KeyLifetime {
		return nil, fmt.Errorf("worker configuration: the provider key window %v plus the lease %v plus the max wait under lease %v must stay under the provider's key lifetime %v, or a call made late in the window can meet a provider that forgot the key and charge again: shorten the window, the lease or the max wait under lease", w, cfg.Lease, proc.cfg.MaxWaitUnderLease, provider.KeyLifetime)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if obs == nil {
		obs = NopObserver{}
	}
	proc.observer = obs
	proc.committer.observer = obs
	return &Worker{cfg: cfg, nc: nc, js: js, proc: proc, logger: logger, observer: obs,
		tracer: noop.NewTracerProvider().Tracer("paydedup"), prop: traceContext, intake: intake}, nil
}

// SetPropagator sets how the worker reads a message's trace context from
// its headers (OTEL_PROPAGATORS); W3C traceparent alone by default. Call it
// before Run.
func (w *Worker) SetPropagator(p propagation.TextMapPropagator) {
	if p != nil {
		w.prop = p
	}
}

// SetTracer makes the worker create a span per message with tp, as a child
// of the message's traceparent, and a span for each claim and each group
// commit. Call it before Run.
func (w *Worker) SetTracer(tp trace.TracerProvider) {
	w.tracer = tp.Tracer("github.com/paydedup/paydedup/consumer")
	w.tracing = true
	w.proc.committer.tracer, w.proc.committer.tracing = w.tracer, true
}

// Draining reports whether the worker has stopped fetching to shut down.
func (w *Worker) Draining() bool { return w.draining.Load() }

// Run sets up the streams and the consumer, then processes messages until
// ctx is cancelled. Then it drains: it stops fetching, lets in-flight work
// finish within DrainTimeout, cancels what is still running (those rows are
// released and their messages nakked, never acked), and returns nil.
func (w *Worker) Run(ctx context.Context) error {
	payments, cons, err := stream.EnsureStreams(ctx, w.js, w.cfg.Stream)
	if err != nil {
		return err
	}
	if eff := payments.CachedInfo().Config.Duplicates; eff != w.cfg.Stream.DuplicateWindow {
		// EnsureStreams only widens the window: another worker's is wider.
		w.logger.Info("the payments stream keeps a wider duplicate window than this worker's; working with the stream's",
			"duplicate_window", eff.String(), "configured", w.cfg.Stream.DuplicateWindow.String())
		w.cfg.Stream.DuplicateWindow = eff
	}
	trimDone := make(chan struct{})
	go func() {
		defer close(trimDone)
		runStreamTrimmer(ctx, w.js, w.cfg, w.logger)
	}()
	defer func() { <-trimDone }()
	netDone := make(chan struct{})
	go func() {
		defer close(netDone)
		op, _ := w.intake.(OperatorMarker)
		_ = RunMaxDeliveriesNet(ctx, w.js, w.cfg, w.logger, op, w.proc.store)
	}()
	defer func() { <-netDone }()
	notesDone := make(chan struct{})
	go func() {
		defer close(notesDone)
		w.notePauses(ctx)
	}()
	defer func() { <-notesDone }()

	// Work runs on its own context: a stop must not cut a provider call
	// short before the drain deadline.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	// Slots bound the messages between fetch and settle; the processor's
	// call limit bounds the provider calls among them (it adapts, up to
	// Concurrency). The extra slots keep claims and commits of other
	// messages overlapping with the calls, so the call limit does not idle
	// while a batch is claimed or committed. MaxAckPending caps them
	// consumer-wide anyway. Below its ceiling, the limit's own line of
	// waiting payments (waitRoom) holds back the fetches.
	slots := make(chan struct{}, min(w.cfg.Concurrency+2*w.cfg.FetchBatch, max(w.cfg.Stream.MaxAckPending, w.cfg.Concurrency)))
	var wg sync.WaitGroup
	run := newRunner()
	// After the drain below: every task given to the runner has finished.
	defer run.stop()

	w.stop = ctx.Done()
	w.proc.stop = w.stop
	w.proc.work = workCtx
	if w.cfg.Lanes > 0 {
		w.lanes = newLaneManager(w.js, w.cfg, w.logger)
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.runLanes(ctx, workCtx, &wg, run)
		}()
	}
	fetchFailures := 0
	pausedFor := ""
	w.logger.Info("worker started", "stream", w.cfg.Stream.Name, "consumer", w.cfg.Stream.Durable, "holder", w.cfg.Holder,
		"concurrency", w.cfg.Concurrency, "concurrency_floor", w.proc.calls.floor, "lease", w.cfg.Lease.String())
	for ctx.Err() == nil {
		if wait, opened := w.proc.gate.fetchWait(); wait > 0 {
			// The provider refused our API key, or the provider or
			// PostgreSQL is out: fetching would only fail every payment
			// the same way, and spend its deliveries.
			if cause, err, _, held, _ := w.proc.gate.state(); cause != pausedFor {
				pausedFor = cause
				w.logger.Warn("worker paused; not fetching", "cause", cause, "error", errString(err), "held", held, "retry_in", wait.String())
			}
			// The pause is on the worker's clock, as the gate's are.
			t := clock.NewTimer(w.cfg.Clock, wait)
			select {
			case <-ctx.Done():
			case <-opened:
			case <-t.C():
			}
			t.Stop()
			continue
		}
		if pausedFor != "" {
			if cause, _, _, _, _ := w.proc.gate.state(); cause == "" {
				w.logger.Info("worker resumed", "cause", pausedFor)
				pausedFor = ""
			}
		}
		w.proc.calls.waitRoom(ctx, 2*w.cfg.FetchBatch)
		n := w.reserve(ctx, slots)
		if n == 0 {
			break
		}
		msgs, err := w.fetch(ctx, cons, n)
		for range n - len(msgs) {
			<-slots
		}
		if err != nil && ctx.Err() == nil && len(msgs) == 0 {
			// NATS is down or reconnecting: back off instead of spinning.
			fetchFailures++
			wait := min(fetchRetryBase<<min(fetchFailures-1, 5), fetchRetryMax)
			w.logger.Warn("fetch failed; retrying", "error", err, "retry_in", wait.String())
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			continue
		}
		fetchFailures = 0
		if len(msgs) > 0 {
			// The batch is claimed while the next one is fetched: claims
			// are round trips, and pipelining them keeps Postgres busy.
			// The slots bound how much is in flight.
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.handleBatch(workCtx, msgs, slots, &wg, run, false)
			}()
		}
	}

	w.draining.Store(true)
	w.logger.Info("draining", "timeout", w.cfg.DrainTimeout.String())
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(w.cfg.DrainTimeout):
		w.logger.Warn("drain deadline reached; cancelling in-flight work (rows released, messages nakked)")
		cancelWork()
		<-done
	}
	w.logger.Info("worker stopped")
	return nil
}

// reserve takes at least one free slot (waiting for it) and as many more as
// are free, up to the fetch batch. It returns 0 when ctx ends first.
//
// When fewer than half a batch (or half of all the slots, if fewer) are
// free, the worker is saturated (its slots held by messages being claimed,
// charged or committed): reserve then waits up to reserveGather for
// settling messages to free more, so that it claims fewer, bigger batches
// (each claim statement has a fixed cost in PostgreSQL; see
// docs/performance.md). An idle or lightly loaded worker has its slots
// free and never waits here.
func (w *Worker) reserve(ctx context.Context, slots chan struct{}) int {
	select {
	case slots <- struct{}{}:
	case <-ctx.Done():
		return 0
	}
	n := 1
	// Half a batch, or half of all the slots there are (MaxAckPending may
	// be smaller than a batch): never a wait for slots that cannot exist.
	half := min(w.cfg.FetchBatch, cap(slots)) / 2
	var gather <-chan time.Time
	for n < w.cfg.FetchBatch {
		select {
		case slots <- struct{}{}:
			n++
			continue
		default:
		}
		if n >= half {
			return n
		}
		if gather == nil {
			t := time.NewTimer(cmp.Or(w.gather, reserveGather))
			defer t.Stop()
			gather = t.C
		}
		select {
		case slots <- struct{}{}:
			n++
		case <-gather:
			return n
		case <-ctx.Done():
			return n
		}
	}
	return n
}

// fetch returns up to n messages: what is there at once, or else the first
// to arrive within fetchWait and what is there right after it.
func (w *Worker) fetch(ctx context.Context, cons jetstream.Consumer, n int) ([]jetstream.Msg, error) {
	collect := func(b jetstream.MessageBatch, err error) ([]jetstream.Msg, error) {
		if err != nil {
			return nil, err
		}
		var out []jetstream.Msg
		for m := range b.Messages() {
			out = append(out, m)
		}
		if err := b.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
			return out, err
		}
		return out, nil
	}
	msgs, err := collect(cons.FetchNoWait(n))
	if err != nil || len(msgs) > 0 || ctx.Err() != nil {
		return msgs, err
	}
	msgs, err = collect(cons.Fetch(1, jetstream.FetchMaxWait(fetchWait)))
	if err != nil || len(msgs) == 0 || n == 1 {
		return msgs, err
	}
	more, err := collect(cons.FetchNoWait(n - 1))
	return append(msgs, more...), err
}

// inbound is one fetched message on its way through the batch.
type inbound struct {
	msg     jetstream.Msg
	meta    *jetstream.MsgMetadata
	cmd     *payment.Command
	log     msgLog          // set once the claim's outcome is known
	ctx     context.Context // carries the message's span
	span    trace.Span      // nil when tracing is off
	traceID string
	fetched time.Time
	lane    bool // fetched from a lane: settled by settleLane
}

// handleBatch decodes the batch, dead-letters bad input, claims the rest in
// one round trip, settles duplicates and in-flight keys at once, and hands
// claimed keys to the pool (run). Every message's slot is freed when it
// settles; wg counts the work in flight for the drain. Lane messages
// (onLane) are never held through a pause nor probed on a last delivery:
// settleLane leaves those to the shared consumer.
//
// Its stages are named methods: decodeBatch, claimBatch, holdUnclaimed
// (the claim failed) and dispatch (the claim's outcomes).
func (w *Worker) handleBatch(workCtx context.Context, msgs []jetstream.Msg, slots chan struct{}, wg *sync.WaitGroup, run *runner, onLane bool) {
	// The batch's messages derive their contexts from one batch context,
	// cancelled with the work context (a drain past its deadline) or when
	// the last of them settles. Deriving each from the work context itself
	// made every provider call register with, and leave, one map shared by
	// all the messages in flight, under its lock.
	//
	// Its deadline is the batch's provider calls' (Processor.charge gives
	// a call a lease less a tenth), counted from the fetch, before the
	// claim takes the leases: so each call's context has the batch's
	// deadline and no timer of its own. The claim has the same bound;
	// settling runs without it (batchRefs.settle).
	fetched := time.Now()
	ctx, cancel := context.WithDeadline(workCtx, fetched.Add(w.proc.callBudget()))
	b := &batchStages{workCtx: workCtx, refs: newBatchRefs(ctx, cancel, wg), slots: slots, run: run, onLane: onLane}
	defer b.refs.release()

	good := w.decodeBatch(ctx, b, msgs, fetched)
	good = w.refunds(b, good)
	if len(good) == 0 {
		return
	}
	claims, err := w.claimBatch(ctx, good)
	if err != nil {
		w.holdUnclaimed(b, good, err)
		return
	}
	w.dispatch(b, good, claims)
}

// batchStages is what the stages of one batch share (see handleBatch).
type batchStages struct {
	workCtx context.Context // the worker's: a hold outlives the batch
	refs    *batchRefs
	slots   chan struct{} // one taken per message; freed when it settles
	run     *runner
	onLane  bool
}

// spawn hands f to the pool as work of the batch.
func (b *batchStages) spawn(f func()) {
	b.refs.add()
	b.run.do(task{run: f, batch: b.refs})
}

// decodeBatch reads the batch's messages, starts their spans, and settles
// at once (dead-letters) those that do not decode. It returns the others,
// in place in one slice from here: their loggers, and the work handed to
// the runner, point to them.
func (w *Worker) decodeBatch(ctx context.Context, b *batchStages, msgs []jetstream.Msg, fetched time.Time) []inbound {
	refs, slots := b.refs, b.slots
	good := make([]inbound, 0, len(msgs))
	for _, m := range msgs {
		meta, err := m.Metadata()
		if err != nil {
			// Not a JetStream message: nothing to ack. Cannot happen on a
			// pull consumer; logged so it would be seen.
			w.logger.Error("message without JetStream metadata", "subject", m.Subject(), "error", err)
			<-slots
			continue
		}
		good = append(good, inbound{msg: m, meta: meta, fetched: fetched, lane: b.onLane})
		in := &good[len(good)-1]
		in.ctx, in.traceID = extractTrace(ctx, w.prop, m.Headers())
		if w.tracing {
			in.ctx, in.span = w.tracer.Start(in.ctx, "paydedup.payment", trace.WithSpanKind(trace.SpanKindConsumer),
				trace.WithAttributes(attribute.Int64("messaging.message.stream_seq", int64(meta.Sequence.Stream)),
					attribute.Int64("messaging.message.deliveries", int64(meta.NumDelivered))))
		}
		cmd, err := w.decode(m)
		if err != nil {
			in.log.init(w.logger, meta, in.traceID, nil, 0)
			var ve *payment.ValidationError
			reason := string(payment.ReasonMalformedJSON)
			if errors.As(err, &ve) {
				reason = string(ve.Reason)
			}
			w.settle(refs, in, Result{Kind: DeadLetter, Reason: reason, Err: err})
			<-slots
			good = good[:len(good)-1]
			continue
		}
		in.cmd = cmd
	}
	return good
}

// refunds hands the batch's commands that act on a payment (refunds,
// captures, cancels: claimsAlone) to the pool, each claimed on its own
// (Processor.runAlone: its claim locks the payment), probed on its last
// delivery and held through an outage as a charge is (outlast), and
// returns the other messages, for the batch's one claim. Those stay in
// place in good, which is not changed after.
func (w *Worker) refunds(b *batchStages, good []inbound) []inbound {
	n := 0
	for i := range good {
		if claimsAlone(good[i].cmd) {
			n++
		}
	}
	if n == 0 {
		return good
	}
	rest := make([]inbound, 0, len(good)-n)
	for i := range good {
		in := &good[i]
		if !claimsAlone(in.cmd) {
			rest = append(rest, *in)
			continue
		}
		in.log.init(w.logger, in.meta, in.traceID, in.cmd, 0)
		b.spawn(func() {
			defer func() { <-b.slots }()
			res := w.proc.runAlone(in.ctx, in.cmd, in.log.logger())
			w.settle(b.refs, in, w.outlast(b.workCtx, in, res, b.onLane))
		})
	}
	return rest
}

// claimBatch claims the decoded messages' keys in one round trip, under
// one span.
func (w *Worker) claimBatch(ctx context.Context, good []inbound) ([]ledger.ClaimResult, error) {
	cmds := make([]*payment.Command, len(good))
	traces := make([]string, len(good))
	for i := range good {
		cmds[i], traces[i] = good[i].cmd, good[i].traceID
	}
	claimCtx, claimSpan := w.startClaimSpan(ctx, good)
	claims, err := w.proc.claim(claimCtx, cmds, traces)
	if err != nil {
		claimSpan.SetStatus(codes.Error, err.Error())
	}
	claimSpan.End()
	return claims, err
}

// holdUnclaimed settles the messages of a batch whose claim failed: held
// through the pause when PostgreSQL is unreachable (never a lane's),
// nakked otherwise.
func (w *Worker) holdUnclaimed(b *batchStages, good []inbound, err error) {
	refs, slots, workCtx := b.refs, b.slots, b.workCtx
	res := w.proc.claimFailed(err)
	if res.pause != "" {
		w.logger.Error("claim failed: PostgreSQL unreachable; messages held until it answers", "batch", len(good), "error", err)
	} else {
		w.logger.Error("claim failed; messages will be redelivered", "batch", len(good), "error", err)
	}
	for i := range good {
		in := &good[i]
		in.log.init(w.logger, in.meta, in.traceID, in.cmd, 0)
		if res.pause == "" || b.onLane {
			w.settle(refs, in, res)
			<-slots
			continue
		}
		b.spawn(func() {
			defer func() { <-slots }()
			w.settle(refs, in, w.hold(workCtx, in, res))
		})
	}
}

// dispatch acts on each message's claim: a duplicate settles here, an
// in-flight key (and any other unclaimed one) settles in the pool, and a
// claimed key's charge runs in the pool, then its last delivery is probed
// and it is held through an outage (never a lane's).
func (w *Worker) dispatch(b *batchStages, good []inbound, claims []ledger.ClaimResult) {
	refs, slots, workCtx, onLane := b.refs, b.slots, b.workCtx, b.onLane
	for i := range good {
		in, claim := &good[i], &claims[i]
		// A claimed key's logger carries its attempt (see Processor.handle).
		claimed, attempt := claim.Outcome == ledger.Claimed || claim.Outcome == ledger.Reacquired, 0
		if claimed {
			attempt = claim.Lease.Attempt
		}
		in.log.init(w.logger, in.meta, in.traceID, in.cmd, attempt)
		if claim.Outcome == ledger.Duplicate {
			// A duplicate's ack is not waited for (settle): settle it here,
			// without a goroutine of its own.
			w.settle(refs, in, w.proc.handle(in.ctx, in.cmd, *claim, nil, in.log.logger()))
			<-slots
			continue
		}
		if !claimed {
			// In-flight keys and the rest settle at once, concurrently:
			// a dead letter is a round trip to the server.
			b.spawn(func() {
				defer func() { <-slots }()
				w.settle(refs, in, w.proc.handle(in.ctx, in.cmd, *claim, nil, in.log.logger()))
			})
			continue
		}
		w.observer.InFlight(1)
		b.spawn(func() {
			defer func() { <-slots }()
			// The message itself reports progress: no closure per payment.
			res := w.proc.handle(in.ctx, in.cmd, *claim, in.msg, in.log.logger())
			w.observer.InFlight(-1)
			w.settle(refs, in, w.outlast(workCtx, in, res, onLane))
		})
	}
}

// outlast is the path every kind's result takes to its settling: a last
// delivery that ended unavailable is probed (lastDelivery), and a result
// an outage cut short (its pause set) is held through the pause (hold)
// instead of spending the message's deliveries. Never on a lane:
// settleLane leaves those to the shared consumer.
func (w *Worker) outlast(workCtx context.Context, in *inbound, res Result, onLane bool) Result {
	if onLane {
		return res
	}
	res = w.lastDelivery(workCtx, in, res)
	if res.held() {
		res = w.hold(workCtx, in, res)
	}
	return res
}

// startClaimSpan starts the span of a batch's one claim: a child of the
// first message's span, linked to the others' spans, each of which links
// back to it (a batch shares one claim, so only one trace can hold it).
func (w *Worker) startClaimSpan(ctx context.Context, good []inbound) (context.Context, trace.Span) {
	first := good[0].span
	if first == nil || !first.IsRecording() {
		return ctx, noop.Span{} // its End and SetStatus do nothing
	}
	links := make([]trace.Link, 0, len(good)-1)
	for _, in := range good[1:] {
		links = append(links, trace.Link{SpanContext: in.span.SpanContext()})
	}
	ctx, span := w.tracer.Start(trace.ContextWithSpan(ctx, first), "paydedup.claim", trace.WithLinks(links...),
		trace.WithAttributes(attribute.Int("messaging.batch.message_count", len(good))))
	for _, in := range good[1:] {
		in.span.AddLink(trace.Link{SpanContext: span.SpanContext()})
	}
	return ctx, span
}

// decode reads the command from a message (stream.DecodeCommand).
func (w *Worker) decode(m jetstream.Msg) (*payment.Command, error) {
	return stream.DecodeCommand(w.cfg.Stream, m.Subject(), m.Headers(), m.Data())
}

// settle carries out decide's verdict on one message of batch b. It runs
// on b's settle context, which carries no cancellation: settling must
// happen even when the work context was cancelled. A confirmed ack waits
// under b.ackContext; a dead letter's round trips share one deadline,
// settleTimeout from here.
func (w *Worker) settle(b *batchRefs, in *inbound, res Result) {
	if in.lane {
		w.settleLane(in, res)
		return
	}
	base := b.settle
	act := decide(res, in.meta.NumDelivered, w.cfg.Stream.MaxDeliver, w.cfg.RetryBase, w.cfg.RetryMax)
	// The logger with the attempt is made when something is logged: a
	// With per payment for a debug line that is usually off.
	logger := func() *slog.Logger {
		if res.Attempt > 0 && in.log.h.attempt == 0 {
			return in.log.l.With("attempt", res.Attempt)
		}
		return in.log.logger()
	}
	debug := in.log.l.Enabled(base, slog.LevelDebug)
	// A context with a deadline is made only for the round trips that wait
	// (DoubleAck, the dead letter), not for an Ack or a Nak.
	switch act.Kind {
	case Ack:
		if res.Kind == Duplicate {
			// The outcome was committed long before this copy came: an ack
			// lost on the way only brings another copy, acked the same way.
			// So no round trip to confirm it, which made a completed
			// duplicate cost a request and its reply.
			if err := in.msg.Ack(); err != nil {
				logger().Warn("ack of a duplicate failed; the redelivery will be acked as a duplicate", "error", err)
			}
			if debug {
				logger().Debug("message acked", "result", res.Kind.String())
			}
			break
		}
		sctx, cancel := b.ackContext()
		err := in.msg.DoubleAck(sctx)
		cancel()
		if err != nil {
			// The outcome is committed: the redelivery finds it and acks.
			logger().Warn("ack not confirmed; the redelivery will be acked as a duplicate", "error", err)
		}
		if debug {
			logger().Debug("message acked", "result", res.Kind.String())
		}
	case Nak:
		delay := act.Delay + time.Duration(rand.Int64N(int64(act.Delay)/5+1))
		if err := in.msg.NakWithDelay(delay); err != nil {
			logger().Warn("nak failed; the message will be redelivered after AckWait", "error", err)
		}
		if debug {
			logger().Debug("message nakked", "result", res.Kind.String(), "delay", delay.String(), "error", errString(res.Err))
		}
	case DeadLetterTerm:
		sctx, cancel := context.WithDeadline(base, time.Now().Add(settleTimeout))
		defer cancel()
		log := logger()
		if again, ok := w.requeueLast(sctx, in, act, res, log); ok {
			act = again
			break
		}
		errForDLQ := res.Err
		if act.Reason == stream.ReasonMaxDeliveries && res.Kind != DeadLetter {
			errForDLQ = fmt.Errorf("last allowed delivery (%d) ended %s: %v", in.meta.NumDelivered, res.Kind, res.Err)
		}
		d := stream.Letter{
			Reason: act.Reason, Err: errForDLQ, OrigSubject: in.msg.Subject(), OrigStream: in.meta.Stream,
			OrigSeq: in.meta.Sequence.Stream, Deliveries: in.meta.NumDelivered,
			Header: in.msg.Headers(), Data: in.msg.Data(), FailedAt: w.cfg.Clock.Now(),
		}
		if err := fileDeadLetter(sctx, w.js, w.cfg.Stream, d); err != nil {
			// Never drop: leave the message to be redelivered.
			log.Error("dead-letter publish failed; message nakked instead", "reason", act.Reason, "error", err)
			_ = in.msg.NakWithDelay(w.cfg.RetryBase)
			return
		}
		// A refusal's outcome event, before the term: a message whose
		// event is not written is settled by recordRefusal (held through
		// PostgreSQL's outage, or left to be redelivered).
		if !w.recordRefusal(sctx, b, in, act, res, d, log) {
			return
		}
		w.termLetter(sctx, in, act.Reason, errForDLQ, log)
	}
	w.settled(in, res, act)
}

// termLetter terms a message whose dead letter is filed, erases it from
// its stream when it holds card data, and tells the gateway's intake.
func (w *Worker) termLetter(ctx context.Context, in *inbound, reason string, cause error, log *slog.Logger) {
	if err := in.msg.Term(); err != nil {
		log.Warn("term failed after dead-lettering; a redelivery would be filed again and deduplicated", "error", err)
	}
	if reason == string(payment.ReasonCardData) {
		w.eraseCardData(ctx, in, log)
	}
	w.deadLetteredIntake(ctx, in, reason, cause, log)
	log.Warn("message dead-lettered", "reason", reason, "error", errString(cause))
}

// settled reports a message settled by act to the observer and ends its
// span.
func (w *Worker) settled(in *inbound, res Result, act Action) {
	w.observer.Settled(res.Kind, act)
	if lo, ok := w.observer.(LatencyObserver); ok {
		lo.SettledIn(res.Kind, time.Since(in.fetched))
	}
	if in.span != nil {
		in.span.SetAttributes(attribute.String("paydedup.result", res.Kind.String()), attribute.String("paydedup.action", act.Kind.String()))
		if act.Kind == DeadLetterTerm {
			in.span.SetStatus(codes.Error, act.Reason)
		}
		in.span.End()
	}
}

// requeueLast publishes a message again, as a new message with deliveries
// of its own (publishAgain), when its last delivery ended without an
// outcome (a 429, a 5xx, a lease held by another worker, an unknown
// outcome: nothing about the payment itself) and it was published again
// fewer than NetRequeues times: the deliveries before may have been spent
// by workers killed holding it, and max_deliveries is for a message that
// fails alone, which it still is after NetRequeues copies. On success the
// original is termed (Requeue). When the publish's outcome is unknown the
// message is nakked: the server gives up on it and the max-deliveries net
// publishes it again under the same id. ok is false when the message is
// to be dead-lettered as act says.
func (w *Worker) requeueLast(ctx context.Context, in *inbound, act Action, res Result, log *slog.Logger) (Action, bool) {
	if act.Reason != stream.ReasonMaxDeliveries || res.Kind == DeadLetter || in.meta == nil {
		return act, false
	}
	requeues, ok := requeuesOf(in.msg.Headers())
	next, done := requeues+1, "last allowed delivery ended "+res.Kind.String()+"; published again"
	switch {
	case res.held():
		// Held through an outage until the worker stopped: the outage, no
		// fault of the message, spent its deliveries. Published again
		// without counting a requeue, it waits in the stream for the
		// outage's end instead of being filed max_deliveries.
		next, done = requeues, "last allowed delivery held through an outage until the worker stopped; published again"
	case res.stopped:
		// Waiting under its lease (a rate limit, a call slot) when the
		// worker stopped: the stop ended it, not the payment.
		next, done = requeues, "last allowed delivery waiting under its lease until the worker stopped; published again"
	case !ok || requeues >= w.cfg.NetRequeues:
		return act, false
	}
	switch publishAgain(ctx, w.js, w.cfg, in.msg.Subject(), in.msg.Headers(), in.msg.Data(), in.meta.Sequence.Stream, next, log, done) {
	case requeued:
		if err := in.msg.Term(); err != nil {
			log.Warn("term failed after publishing the message again; the server gives up on it after AckWait and the net's copy is a duplicate", "error", err)
		}
		return Action{Kind: Requeue}, true
	case requeueUnknown:
		_ = in.msg.NakWithDelay(w.cfg.RetryBase)
		return Action{Kind: Nak, Delay: w.cfg.RetryBase}, true
	}
	return act, false
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
