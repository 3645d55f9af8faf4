package stream

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// EnsureStreams creates or updates the payments stream, the dead-letter
// stream, the durable pull consumer and the advisory stream of the
// max-deliveries net with its consumer, and returns the payments stream and
// the workers' consumer.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Stream, jetstream.Consumer, error) {
	cfg = cfg.WithDefaults()
	// A message is at most max_payload minus the room its dead letter's
	// headers take, so any message the stream accepts can be dead-lettered
	// whole.
	maxMsgSize := js.Conn().MaxPayload() - DLQHeadroom
	if maxMsgSize < DLQHeadroom {
		return nil, nil, fmt.Errorf("the server's max_payload %d leaves no room for messages and their dead-letter headers (%d bytes)",
			js.Conn().MaxPayload(), DLQHeadroom)
	}
	want := jetstream.StreamConfig{
		Name:        cfg.Name,
		Description: "paydedup payment commands",
		Subjects:    []string{cfg.SubjectPrefix + ".>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		// No MaxAge: a command stays until a worker settles it, however
		// long the workers pause (the trimmer removes what they settled).
		// A full stream refuses the publish (DiscardNew): it sheds at the
		// door, where the publisher sees it, never a stored command.
		MaxBytes:   cfg.StreamMaxBytes,
		MaxMsgs:    cfg.StreamMaxMsgs,
		Duplicates: cfg.DuplicateWindow,
		Replicas:   cfg.Replicas,
		Discard:    jetstream.DiscardNew,
		MaxMsgSize: int32(min(maxMsgSize, math.MaxInt32)),
	}
	if cur, err := js.Stream(ctx, cfg.Name); err == nil {
		want = Settle(cur.CachedInfo(), want)
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil, fmt.Errorf("read stream %s: %w", cfg.Name, err)
	}
	stream, err := js.CreateOrUpdateStream(ctx, want)
	if err != nil {
		if strings.Contains(err.Error(), "insufficient") {
			return nil, nil, fmt.Errorf("create stream %s: the server cannot reserve PAYDEDUP_STREAM_MAX_BYTES=%d: lower it or raise the server's max_file_store: %w", cfg.Name, cfg.StreamMaxBytes, err)
		}
		return nil, nil, fmt.Errorf("create stream %s: %w", cfg.Name, err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        cfg.DLQStream,
		Description: "paydedup dead letters: payment commands that could not be processed, with the reason",
		Subjects:    []string{cfg.DLQPrefix + ".>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      cfg.DLQMaxAge,
		// Dead letters carry Nats-Msg-Id dlq:<stream>:<seq>, so the worker
		// and the MAX_DELIVERIES listener never file one message twice.
		Duplicates: min(cfg.DLQMaxAge, dlqDuplicateWindow),
		Replicas:   cfg.Replicas,
	}); err != nil {
		return nil, nil, fmt.Errorf("create stream %s: %w", cfg.DLQStream, err)
	}
	// The server announces a message that ran out of deliveries once, to
	// whoever listens then; this stream keeps the announcement until a
	// worker has dead-lettered the message (work queue: acked ones go).
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        cfg.AdvisoryStream,
		Description: "paydedup: MAX_DELIVERIES advisories of the workers' consumer, until the message is dead-lettered",
		Subjects:    []string{AdvisorySubject(cfg.Name, cfg.Durable)},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.WorkQueuePolicy,
		// No MaxAge: the message it names stays in the payments stream
		// until it is filed.
		Replicas: cfg.Replicas,
	}); err != nil {
		return nil, nil, fmt.Errorf("create stream %s: %w", cfg.AdvisoryStream, err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, cfg.AdvisoryStream, jetstream.ConsumerConfig{
		Durable:       DefaultMaxDeliverDurable,
		Description:   "paydedup workers: the max-deliveries net",
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       maxDeliverAckWait,
		MaxDeliver:    -1, // never give up on an advisory: the DLQ may refuse writes for a while
		Replicas:      cfg.Replicas,
	}); err != nil {
		return nil, nil, fmt.Errorf("create consumer %s on %s: %w", DefaultMaxDeliverDurable, cfg.AdvisoryStream, err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, cfg.Name, jetstream.ConsumerConfig{
		Durable:       cfg.Durable,
		Description:   "paydedup workers",
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxDeliver:    cfg.MaxDeliver,
		BackOff:       cfg.BackOff,
		MaxAckPending: cfg.MaxAckPending,
		FilterSubject: cfg.SubjectPrefix + ".>",
		Replicas:      cfg.Replicas,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("create consumer %s on %s: %w", cfg.Durable, cfg.Name, err)
	}
	return stream, cons, nil
}

// Settle returns the payments stream's settings EnsureStreams writes over
// the stream's current ones, cur: each setting moves only in its safe
// direction, so that workers started with different values do not flip
// the stream back and forth, and an update never deletes a stored
// command. The duplicate window only widens (a narrower one could store a
// requeue twice); a bound only grows, and never falls below what the
// stream holds (the server enforces a bound by deleting the oldest
// messages, DiscardNew or not); MaxAge is removed (a stream made by an
// older worker expired commands after it) and Discard becomes DiscardNew.
// Lowering a bound is an operator's deliberate act on the stream, not a
// worker's start.
func Settle(cur *jetstream.StreamInfo, want jetstream.StreamConfig) jetstream.StreamConfig {
	want.Duplicates = max(want.Duplicates, cur.Config.Duplicates)
	want.MaxBytes = max(want.MaxBytes, cur.Config.MaxBytes, int64(min(cur.State.Bytes, math.MaxInt64)))
	want.MaxMsgs = max(want.MaxMsgs, cur.Config.MaxMsgs, int64(min(cur.State.Msgs, math.MaxInt64)))
	want.MaxAge = 0
	return want
}
