package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"

	"github.com/paydedup/paydedup/stream"
)

// Lanes let the worker see the merchants behind another merchant's backlog.
// The workers' one durable consumer delivers the stream in order: while
// merchant A's backlog fills its window (MaxAckPending) and more of A's
// commands wait behind it, merchant B's commands, stored after them, are
// not delivered until A's are. A lane is a durable pull consumer filtered
// to one merchant's subject, starting after what the shared consumer has
// delivered, that every worker fetches from beside the shared consumer.
//
// A lane is best effort: the shared consumer stays the only authority over
// a message's fate. A lane message goes through the same claim, lease,
// provider call and commit; when its result is final (charged, declined, a
// duplicate) it is acked on the lane, and the shared consumer's delivery of
// the same message later finds the key completed and acks it as a
// duplicate. Any other result (a retry, a key in flight, a pause, a dead
// letter, malformed input, card data) is nakked on the lane while it has
// deliveries left and then termed there, without a dead letter, a requeue,
// an erasure or a note on the intake: the shared consumer delivers the same
// message later and does all of that once. So nothing of the guarantees
// (claim before call, lease, fences, the max-deliveries net, which listens
// to the shared consumer only, the trim below the shared consumer's ack
// floor, the dead letters) depends on a lane; a lane lost, deleted or
// ahead only costs or saves time.
//
// The lane manager (laneManager.runOnce, every laneTick in each worker)
// opens lanes while the shared consumer has a backlog (more than
// laneOpenBatches fetch batches not yet delivered, at two passes in a row,
// so that a passing burst costs no look at every merchant, or more than
// laneDeepBatches at the first): for the
// merchants with commands stored past what the shared consumer delivered,
// other than the merchants of its next laneHead messages (the backlog itself: a lane for
// them would deliver the same messages at the same time), smallest first,
// up to Config.Lanes. It deletes a lane idle for laneIdle, and, once the
// backlog is down to a fetch batch, a lane with nothing in work; between
// the two thresholds it opens none and deletes only idle lanes, so a load
// hovering at one of them does not open and delete lanes every pass. Lane
// names are deterministic, so every worker opens and fetches the same
// lanes.
const (
	// laneTick is how often the lane manager looks at the backlog: a
	// merchant behind a backlog waits up to it for its lane.
	laneTick = 500 * time.Millisecond
	// laneDeepBatches fetch batches pending are a backlog at the first
	// look: no passing burst is that deep.
	laneDeepBatches = 10
	// laneIdle is how long a lane stays with nothing pending and nothing
	// in work before it is deleted.
	laneIdle = 5 * time.Second
	// laneBatch bounds one fetch from a lane; laneSlots bounds the lane
	// messages a worker has between fetch and settle; laneMaxAckPending
	// bounds a lane's messages in work across the workers.
	laneBatch         = 16
	laneSlots         = 64
	laneMaxAckPending = 64
	// laneHand bounds one lane's messages a worker has between fetch and
	// settle: half the lane's window, so that two workers or more share a
	// merchant's lane. Each worker serves its merchants in turn within its
	// part of the fleet's budget; a worker that took the whole window
	// served the lane's merchant at half its own rate while the other
	// worker, with none of it, served only the backlog.
	laneHand = laneMaxAckPending / 2
	// laneMaxDeliver bounds a lane's deliveries of one message: after
	// them the lane terms it, and the shared consumer takes its time.
	laneMaxDeliver = 4
	// lanePoll is how long the lane fetcher waits when no lane had a
	// message.
	lanePoll = 100 * time.Millisecond
	// laneInactive makes the server delete a lane no worker fetched from
	// for that long (every worker gone before deleting it).
	laneInactive = 5 * time.Minute
	// laneProbes bounds the subjects a pass of the manager looks up.
	laneProbes = 64
	// laneHead is how many of the messages the shared consumer delivers
	// next a pass reads: their merchants are the backlog, and get no lane.
	laneHead = 8
	// laneOpenBatches: lanes open while more than this many fetch batches
	// wait for the shared consumer; the backlog is over at one batch.
	laneOpenBatches = 2
)

// lane is an open lane the worker fetches from.
type lane struct {
	name, subject string
	cons          jetstream.Consumer
}

// laneResult is what one pass of the manager did.
type laneResult struct {
	Backlog uint64   // the shared consumer's messages not yet delivered
	Open    []string // the subjects of the lanes open after the pass
	Opened  []string // subjects whose lanes this pass opened (or found)
	Deleted []string // subjects whose lanes this pass deleted
}

// laneManager opens and deletes lanes (see the constants above) and keeps
// the list the worker fetches from.
type laneManager struct {
	js     jetstream.JetStream
	cfg    Config
	logger *slog.Logger
	now    func() time.Time

	idleSince map[string]time.Time // lane name → first seen idle
	// probed is each subject's stored count when a look-up found nothing
	// past the shared consumer's delivered sequence: looked up again only
	// when the count changes.
	probed map[string]uint64
	// passed is how far (the stream sequence) a deleted lane had
	// delivered its subject: a new lane starts past it, and none opens
	// until a command is stored past it, or the lane would deliver again
	// what it charged while the shared consumer is still behind.
	passed map[string]uint64
	// backlogs counts the passes in a row that found a backlog.
	backlogs int

	mu    sync.Mutex
	lanes []lane
}

func newLaneManager(js jetstream.JetStream, cfg Config, logger *slog.Logger) *laneManager {
	now := time.Now
	if cfg.Clock != nil {
		now = cfg.Clock.Now
	}
	return &laneManager{js: js, cfg: cfg, logger: logger, now: now,
		idleSince: map[string]time.Time{}, probed: map[string]uint64{}, passed: map[string]uint64{}}
}

// Lanes reports how many lanes were open at the lane manager's last pass
// (0 when lanes are off): merchants served beside another merchant's
// backlog rather than behind it.
func (w *Worker) Lanes() int { return int(w.openLanes.Load()) }

// open returns the lanes open now.
func (m *laneManager) open() []lane {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lanes
}

// forget drops a lane found deleted (by another worker, or the server).
func (m *laneManager) forget(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lanes = slices.DeleteFunc(slices.Clone(m.lanes), func(l lane) bool { return l.name == name })
}

// runOnce reads the shared consumer's backlog and the lanes, deletes the
// idle ones (and those with nothing in work once the backlog is over), and
// opens lanes for merchants waiting behind the backlog, up to cfg.Lanes.
func (m *laneManager) runOnce(ctx context.Context) (laneResult, error) {
	var res laneResult
	s := m.cfg.Stream
	payments, err := m.js.Stream(ctx, s.Name)
	if err != nil {
		return res, fmt.Errorf("lanes: read stream: %w", err)
	}
	shared, err := payments.Consumer(ctx, s.Durable)
	if err != nil {
		return res, fmt.Errorf("lanes: read consumer: %w", err)
	}
	si, err := shared.Info(ctx)
	if err != nil {
		return res, fmt.Errorf("lanes: read consumer: %w", err)
	}
	res.Backlog = si.NumPending
	delivered := si.Delivered.Stream
	m.backlogs++
	if si.NumPending <= uint64(laneOpenBatches*m.cfg.FetchBatch) {
		m.backlogs = 0
	}
	over := si.NumPending <= uint64(m.cfg.FetchBatch)
	for subject, seq := range m.passed {
		if seq <= delivered {
			delete(m.passed, subject) // the shared consumer caught up
		}
	}

	// The lanes there are, by subject.
	have := map[string]*jetstream.ConsumerInfo{}
	list := payments.ListConsumers(ctx)
	for ci := range list.Info() {
		if stream.IsLane(s.Durable, ci.Name) {
			have[ci.Config.FilterSubject] = ci
		}
	}
	if err := list.Err(); err != nil {
		return res, fmt.Errorf("lanes: list consumers: %w", err)
	}
	now := m.now()
	for subject, ci := range have {
		idle := ci.NumPending == 0 && ci.NumAckPending == 0
		if !idle {
			delete(m.idleSince, ci.Name)
		} else if _, ok := m.idleSince[ci.Name]; !ok {
			m.idleSince[ci.Name] = now
		}
		// Once the backlog is over, the shared consumer delivers a lane's
		// pending messages as soon as the lane would: a lane with nothing
		// in work goes. Otherwise only a lane idle for laneIdle goes. (A
		// worker may fetch from it meanwhile: that loses nothing, the
		// acks fail and the shared consumer delivers the messages.)
		if !(over && ci.NumAckPending == 0) && (!idle || now.Sub(m.idleSince[ci.Name]) < laneIdle) {
			continue
		}
		if err := payments.DeleteConsumer(ctx, ci.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return res, fmt.Errorf("lanes: delete %s: %w", ci.Name, err)
		}
		delete(have, subject)
		delete(m.idleSince, ci.Name)
		if ci.Delivered.Stream > delivered {
			m.passed[subject] = max(m.passed[subject], ci.Delivered.Stream)
		}
		res.Deleted = append(res.Deleted, subject)
	}

	deep := si.NumPending > uint64(laneDeepBatches*m.cfg.FetchBatch)
	if (m.backlogs >= 2 || deep) && len(have) < m.cfg.Lanes {
		if err := m.openLanes(ctx, payments, delivered, have, &res); err != nil {
			m.setLanes(ctx, payments, have, &res)
			return res, err
		}
	}
	m.setLanes(ctx, payments, have, &res)
	return res, nil
}

// openLanes opens lanes, smallest merchant first, for the subjects with a
// command stored past delivered (the shared consumer's last delivered
// sequence), except those of the shared consumer's next messages: their
// backlog is what the shared consumer is working through. (The most stored
// is no sign of it: the stream keeps what was acked above the ack floor.)
func (m *laneManager) openLanes(ctx context.Context, payments jetstream.Stream, delivered uint64, have map[string]*jetstream.ConsumerInfo, res *laneResult) error {
	s := m.cfg.Stream
	head, err := m.head(ctx, payments, delivered)
	if err != nil {
		return err
	}
	info, err := payments.Info(ctx, jetstream.WithSubjectFilter(s.SubjectPrefix+".>"))
	if err != nil {
		return fmt.Errorf("lanes: read subjects: %w", err)
	}
	type subjectCount struct {
		subject string
		n       uint64
	}
	counts := make([]subjectCount, 0, len(info.State.Subjects))
	for subject, n := range info.State.Subjects {
		counts = append(counts, subjectCount{subject, n})
	}
	slices.SortFunc(counts, func(a, b subjectCount) int {
		return cmp.Or(cmp.Compare(a.n, b.n), strings.Compare(a.subject, b.subject))
	})
	for subject, n := range m.probed {
		if info.State.Subjects[subject] != n {
			delete(m.probed, subject)
		}
	}
	probes := 0
	for _, c := range counts {
		if len(have) >= m.cfg.Lanes || probes >= laneProbes {
			break
		}
		if _, ok := have[c.subject]; ok || head[c.subject] {
			continue
		}
		if n, ok := m.probed[c.subject]; ok && n == c.n {
			continue
		}
		probes++
		last, err := payments.GetLastMsgForSubject(ctx, c.subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("lanes: read last of %s: %w", c.subject, err)
		}
		from := max(delivered, m.passed[c.subject])
		if last.Sequence <= from {
			// Everything of it was delivered already: by the shared
			// consumer, or by a lane since deleted.
			m.probed[c.subject] = c.n
			continue
		}
		ci, err := m.ensure(ctx, payments, c.subject, from+1)
		if err != nil {
			return err
		}
		have[c.subject] = ci
		res.Opened = append(res.Opened, c.subject)
	}
	return nil
}

// head returns the subjects of the first laneHead messages stored past
// delivered: the merchants the shared consumer delivers next.
func (m *laneManager) head(ctx context.Context, payments jetstream.Stream, delivered uint64) (map[string]bool, error) {
	filter := m.cfg.Stream.SubjectPrefix + ".>"
	head := map[string]bool{}
	seq := delivered + 1
	for range laneHead {
		msg, err := payments.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("lanes: read next message: %w", err)
		}
		head[msg.Subject] = true
		seq = msg.Sequence + 1
	}
	return head, nil
}

// ensure creates subject's lane starting at start, or finds the one
// another worker created (its start may differ: any start after the
// shared consumer's delivered sequence at some pass is as good).
func (m *laneManager) ensure(ctx context.Context, payments jetstream.Stream, subject string, start uint64) (*jetstream.ConsumerInfo, error) {
	s := m.cfg.Stream
	name := stream.LaneName(s.Durable, subject)
	if cons, err := payments.Consumer(ctx, name); err == nil {
		return cons.CachedInfo(), nil
	}
	cons, err := payments.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:           name,
		Description:       "paydedup lane of " + subject + ": best effort, the shared consumer " + s.Durable + " settles every message",
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       start,
		AckPolicy:         jetstream.AckExplicitPolicy,
		AckWait:           s.AckWait,
		MaxDeliver:        laneMaxDeliver,
		MaxAckPending:     laneMaxAckPending,
		FilterSubject:     subject,
		InactiveThreshold: laneInactive,
		Replicas:          s.Replicas,
	})
	if err != nil {
		// Another worker created it meanwhile, with another start (a 2.9
		// server answers that as a refused update, not as "exists").
		if found, ferr := payments.Consumer(ctx, name); ferr == nil {
			cons, err = found, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("lanes: open %s: %w", name, err)
	}
	return cons.CachedInfo(), nil
}

// setLanes makes the lanes in have the ones the worker fetches from,
// keeping the handles it has.
func (m *laneManager) setLanes(ctx context.Context, payments jetstream.Stream, have map[string]*jetstream.ConsumerInfo, res *laneResult) {
	m.mu.Lock()
	old := map[string]lane{}
	for _, l := range m.lanes {
		old[l.name] = l
	}
	m.mu.Unlock()
	lanes := make([]lane, 0, len(have))
	for subject, ci := range have {
		l, ok := old[ci.Name]
		if !ok {
			cons, err := payments.Consumer(ctx, ci.Name)
			if err != nil {
				continue // deleted meanwhile; the next pass sees
			}
			l = lane{name: ci.Name, subject: subject, cons: cons}
		}
		lanes = append(lanes, l)
		res.Open = append(res.Open, subject)
	}
	slices.SortFunc(lanes, func(a, b lane) int { return strings.Compare(a.subject, b.subject) })
	slices.Sort(res.Open)
	m.mu.Lock()
	m.lanes = lanes
	m.mu.Unlock()
}

// runLanes runs the lane manager every laneTick and fetches from the open
// lanes, round robin, up to laneBatch messages a lane, into their own
// laneSlots (the shared consumer's slots and look-ahead stay its own), at
// most laneHand of one lane in hand, until ctx ends. Lane messages go through handleBatch as lane messages (see
// settleLane). It does not fetch while the worker is paused.
func (w *Worker) runLanes(ctx, workCtx context.Context, wg *sync.WaitGroup, run *runner) {
	m := w.lanes
	// hands holds, by lane, a slot per message of it between fetch and
	// settle (laneHand at most); together they are the lanes' laneSlots.
	// Only this loop takes slots; settling frees them.
	hands := map[string]chan struct{}{}
	inHand := func() int {
		n := 0
		for _, h := range hands {
			n += len(h)
		}
		return n
	}
	var lastPass time.Time
	next := 0
	for ctx.Err() == nil {
		if time.Since(lastPass) >= laneTick {
			lastPass = time.Now()
			pctx, cancel := context.WithTimeout(ctx, laneTick*5)
			res, err := m.runOnce(pctx)
			cancel()
			switch {
			case err != nil && ctx.Err() == nil:
				w.logger.Warn("lanes: pass failed; retrying", "error", err)
			case len(res.Opened) > 0 || len(res.Deleted) > 0:
				w.logger.Info("lanes changed", "backlog", res.Backlog, "lanes", len(res.Open), "opened", len(res.Opened), "deleted", len(res.Deleted))
			}
			w.openLanes.Store(int64(len(res.Open)))
			for name, h := range hands {
				if len(h) == 0 && !slices.ContainsFunc(m.open(), func(l lane) bool { return l.name == name }) {
					delete(hands, name)
				}
			}
		}
		lanes := m.open()
		if wait, _ := w.proc.gate.fetchWait(); wait > 0 || len(lanes) == 0 {
			sleepCtx(ctx, min(laneTick, max(wait, lanePoll)))
			continue
		}
		fetched := false
		for range lanes {
			l := lanes[next%len(lanes)]
			next++
			hand := hands[l.name]
			if hand == nil {
				hand = make(chan struct{}, laneHand)
				hands[l.name] = hand
			}
			room := laneSlots - inHand()
			if room <= 0 {
				break
			}
			n := takeSlots(hand, min(laneBatch, room))
			if n == 0 {
				continue
			}
			b, err := l.cons.FetchNoWait(n)
			var msgs []jetstream.Msg
			if err == nil {
				for msg := range b.Messages() {
					msgs = append(msgs, msg)
				}
				err = b.Error()
			}
			for range n - len(msgs) {
				<-hand
			}
			if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) {
				m.forget(l.name)
			}
			if len(msgs) == 0 {
				continue
			}
			fetched = true
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.handleBatch(workCtx, msgs, hand, wg, run, true)
			}()
		}
		if !fetched {
			sleepCtx(ctx, lanePoll)
		}
	}
}

// takeSlots takes up to most free slots without waiting.
func takeSlots(slots chan struct{}, most int) int {
	for n := 0; n < most; n++ {
		select {
		case slots <- struct{}{}:
		default:
			return n
		}
	}
	return most
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// settleLane settles a lane message: acked when its result is final (the
// outcome is committed: the shared consumer's copy will be a duplicate),
// nakked for the lane's next delivery while it has some left and the
// result may change (a retry, a key in flight), termed otherwise. Never a
// dead letter, a requeue, an erasure or an intake note: those are the
// shared consumer's, on its own delivery of the same message.
func (w *Worker) settleLane(in *inbound, res Result) {
	log := in.log.logger()
	switch {
	case res.Kind == Completed || res.Kind == Declined || res.Kind == Duplicate:
		if err := in.msg.Ack(); err != nil {
			log.Debug("lane: ack failed; the lane's redelivery is a duplicate", "error", err)
		}
		w.observer.Settled(res.Kind, Action{Kind: Ack})
	case (res.Kind == Retry || res.Kind == InFlight) && !res.stopped && in.meta.NumDelivered < laneMaxDeliver:
		delay := max(res.Delay, w.cfg.RetryBase)
		_ = in.msg.NakWithDelay(delay)
	default:
		// Left to the shared consumer.
		_ = in.msg.Term()
	}
	if log.Enabled(context.Background(), slog.LevelDebug) {
		log.Debug("lane message settled", "result", res.Kind.String(), "error", errString(res.Err))
	}
	if in.span != nil {
		in.span.SetAttributes(attribute.String("paydedup.result", res.Kind.String()), attribute.Bool("paydedup.lane", true))
		in.span.End()
	}
}
