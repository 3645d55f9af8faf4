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
// request the server refused (4xx: wrong stream, too large), a bad subject
// or a closed connection is not retried.
func Retryable(err error) bool {
	if err == nil || errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrMaxPayload) ||
		errors.Is(err, nats.ErrBadSubject) || errors.Is(err, context.Canceled) {
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

// PublishResult is the fate of one published message.
type PublishResult struct {
	Msg *nats.Msg
	// Seq is the message's stream sequence (for a duplicate, the sequence of
	// the message it duplicates).
	Seq uint64
	// Duplicate: the stream's duplicate window dropped it (same Nats-Msg-Id).
	Duplicate bool
	// Err is set when no PubAck came.
	Err error
}

// PublishStats counts results so far.
type PublishStats struct {
	Sent       int `json:"sent"`       // handed to the server
	Stored     int `json:"stored"`     // PubAck, new message
	Duplicates int `json:"duplicates"` // PubAck.Duplicate: dropped by the duplicate window
	Failed     int `json:"failed"`     // no PubAck (error or timeout), retries included
	Retried    int `json:"retried"`    // sends again after a retryable error, same Nats-Msg-Id
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
	// failed. DefaultPublishRetry when 0; negative: never.
	Retry time.Duration
	// OnResult, when set, is called for every message, in publish order,
	// from one goroutine.
	OnResult func(PublishResult)
}

// Publisher publishes asynchronously with a bounded window of messages in
// flight, instead of one round trip per message, and awaits every PubAck.
// Publish from one goroutine; Stats may be read from any.
type Publisher struct {
	js       jetstream.JetStream
	onResult func(PublishResult)
	retry    time.Duration
	slots    chan struct{}               // one per message awaiting its PubAck
	inflight chan jetstream.PubAckFuture // in publish order; never fuller than slots
	done     chan struct{}

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
		js: js, onResult: cfg.OnResult, retry: cmp.Or(cfg.Retry, DefaultPublishRetry),
		slots: make(chan struct{}, window), inflight: make(chan jetstream.PubAckFuture, window),
		done: make(chan struct{}),
	}
	go p.collect()
	return p, nil
}

// Publish sends m, first waiting while the window is full. A message the
// client cannot even send is counted as failed (and reported to OnResult);
// the error is only for ctx ending before m was sent, or a closed publisher.
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

// collect resolves futures in publish order and frees their slots. A
// message whose PubAck did not come for a Retryable reason is sent again,
// the same message (Nats-Msg-Id), until p.retry has passed since its
// first failure; it keeps its slot meanwhile.
func (p *Publisher) collect() {
	defer close(p.done)
	for f := range p.inflight {
		var failedAt time.Time
		for tries := 1; ; tries++ {
			var err error
			select {
			case ack := <-f.Ok():
				p.record(PublishResult{Msg: f.Msg(), Seq: ack.Sequence, Duplicate: ack.Duplicate})
			case err = <-f.Err():
			}
			if err == nil {
				break
			}
			if failedAt.IsZero() {
				failedAt = time.Now()
			}
			if !Retryable(err) || time.Since(failedAt) >= p.retry {
				p.record(PublishResult{Msg: f.Msg(), Err: err})
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
		<-p.slots
	}
}

func (p *Publisher) record(r PublishResult) {
	p.mu.Lock()
	switch {
	case r.Err != nil:
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
