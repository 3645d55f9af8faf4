package stream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults for PublisherConfig.
const (
	DefaultPublishWindow     = 256
	DefaultPublishAckTimeout = 10 * time.Second
	// DefaultPublishRetry is how long a message without a PubAck is sent
	// again. It stays well inside the stream's duplicate window (2 min by
	// default), so a copy that did land is dropped by its Nats-Msg-Id.
	DefaultPublishRetry = 30 * time.Second
)

// Retryable reports whether a publish that got no PubAck may be sent again,
// with the same Nats-Msg-Id: a timeout, no responders (no stream leader
// yet), a disconnect, a server error (5xx). Across a stream leader change
// the message may or may not have been stored; the duplicate window makes
// a second copy harmless and the retry makes the command not lost. A
// request the server refused (4xx: wrong stream, too large; a full stream,
// StreamFull), a bad subject or a closed connection is not retried.
func Retryable(err error) bool {
	if err == nil || errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrMaxPayload) ||
		errors.Is(err, nats.ErrBadSubject) || errors.Is(err, context.Canceled) || StreamFull(err) {
		return false
	}
	var api *jetstream.APIError
	if errors.As(err, &api) && api.Code > 0 && api.Code < 500 {
		return false
	}
	return true
}

// retryWait is the pause before the n-th retry (from 1): 100 ms doubling,
// at most 1 s, about a NATS leader election's length in all.
func retryWait(n int) time.Duration {
	return min(100*time.Millisecond<<min(n-1, 4), time.Second)
}

// PublishResult is the fate of one published message: stored, a
// duplicate of itself (done earlier), refused (Reused, or Err with
// Refused: not stored), or unknown (Err without Refused: it may have been
// stored).
type PublishResult struct {
	Msg *nats.Msg
	// Stream and Seq are where the PubAck says the message is (for a
	// duplicate or a reused key, the message holding its Nats-Msg-Id).
	Stream string
	Seq    uint64
	// Duplicate: the stream's duplicate window dropped it (same
	// Nats-Msg-Id), and the stream holds the same message, or the same
	// payment command however its JSON is written, at Seq.
	Duplicate bool
	// Reused: the duplicate window dropped it, but the stream holds another
	// payload under its Nats-Msg-Id at Seq (the same idempotency key for
	// another payment): this message was not stored.
	Reused bool
	// Err is set when no PubAck came (after the retries), or when a
	// duplicate's stored message could not be read.
	Err error
	// Refused: Err proves the message was not stored (the server refused
	// it, or the client could not send it). Otherwise an Err is unknown:
	// it may have been stored.
	Refused bool
}

// Unknown reports whether the message may or may not be in the stream:
// no PubAck came, or it was dropped as a duplicate of a message that could
// not be read. Publishing it again, the same message, is safe: the
// duplicate window and the worker's claim drop a second copy.
func (r PublishResult) Unknown() bool { return r.Err != nil && !r.Refused }

// PublishStats counts results so far.
type PublishStats struct {
	Sent       int `json:"sent"`       // handed to the server
	Stored     int `json:"stored"`     // PubAck, new message
	Duplicates int `json:"duplicates"` // PubAck.Duplicate, and the stream holds this same command
	Reused     int `json:"reused"`     // PubAck.Duplicate, but another payload holds the Nats-Msg-Id: not stored
	Refused    int `json:"refused"`    // refused by the server or the client: not stored
	Unknown    int `json:"unknown"`    // no PubAck after the retries, or a duplicate that could not be checked: may be stored
	// Failed is every message not known to be stored as sent: Reused +
	// Refused + Unknown.
	Failed  int `json:"failed"`
	Retried int `json:"retried"` // sends again after a retryable error, same Nats-Msg-Id
}

// Outstanding is how many messages still wait for their PubAck.
func (s PublishStats) Outstanding() int { return s.Sent - s.Stored - s.Duplicates - s.Failed }

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Window bounds the messages awaiting their PubAck; Publish blocks while
	// it is full. DefaultPublishWindow when 0.
	Window int
	// AckTimeout is how long one PubAck may take. DefaultPublishAckTimeout
	// when 0.
	AckTimeout time.Duration
	// Retry is how long a message that got no PubAck, for a Retryable
	// reason, is sent again with the same Nats-Msg-Id before it counts as
	// unknown. DefaultPublishRetry when 0; negative: never.
	Retry time.Duration
	// OnResult, when set, is called for every message, in publish order,
	// from one goroutine.
	OnResult func(PublishResult)
	// Stream, when set, is the stream the messages are for: a publish that
	// finds no responders asks for it, and one that does not exist is a
	// refusal told at once (ErrStreamMissing), not retried as a leader
	// change would be.
	Stream string
}

// Publisher publishes asynchronously with a bounded window of messages in
// flight, instead of one round trip per message, and awaits every PubAck.
// Publish from one goroutine; Stats may be read from any.
type Publisher struct {
	js         jetstream.JetStream
	onResult   func(PublishResult)
	retry      time.Duration
	ackTimeout time.Duration               // also bounds the check of a duplicate
	stream     string                      // PublisherConfig.Stream
	streams    *cachedStreams              // js for the checks of duplicates
	slots      chan struct{}               // one per message awaiting its PubAck (or its check)
	inflight   chan jetstream.PubAckFuture // in publish order; never fuller than slots
	decided    chan decided                // in publish order; never fuller than slots
	done       chan struct{}

	mu     sync.Mutex
	stats  PublishStats
	closed bool
}

// NewPublisher returns a publisher on nc. Close it to await the last acks.
func NewPublisher(nc *nats.Conn, cfg PublisherConfig) (*Publisher, error) {
	window := cmp.Or(cfg.Window, DefaultPublishWindow)
	if window < 1 {
		return nil, fmt.Errorf("publisher: window must be at least 1, got %d", window)
	}
	// The client's own pending limit sits above our window, so it never
	// stalls: we block first.
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(window+1),
		jetstream.WithPublishAsyncTimeout(cmp.Or(cfg.AckTimeout, DefaultPublishAckTimeout)))
	if err != nil {
		return nil, fmt.Errorf("publisher: %w", err)
	}
	p := &Publisher{
		js:         js,
		onResult:   cfg.OnResult,
		retry:      cmp.Or(cfg.Retry, DefaultPublishRetry),
		ackTimeout: cmp.Or(cfg.AckTimeout, DefaultPublishAckTimeout),
		stream:     cfg.Stream,
		streams:    &cachedStreams{JetStream: js, streams: map[string]jetstream.Stream{}},
		slots:      make(chan struct{}, window),
		inflight:   make(chan jetstream.PubAckFuture, window),
		decided:    make(chan decided, window),
		done:       make(chan struct{}),
	}
	go p.collect()
	go p.report()
	return p, nil
}

// Publish sends m, first waiting while the window is full. A message the
// client cannot even send is counted (and reported to OnResult) like one
// without a PubAck; the error is only for ctx ending before m was sent, or
// a closed publisher.
func (p *Publisher) Publish(ctx context.Context, m *nats.Msg) error {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return errors.New("publish: publisher closed")
	}
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	p.mu.Lock()
	p.stats.Sent++
	p.mu.Unlock()
	f, err := p.js.PublishMsgAsync(m)
	if err != nil {
		f = failedFuture(m, err) // reported in order, like the others
	}
	p.inflight <- f // never blocks: we hold one of its slots
	return nil
}

// unsent is the future of a message the client could not send.
type unsent struct {
	msg *nats.Msg
	err chan error
}

func failedFuture(m *nats.Msg, err error) jetstream.PubAckFuture {
	u := unsent{msg: m, err: make(chan error, 1)}
	u.err <- err
	return u
}

func (u unsent) Ok() <-chan *jetstream.PubAck { return nil }
func (u unsent) Err() <-chan error            { return u.err }
func (u unsent) Msg() *nats.Msg               { return u.msg }

// decided is a message's result, or, while a duplicate PubAck is being
// checked, where its result will come.
type decided struct {
	r     PublishResult
	check <-chan PublishResult
}

// collect resolves futures in publish order and hands their results to
// report. A message whose PubAck did not come for a Retryable reason is
// sent again, the same message (Nats-Msg-Id), until p.retry has passed
// since its first failure; it keeps its slot meanwhile. A duplicate PubAck
// is checked against the stored message (checkDuplicate) on a goroutine of
// its own, so the checks of a window's duplicates overlap like its
// PubAcks.
func (p *Publisher) collect() {
	defer close(p.decided)
	for f := range p.inflight {
		var failedAt time.Time
		for tries := 1; ; tries++ {
			var err error
			select {
			case ack := <-f.Ok():
				p.decided <- p.acked(f.Msg(), ack)
			case err = <-f.Err():
			}
			if err == nil {
				break
			}
			if failedAt.IsZero() {
				failedAt = time.Now()
			}
			if p.streamMissing(err) {
				p.decided <- decided{r: PublishResult{Msg: f.Msg(), Err: fmt.Errorf("%w (%w)", ErrStreamMissing, err), Refused: true}}
				break
			}
			if !Retryable(err) || time.Since(failedAt) >= p.retry {
				p.decided <- decided{r: PublishResult{Msg: f.Msg(), Err: err, Refused: publishRefused(err)}}
				break
			}
			time.Sleep(retryWait(tries))
			p.mu.Lock()
			p.stats.Retried++
			p.mu.Unlock()
			m := f.Msg()
			if f, err = p.js.PublishMsgAsync(m); err != nil {
				f = failedFuture(m, err)
			}
		}
	}
}

// streamMissing reports whether a publish answered by no responders met a
// stream that does not exist (its info answers "stream not found" at
// once), rather than a leader change, which is retried.
func (p *Publisher) streamMissing(err error) bool {
	if p.stream == "" || !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, nats.ErrNoResponders) {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, serr := p.js.Stream(ctx, p.stream)
	return errors.Is(serr, jetstream.ErrStreamNotFound)
}

// acked is the result of m's PubAck; a duplicate's comes from its check.
func (p *Publisher) acked(m *nats.Msg, ack *jetstream.PubAck) decided {
	r := PublishResult{Msg: m, Stream: ack.Stream, Seq: ack.Sequence}
	if !ack.Duplicate {
		return decided{r: r}
	}
	check := make(chan PublishResult, 1)
	go func() {
		p.checkDuplicate(&r, ack)
		check <- r
	}()
	return decided{check: check}
}

// report records results in publish order, waiting for a duplicate's
// check, and frees their slots.
func (p *Publisher) report() {
	defer close(p.done)
	for d := range p.decided {
		r := d.r
		if d.check != nil {
			r = <-d.check
		}
		p.record(r)
		<-p.slots
	}
}

// cachedStreams is a JetStream that looks each stream up once: a
// duplicate's check (SameStored) is then one request, for the message.
type cachedStreams struct {
	jetstream.JetStream
	mu      sync.Mutex
	streams map[string]jetstream.Stream
}

func (c *cachedStreams) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	c.mu.Lock()
	s, ok := c.streams[name]
	c.mu.Unlock()
	if ok {
		return s, nil
	}
	s, err := c.JetStream.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.streams[name] = s
	c.mu.Unlock()
	return s, nil
}

// publishRefused reports whether a publish error proves the message was not
// stored: the server refused it (4xx: another stream, too large; a full
// stream, StreamFull), or the client never sent it (too large, a bad
// subject). Anything else (a
// timeout, no responders after the retries, a closed connection, a
// cancelled context) may have been stored.
func publishRefused(err error) bool {
	if errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadSubject) || StreamFull(err) {
		return true
	}
	var api *jetstream.APIError
	return errors.As(err, &api) && api.Code > 0 && api.Code < 500
}

// checkDuplicate decides a duplicate PubAck: a duplicate of m when the
// stream holds m, or the same payment command written otherwise, at
// ack.Sequence (SameStored); a reused key when it holds another payload;
// unknown when that message could not be read.
func (p *Publisher) checkDuplicate(r *PublishResult, ack *jetstream.PubAck) {
	ctx, cancel := context.WithTimeout(context.Background(), p.ackTimeout)
	defer cancel()
	same, err := SameStored(ctx, p.streams, ack, r.Msg)
	switch {
	case err != nil:
		r.Err = fmt.Errorf("dropped as a duplicate of %s #%d, which could not be read: %w", ack.Stream, ack.Sequence, err)
	case same:
		r.Duplicate = true
	default:
		r.Reused = true
	}
}

func (p *Publisher) record(r PublishResult) {
	p.mu.Lock()
	switch {
	case r.Reused:
		p.stats.Reused++
		p.stats.Failed++
	case r.Err != nil && r.Refused:
		p.stats.Refused++
		p.stats.Failed++
	case r.Err != nil:
		p.stats.Unknown++
		p.stats.Failed++
	case r.Duplicate:
		p.stats.Duplicates++
	default:
		p.stats.Stored++
	}
	p.mu.Unlock()
	if p.onResult != nil {
		p.onResult(r)
	}
}

// Stats returns the counts so far.
func (p *Publisher) Stats() PublishStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Close waits for the PubAck (or its timeout) of every message sent and
// returns the final counts. Publish must not be running.
func (p *Publisher) Close() PublishStats {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.inflight)
	}
	p.mu.Unlock()
	<-p.done
	return p.Stats()
}
