package gateway

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// The batched intake: every POST is taken in by it, and concurrent POSTs
// are taken in together, the way the worker group-commits its completions.
// Each request, once validated, joins a bounded queue; a collector cuts the
// queue into batches and each batch is settled with one statement per step
// for all its keys. A batch takes what is queued, up to BatchSize; while
// another batch is being settled (taken in and published, not yet
// answered) it waits for more until BatchWindow passes without one, and
// when none is, it is cut at once: a lone POST is not held for the window,
// and under load the batches grow behind the ones being settled, as in a
// group commit. The first takes in every request that only
// its intake row can decide, in one round trip: its API key re-checked (a
// revoked key is refused by the next batch), no record and no ledger row
// for its key (AcquireNewIntakes). The others (retries of keys the worker
// has seen, a second request for a key in the batch, a key no longer
// active) have their API keys, records and ledger rows read in one round
// trip, which decide them or leave them to AcquireIntakes. Then every
// acquired command is published at once (each PubAck awaited), and the
// publishes recorded in one statement. Each request waits for the batch
// that covers it; the rules that decide it are functions the Prefer: wait
// reads and GET share (fromRecord, fate). A 202 is sent once its PubAck is
// in, before the publishes are recorded: nothing decides on that record
// (a failed one is only logged), a retry meanwhile finds the intake held
// by its publish lease as it would find it held by the republish hold
// after it, and the flush, which holds its slot until the record commits,
// ends before the gateway's Serve returns.
//
// A full queue is answered 503 and a merchant over its share of it 429,
// both with Retry-After, at once: the gateway sheds load instead of letting
// requests time out.

// item is one POST waiting in the batched intake.
type item struct {
	cmd     *payment.Command
	fp      []byte
	extra   map[string]string
	checked *stream.Checked // the message Check built, or nil
	keyHash []byte          // the API key's, re-checked by the batch
	rec     *ledger.Record  // the key's record, when readThenAcquire found one
	log     *slog.Logger
	done    chan answer // buffered: the batch never blocks on a request
	ans     answer
	sent    bool // ans is sent on done
	// readFirst: the batch decides it by reading its API key, record and
	// ledger row before taking it in (readThenAcquire).
	readFirst bool
}

// answer sends the item its answer, once; an item still undecided is
// answered 503. Only the flush that holds the item calls it.
func (it *item) answer() {
	if it.sent {
		return
	}
	if it.ans.kind == ansPending {
		it.ans.kind = ansUnavailable
	}
	it.sent = true
	it.done <- it.ans
}

const (
	// overloadRetryAfter is the Retry-After of a shed request.
	overloadRetryAfter = time.Second
	maxCachedAPIKeys   = 10000
)

// Shedding errors of the batched intake.
var (
	errQueueFull    = errors.New("intake queue full")
	errMerchantBusy = errors.New("merchant over its share of the intake queue")
)

// batcher is the batched intake.
type batcher struct {
	g       *base
	store   Store
	records Records
	queue   chan *item
	slots   chan struct{} // one per batch being flushed
	share   int           // most queued requests of one merchant
	running atomic.Bool
	keys    keyCache
	// settling counts the batches cut whose 202s are not yet sent (a
	// batch's publish mark, after them, does not count).
	settling atomic.Int64
	idle     chan struct{} // a signal that settling fell to 0

	mu       sync.Mutex
	merchant map[string]int // queued requests per merchant
}

func newBatcher(g *base, store Store, records Records) *batcher {
	c := g.cfg
	return &batcher{g: g, store: store, records: records,
		queue: make(chan *item, c.QueueSize), slots: make(chan struct{}, c.Flushers),
		share: max(1, int(float64(c.QueueSize)*c.MerchantShare)), merchant: map[string]int{},
		keys: keyCache{m: map[string]string{}}, idle: make(chan struct{}, 1)}
}

// open lets requests join the queue; run takes them from it.
func (b *batcher) open() { b.running.Store(true) }

// enqueue adds it to the queue, or sheds it.
func (b *batcher) enqueue(it *item) error {
	m := it.cmd.MerchantID
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.running.Load() {
		return errQueueFull // stopped: the server is closing
	}
	if b.merchant[m] >= b.share {
		return errMerchantBusy
	}
	select {
	case b.queue <- it:
		b.merchant[m]++
		b.g.metrics.queued.Inc()
		return nil
	default:
		return errQueueFull
	}
}

func (b *batcher) dequeued(batch []*item) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.g.metrics.queued.Sub(float64(len(batch)))
	b.g.metrics.batchSize.Observe(float64(len(batch)))
	for _, it := range batch {
		if b.merchant[it.cmd.MerchantID]--; b.merchant[it.cmd.MerchantID] <= 0 {
			delete(b.merchant, it.cmd.MerchantID)
		}
	}
}

// run cuts the queue into batches and flushes them, up to Flushers at a
// time, until ctx ends; then it flushes what is queued and waits for every
// flush. A batch stops gathering when it is full, when BatchWindow passes
// without a new request, or at once when no other batch is settling.
func (b *batcher) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	size, window := b.g.cfg.BatchSize, b.g.cfg.BatchWindow
	timer := time.NewTimer(window)
	defer timer.Stop()
	for {
		b.slots <- struct{}{}
		var first *item
		select {
		case first = <-b.queue:
		case <-ctx.Done():
			<-b.slots
			b.mu.Lock()
			b.running.Store(false)
			b.mu.Unlock()
			b.flushRest(&wg)
			return
		}
		batch := append(make([]*item, 0, size), first)
	fill:
		for len(batch) < size {
			select {
			case it := <-b.queue:
				batch = append(batch, it)
				continue
			default:
			}
			// Nothing is being settled: no POST will gather behind another
			// batch, and waiting would only delay these.
			if b.settling.Load() == 0 {
				break fill
			}
			it, ok := b.gather(timer, window)
			if !ok {
				break fill
			}
			batch = append(batch, it)
		}
		b.dequeued(batch)
		b.settling.Add(1)
		wg.Go(func() {
			defer func() { <-b.slots }()
			b.flush(batch)
		})
	}
}

// gather waits for the next request while a batch is settling; it gives
// up when window passes without one, or when the batches being settled are
// all answered first (the next batch is then cut at once, as a group
// commit's would be).
func (b *batcher) gather(timer *time.Timer, window time.Duration) (*item, bool) {
	timer.Reset(window)
	defer timer.Stop()
	for {
		select {
		case it := <-b.queue:
			return it, true
		case <-b.idle:
			if b.settling.Load() == 0 {
				return nil, false
			}
			// A signal from before the last batch was cut.
		case <-timer.C:
			return nil, false
		}
	}
}

// flushRest flushes requests queued when the intake stopped: none is left
// without an answer.
func (b *batcher) flushRest(wg *sync.WaitGroup) {
	for {
		var batch []*item
		for len(batch) < b.g.cfg.BatchSize {
			select {
			case it := <-b.queue:
				batch = append(batch, it)
				continue
			default:
			}
			break
		}
		if len(batch) == 0 {
			return
		}
		b.dequeued(batch)
		b.settling.Add(1)
		wg.Go(func() { b.flush(batch) })
	}
}

// flush settles one batch and answers every request in it: the first
// request of each key is taken in at once (acquireNew), the others of a
// key are decided beside it (decideTwins), the requests that need reads
// are read and taken in (readFirst), the keys found held are read again
// (rereadHeld), and what was taken in is published (publish). A request
// left undecided is answered 503.
func (b *batcher) flush(batch []*item) {
	ctx, cancel := context.WithTimeout(context.Background(), b.g.cfg.RequestTimeout)
	defer cancel()
	s := &settlement{b: b}
	defer func() {
		for _, it := range batch {
			it.answer()
		}
		s.answered()
	}()
	firsts, news, dups := firstsOf(batch)
	if err := s.acquireNew(ctx, news); err != nil {
		b.fail(batch, "acquire new intakes", err)
		return
	}
	b.decideTwins(firsts, dups)
	s.readFirst(ctx, batch)
	s.rereadHeld(ctx)
	b.publish(ctx, s.publish, s.answered)
}

// firstsOf splits a batch by key: the first request of each key (news)
// is taken in; the others (dups) wait for its outcome (decideTwins).
func firstsOf(batch []*item) (firsts map[ledger.KeyRef]*item, news, dups []*item) {
	firsts = make(map[ledger.KeyRef]*item, len(batch))
	for _, it := range batch {
		if k := refOf(it); firsts[k] != nil {
			dups = append(dups, it)
		} else {
			firsts[k] = it
			news = append(news, it)
		}
	}
	return firsts, news, dups
}

// decideTwins decides another request for a key the batch took in (or
// found held), which has no record or ledger row either: with the same
// API key, it is what it would meet a moment later, the key held (409) or
// held for another payload (422); with another API key, or when the first
// was left to be read, it is decided the long way, where it meets the
// first's row.
func (b *batcher) decideTwins(firsts map[ledger.KeyRef]*item, dups []*item) {
	for _, it := range dups {
		f := firsts[refOf(it)]
		switch {
		case f.readFirst || !bytes.Equal(f.keyHash, it.keyHash):
			it.readFirst = true
		case bytes.Equal(f.fp, it.fp):
			it.ans = answer{kind: ansInUse, retry: b.g.cfg.QueuedRetryAfter}
		default:
			it.ans = answer{kind: ansReused}
		}
	}
}

// settlement is one flush under way: the requests it took in, to
// publish, those whose key it found held (read again before they are
// answered), and whether the batch's settling has ended.
type settlement struct {
	b       *batcher
	publish []*item
	held    []*item
	ended   bool
}

// answered ends the batch's settling, once: after its 202s (publish),
// or when the flush ends without any. Only the flush's goroutine calls it.
func (s *settlement) answered() {
	if s.ended {
		return
	}
	s.ended = true
	if s.b.settling.Add(-1) == 0 {
		select {
		case s.b.idle <- struct{}{}:
		default:
		}
	}
}

// settle decides a request from the intake its acquisition returned
// (res): to publish, or answered at once. reread: a key found held is
// read again before it is answered (rereadHeld).
func (s *settlement) settle(ctx context.Context, it *item, res ledger.IntakeResult, reread bool) {
	g := s.b.g
	if a, waits := fromOperator(it.rec, res, it.fp); waits {
		g.releaseWaiting(ctx, res, it.log)
		it.ans = a
		return
	}
	switch res.Outcome {
	case ledger.IntakeMismatch:
		it.ans.kind = ansReused
	case ledger.IntakeDeadLettered:
		it.ans = answer{kind: ansDeadLetter, in: res.Intake}
	case ledger.IntakeHeld:
		it.ans = answer{kind: ansInUse, retry: g.cfg.QueuedRetryAfter}
		if reread {
			s.held = append(s.held, it)
		}
	case ledger.IntakeReadFirst:
		it.readFirst = true
	default:
		it.ans.in = res.Intake
		s.publish = append(s.publish, it)
	}
}

// releaseWaiting gives back an intake acquired only to find that its
// payment waits for an operator (fromOperator): nothing was published.
func (g *base) releaseWaiting(ctx context.Context, res ledger.IntakeResult, log *slog.Logger) {
	if res.Outcome != ledger.IntakeAcquired {
		return
	}
	if err := g.store.ReleaseIntake(ctx, res.Intake); err != nil && !errors.Is(err, ledger.ErrLeaseLost) {
		log.Warn("could not release the intake of a payment waiting for an operator; a retry takes it over once its lease passes", "error", err)
	}
}

// acquireNew takes in, in one round trip, every request that only its
// intake row can decide (its API key active, no record, no ledger row):
// for a batch of new payments, the whole of the batch's work before its
// publish. The others are left to be read first (IntakeReadFirst).
func (s *settlement) acquireNew(ctx context.Context, news []*item) error {
	g := s.b.g
	reqs, apiKeys := make([]ledger.ClaimRequest, len(news)), make([][]byte, len(news))
	for i, it := range news {
		reqs[i], apiKeys[i] = ledger.NewClaimRequest(it.cmd), it.keyHash
	}
	results, err := s.b.store.AcquireNewIntakes(ctx, reqs, apiKeys, g.cfg.PublishLease, g.cfg.IntakeRetention)
	if err != nil {
		return err
	}
	// A held row met by AcquireNewIntakes had no record in the snapshot
	// that found it held: it is 409 as of now, with nothing to read again.
	for i, res := range results {
		s.settle(ctx, news[i], res, false)
	}
	return nil
}

// readFirst decides the requests left to be read first
// (readThenAcquire), in the batch's order: the first request of a key
// takes it in.
func (s *settlement) readFirst(ctx context.Context, batch []*item) {
	var slow []*item
	for _, it := range batch {
		if it.readFirst {
			slow = append(slow, it)
		}
	}
	if len(slow) == 0 {
		return
	}
	owners, results, err := s.b.readThenAcquire(ctx, slow)
	if err != nil {
		s.b.fail(owners, "acquire intakes", err)
		return
	}
	for i, res := range results {
		s.settle(ctx, owners[i], res, true)
	}
}

// rereadHeld decides again the requests whose key another request
// published: the worker may have finished since the reads of
// readThenAcquire.
func (s *settlement) rereadHeld(ctx context.Context) {
	if len(s.held) == 0 {
		return
	}
	recs, _ := s.b.records.GetMany(ctx, refsOf(s.held))
	byKey := make(map[ledger.KeyRef]ledger.Record, len(recs))
	for _, r := range recs {
		byKey[ledger.KeyRef{MerchantID: r.MerchantID, IdempotencyKey: r.IdempotencyKey}] = r
	}
	for _, it := range s.held {
		if rec, ok := byKey[refOf(it)]; ok {
			if a, decided := s.b.g.fromRecord(rec, it.fp); decided {
				it.ans = a
			}
		}
	}
}

// fail answers items 503 after the step what failed with err: none of
// them was published.
func (b *batcher) fail(items []*item, what string, err error) {
	b.g.log.Error(what+"; its requests are answered 503 and none of them was published", "error", err, "requests", len(items))
	for _, it := range items {
		it.ans.kind = ansUnavailable
	}
}

// readThenAcquire decides the requests that AcquireNewIntakes left alone
// (and the second and later requests of a key in one batch): one round
// trip reads their API keys, records and ledger rows, which decide those
// they can (a key revoked since it was cached is refused, a key with a
// record is decided by it, one without by its ledger row), and the rest
// are taken in with AcquireIntakes. It returns the requests it tried to
// take in and their results; on an error, the requests it could not
// decide (answered 503 by the caller).
func (b *batcher) readThenAcquire(ctx context.Context, items []*item) ([]*item, []ledger.IntakeResult, error) {
	g := b.g
	hashes := make([][]byte, 0, 4)
	for _, it := range items {
		if !slices.ContainsFunc(hashes, func(h []byte) bool { return bytes.Equal(h, it.keyHash) }) {
			hashes = append(hashes, it.keyHash)
		}
	}
	reads, err := b.store.ReadBatch(ctx, hashes, refsOf(items))
	if err != nil {
		return items, nil, err
	}
	byKey := make(map[ledger.KeyRef]ledger.Record, len(reads.Records))
	for _, r := range reads.Records {
		byKey[ledger.KeyRef{MerchantID: r.MerchantID, IdempotencyKey: r.IdempotencyKey}] = r
	}
	paid := make(map[ledger.KeyRef]ledger.Payment, len(reads.Payments))
	for _, p := range reads.Payments {
		paid[ledger.KeyRef{MerchantID: p.MerchantID, IdempotencyKey: p.IdempotencyKey}] = p
	}
	// Two requests for one key: the first takes it in; the other is what
	// it would meet a moment later, the key held (409) or held for another
	// payload (422). A first taken in by AcquireNewIntakes is not among
	// items: its other requests meet its row in AcquireIntakes.
	firsts := make(map[ledger.KeyRef]*item, len(items))
	var reqs []ledger.ClaimRequest
	var owners []*item
	for _, it := range items {
		k := refOf(it)
		if reads.Active[string(it.keyHash)] != it.cmd.MerchantID {
			b.keys.evict(it.keyHash)
			it.ans.kind = ansUnauthenticated
			continue
		}
		if rec, ok := byKey[k]; ok {
			it.rec = &rec
			a, decided := g.fromRecord(rec, it.fp)
			if g.mayWaitForOperator(rec, it.fp, a, decided) {
				// Rare (a lease that ran out): read one at a time.
				if in, ok := g.fate(ctx, it.cmd.MerchantID, it.cmd.IdempotencyKey, it.fp, &rec); ok {
					it.ans = fateAnswer(rec, in)
					continue
				}
			}
			if decided {
				it.ans = a
				continue
			}
		} else if p, ok := paid[k]; ok {
			if a, decided := fromLedger(p, it.cmd); decided {
				it.ans = a
				continue
			}
		}
		if f, dup := firsts[k]; dup {
			if bytes.Equal(f.fp, it.fp) {
				it.ans = answer{kind: ansInUse, retry: g.cfg.QueuedRetryAfter}
			} else {
				it.ans = answer{kind: ansReused}
			}
			continue
		}
		firsts[k] = it
		reqs = append(reqs, ledger.NewClaimRequest(it.cmd))
		owners = append(owners, it)
	}
	if len(reqs) == 0 {
		return nil, nil, nil
	}
	results, err := b.store.AcquireIntakes(ctx, reqs, g.cfg.PublishLease, g.cfg.IntakeRetention)
	if err != nil {
		return owners, nil, err
	}
	return owners, results, nil
}

// publish publishes the commands whose intake the batch acquired, all at
// once, each PubAck awaited, answers each published one 202 (the batch is
// then answered: see batcher.settling), and then records the publishes in
// one statement. A failed publish is answered as publishFailed decides.
func (b *batcher) publish(ctx context.Context, items []*item, answered func()) {
	g := b.g
	pctx, cancel := context.WithTimeout(ctx, g.cfg.PublishLease)
	defer cancel()
	republish := make([]int, len(items))
	for i, it := range items {
		in := it.ans.in
		republish[i] = republishOf(in)
		// A retry after the republish hold: rare, one at a time.
		if in.Published() && g.heldAgain(pctx, in, it.log) {
			it.ans.kind = ansNotRepublished
		}
	}
	seqs := b.publishAll(pctx, items, republish)
	var pubs []ledger.Published
	var done []*item
	for i, it := range items {
		if it.ans.kind == ansPending {
			pubs = append(pubs, ledger.Published{Intake: it.ans.in, Seq: seqs[i]})
			done = append(done, it)
		}
	}
	if len(pubs) == 0 {
		return
	}
	for i, it := range done {
		it.ans.kind = ansAccepted
		g.metrics.idempotency.WithLabelValues("new").Inc()
		it.log.Info("payment accepted", "attempt", it.ans.in.Attempt, "stream_seq", pubs[i].Seq, "republish", it.ans.in.Published())
		it.answer()
	}
	answered()
	if _, err := b.store.IntakesPublished(pctx, pubs, g.cfg.RepublishAfter); err != nil {
		// The messages are in the stream; at worst a retry after the publish
		// lease publishes again, which the worker's claim makes harmless.
		g.log.Warn("could not record the publishes", "error", err, "requests", len(pubs))
	}
}

// batchPublisher is the optional batch publish of a Publisher
// (*stream.CommandPublisher): every command sent at once, every PubAck
// awaited. A Publisher without it (the tests' fault-injecting wrappers)
// publishes each command on its own, concurrently.
type batchPublisher interface {
	PublishBatch(ctx context.Context, cmds []stream.BatchCommand) []stream.BatchResult
}

// publishAll publishes the pending items' commands and returns their
// stream sequences; an item whose publish failed is answered as
// publishFailed decides (a refusal gives its intake up; an unknown
// outcome keeps it bound).
func (b *batcher) publishAll(ctx context.Context, items []*item, republish []int) []uint64 {
	g := b.g
	seqs := make([]uint64, len(items))
	settle := func(i int, seq uint64, err error, took time.Duration) {
		it := items[i]
		g.metrics.publishDuration.Observe(took.Seconds())
		if err != nil {
			it.ans.kind = g.publishFailed(ctx, it.ans.in, err, it.log)
			return
		}
		g.metrics.publishes.WithLabelValues("ok").Inc()
		seqs[i] = seq
	}
	var wg sync.WaitGroup
	bp, ok := g.pub.(batchPublisher)
	if !ok {
		for i, it := range items {
			if it.ans.kind == ansPending {
				wg.Go(func() {
					start := time.Now()
					seq, err := g.pub.Publish(ctx, it.cmd, it.extra, republish[i])
					settle(i, seq, err, time.Since(start))
				})
			}
		}
		wg.Wait()
		return seqs
	}
	var cmds []stream.BatchCommand
	var index []int
	for i, it := range items {
		if it.ans.kind == ansPending {
			cmds = append(cmds, stream.BatchCommand{Cmd: it.cmd, Extra: it.extra, Republish: republish[i], Checked: it.checked})
			index = append(index, i)
		}
	}
	if len(cmds) == 0 {
		return seqs
	}
	start := time.Now()
	results := bp.PublishBatch(ctx, cmds)
	took := time.Since(start)
	for j, r := range results {
		if r.Err != nil {
			// Giving the intake up (or releasing it) is a round trip: done
			// at once for all.
			wg.Go(func() { settle(index[j], r.Seq, r.Err, took) })
			continue
		}
		settle(index[j], r.Seq, nil, took)
	}
	wg.Wait()
	return seqs
}

// republishOf numbers a publish under in for its Nats-Msg-Id: 0 (the
// command's own id) unless in was published and the stream has lost that
// copy (heldAgain), then the attempt: the old id may still be inside the
// duplicate window, which would drop the new copy. An intake taken over
// with no mark of a publish (its publisher died, its PubAck or its mark
// was lost) is bound to its payload, so its retry publishes the same
// command under the same id: a copy that did land is dropped by the
// duplicate window, and a later one is harmless (the worker's claim).
func republishOf(in ledger.Intake) int {
	if in.Published() && in.Attempt > 1 {
		return in.Attempt
	}
	return 0
}

// heldAgain handles a retry after the republish hold, whose intake it
// acquired: while the stream still holds the published copy (the worker
// is behind), publishing again only adds a copy, so the key is held for
// another period instead (true). false: publish again.
func (g *base) heldAgain(ctx context.Context, in ledger.Intake, log *slog.Logger) bool {
	stored, err := g.pub.Stored(ctx, in.MerchantID, in.IdempotencyKey, in.StreamSeq)
	if err != nil {
		log.Warn("cannot tell whether the stream holds the published copy; publishing again", "error", err)
		return false
	}
	if !stored {
		return false
	}
	if err := g.store.IntakePublished(ctx, in, in.StreamSeq, g.cfg.RepublishAfter); err != nil && !errors.Is(err, ledger.ErrLeaseLost) {
		log.Warn("could not hold the intake again", "error", err)
	}
	return true
}

// publishFailed settles the intake of a command whose publish failed and
// returns how to answer it. A refusal (stream.Refused: the stream stored
// nothing of this publish) after no earlier publish of unknown outcome
// (earlierUnknown) gives the intake up, so a corrected retry is new: 422
// when another command holds its Nats-Msg-Id, 503 "nothing accepted"
// otherwise (saying so when the stream does not exist). Any other failure
// is an unknown outcome: the command may be stored and charged, so the
// intake stays bound to its payload, its lease released so that the
// client's retry with the same body publishes again at once (same
// Nats-Msg-Id), and the answer is 503 "outcome unknown".
func (g *base) publishFailed(ctx context.Context, in ledger.Intake, err error, log *slog.Logger) answerKind {
	g.metrics.publishes.WithLabelValues("error").Inc()
	if !stream.Refused(err) {
		log.Error("publish outcome unknown (no PubAck): the command may be queued; the key stays bound to its payload", "error", err)
		if rerr := g.store.ReleaseIntake(ctx, in); rerr != nil && !errors.Is(rerr, ledger.ErrLeaseLost) {
			log.Warn("could not release the intake; a retry takes it over once its lease passes", "error", rerr)
		}
		return ansPublishUnknown
	}
	if earlierUnknown(in, err) {
		log.Error("publish refused, but an earlier publish of the command had an unknown outcome: it may be queued; the key stays bound to its payload", "error", err)
		if rerr := g.store.ReleaseIntake(ctx, in); rerr != nil && !errors.Is(rerr, ledger.ErrLeaseLost) {
			log.Warn("could not release the intake; a retry takes it over once its lease passes", "error", rerr)
		}
		return ansPublishUnknown
	}
	log.Error("publish refused; nothing was stored", "error", err)
	if aerr := g.store.AbandonIntake(ctx, in); aerr != nil && !errors.Is(aerr, ledger.ErrLeaseLost) {
		log.Warn("could not release the intake; it is taken over once its lease passes", "error", aerr)
	}
	switch {
	case errors.Is(err, stream.ErrMsgIDTaken):
		return ansReused
	case errors.Is(err, stream.ErrStreamMissing):
		return ansNoStream
	}
	return ansNotQueued
}

// earlierUnknown reports whether a refused publish under in leaves an
// earlier one unknown: the intake was taken over (attempt past 1) with no
// publish marked, so an earlier publisher's copy may be stored (its PubAck
// lost, or it died publishing), and this refusal (a full stream, after the
// duplicate window) says nothing of that copy. A refusal because another
// command holds the Nats-Msg-Id, or because the stream does not exist,
// still gives the intake up.
func earlierUnknown(in ledger.Intake, err error) bool {
	return !in.Published() && in.Attempt > 1 &&
		!errors.Is(err, stream.ErrMsgIDTaken) && !errors.Is(err, stream.ErrStreamMissing)
}

func refOf(it *item) ledger.KeyRef {
	return ledger.KeyRef{MerchantID: it.cmd.MerchantID, IdempotencyKey: it.cmd.IdempotencyKey}
}

func refsOf(items []*item) []ledger.KeyRef {
	out := make([]ledger.KeyRef, len(items))
	for i, it := range items {
		out[i] = refOf(it)
	}
	return out
}

// keyCache maps API key hashes to their merchant, so that a POST does not
// look its key up; every batch re-checks the keys of its requests
// (pgstore.AcquireNewIntakes, ReadBatch), so a revocation is seen by the
// next batch.
type keyCache struct {
	mu sync.RWMutex
	m  map[string]string
}

func (c *keyCache) get(hash []byte) (string, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	m, ok := c.m[string(hash)]
	return m, ok
}

func (c *keyCache) put(hash []byte, merchant string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= maxCachedAPIKeys {
		clear(c.m)
	}
	c.m[string(hash)] = merchant
}

func (c *keyCache) evict(hash []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, string(hash))
}
