package stream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrNotSetUp means a stream or the durable consumer does not exist yet:
// no worker has started against this configuration.
var ErrNotSetUp = errors.New("not set up: start a worker (paydedup worker) to create the streams and the consumer")

// adminTimeout bounds one admin request to the server.
const adminTimeout = 10 * time.Second

// ConsumerStats is what the durable consumer and the streams say about the
// backlog.
type ConsumerStats struct {
	Stream  string `json:"stream"`
	Durable string `json:"durable"`
	// NumPending is how many messages wait to be delivered for the first time.
	NumPending uint64 `json:"num_pending"`
	// NumAckPending is how many were delivered and not yet acked (in work,
	// or nakked with a delay and waiting for their redelivery).
	NumAckPending int `json:"num_ack_pending"`
	// NumRedelivered is how many of those were delivered more than once.
	NumRedelivered int `json:"num_redelivered"`
	// NumWaiting is how many pull requests (idle workers) wait for messages.
	NumWaiting int `json:"num_waiting"`
	// StreamMessages is how many messages the payments stream holds.
	StreamMessages uint64 `json:"stream_messages"`
	// StreamBytes is how many bytes it holds; StreamMaxBytes and
	// StreamMaxMsgs are its bounds (-1: none), at which it refuses
	// publishes. It has no max age: an outage fills it.
	StreamBytes    uint64 `json:"stream_bytes"`
	StreamMaxBytes int64  `json:"stream_max_bytes"`
	StreamMaxMsgs  int64  `json:"stream_max_msgs"`
	// OldestUnsettled is when the oldest command the workers have not
	// settled was stored: the first message above the consumer's ack floor
	// (zero when nothing waits). On NATS 2.9 the floor can stay at a
	// message that ran out of deliveries, which then counts as unsettled
	// until the consumer catches up.
	OldestUnsettled time.Time `json:"oldest_unsettled,omitzero"`
	// Lanes are the per-merchant consumers the workers opened beside the
	// durable one while it has a backlog: the merchants served meanwhile
	// rather than waiting behind another merchant's backlog.
	Lanes []LaneStats `json:"lanes,omitempty"`
}

// oldestScan bounds the sequences read past the ack floor to find the
// oldest unsettled message (deleted ones are skipped).
const oldestScan = 16

// ConsumerState reports the durable consumer's backlog. It wraps ErrNotSetUp
// when the stream or the consumer does not exist.
func ConsumerState(ctx context.Context, js jetstream.JetStream, cfg Config) (ConsumerStats, error) {
	cfg = cfg.WithDefaults()
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	st := ConsumerStats{Stream: cfg.Name, Durable: cfg.Durable}
	stream, err := js.Stream(ctx, cfg.Name)
	if err != nil {
		return st, notSetUp("stream "+cfg.Name, err)
	}
	sinfo, err := stream.Info(ctx)
	if err != nil {
		return st, fmt.Errorf("stream %s info: %w", cfg.Name, err)
	}
	st.StreamMessages, st.StreamBytes = sinfo.State.Msgs, sinfo.State.Bytes
	st.StreamMaxBytes, st.StreamMaxMsgs = sinfo.Config.MaxBytes, sinfo.Config.MaxMsgs
	cons, err := stream.Consumer(ctx, cfg.Durable)
	if err != nil {
		return st, notSetUp("consumer "+cfg.Durable+" on "+cfg.Name, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return st, notSetUp("consumer "+cfg.Durable+" on "+cfg.Name, err)
	}
	st.NumPending, st.NumAckPending = info.NumPending, info.NumAckPending
	st.NumRedelivered, st.NumWaiting = info.NumRedelivered, info.NumWaiting
	if st.NumPending > 0 || st.NumAckPending > 0 {
		list := stream.ListConsumers(ctx)
		for ci := range list.Info() {
			if IsLane(cfg.Durable, ci.Name) {
				st.Lanes = append(st.Lanes, LaneStats{Subject: ci.Config.FilterSubject, Name: ci.Name,
					NumPending: ci.NumPending, NumAckPending: ci.NumAckPending})
			}
		}
		if err := list.Err(); err != nil {
			return st, fmt.Errorf("stream %s consumers: %w", cfg.Name, err)
		}
		slices.SortFunc(st.Lanes, func(a, b LaneStats) int { return strings.Compare(a.Subject, b.Subject) })
	}
	if st.NumPending > 0 || st.NumAckPending > 0 {
		for seq, n := max(info.AckFloor.Stream+1, sinfo.State.FirstSeq), 0; seq <= sinfo.State.LastSeq && n < oldestScan; seq, n = seq+1, n+1 {
			raw, err := stream.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			if err != nil {
				return st, fmt.Errorf("stream %s message %d: %w", cfg.Name, seq, err)
			}
			st.OldestUnsettled = raw.Time.UTC()
			break
		}
	}
	return st, nil
}

func notSetUp(what string, err error) error {
	if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("%s: %w", what, ErrNotSetUp)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// IdleAfter is how long commands may wait in the stream with no worker
// asking for them before Idle says no worker consumes: a working fleet
// delivers a waiting command within a fetch.
const IdleAfter = 15 * time.Second

// Idle reports whether commands wait for a worker that is not there: the
// durable consumer does not exist (no worker has started against cfg), or
// it has commands to deliver, none delivered and unacked, no pull request
// waiting, and has delivered or seen an ack for none for IdleAfter (by
// now). since is when the consumer was last active (when it was created
// if it never was; zero when it does not exist).
func Idle(ctx context.Context, js jetstream.JetStream, cfg Config, now time.Time) (idle bool, since time.Time, err error) {
	cfg = cfg.WithDefaults()
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	cons, err := js.Consumer(ctx, cfg.Name, cfg.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return true, time.Time{}, nil
	}
	if err != nil {
		return false, time.Time{}, fmt.Errorf("consumer %s on %s: %w", cfg.Durable, cfg.Name, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return false, time.Time{}, fmt.Errorf("consumer %s on %s info: %w", cfg.Durable, cfg.Name, err)
	}
	since = info.Created
	for _, t := range []*time.Time{info.Delivered.Last, info.AckFloor.Last} {
		if t != nil && t.After(since) {
			since = *t
		}
	}
	since = since.UTC()
	idle = info.NumPending > 0 && info.NumAckPending == 0 && info.NumWaiting == 0 && now.Sub(since) > IdleAfter
	return idle, since, nil
}
