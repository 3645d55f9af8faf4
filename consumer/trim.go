package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// DefaultTrimInterval is how often a worker trims the payments stream of
// the commands the workers settled.
const DefaultTrimInterval = 30 * time.Second

// maxTrimAdvisories bounds the advisories one trim pass reads; with more
// waiting it trims nothing (the net is behind; nothing is lost by waiting).
const maxTrimAdvisories = 1024

// streamTrimmer removes settled commands from the payments stream. The
// stream has no max age (a paused worker must find every command it has
// not settled, however long the pause), so something must remove what is
// settled: the stream keeps Limits retention (2.9 cannot change an
// existing stream's retention), and the trimmer purges below the durable
// consumer's ack floor, below which every message is acked or terminated
// or ran out of deliveries.
//
// A message that ran out of deliveries is still the max-deliveries net's
// to file: the trimmer never purges up to a sequence a waiting advisory
// names, and uses the floor it read on its previous pass (at least an
// interval old), so that an advisory the server sent when the floor
// passed its message has been stored by then.
//
// The previous floor holds only for the same stream and consumer: when
// either was created again (a lost JetStream store, an operator recreating
// them), or the floor went down, the sequences start over and the previous
// floor would purge new, unsettled commands; the trimmer then starts over
// too, and never purges above the floor it reads now.
//
// Purging is idempotent, so every worker runs one.
type streamTrimmer struct {
	js       jetstream.JetStream
	cfg      Config
	logger   *slog.Logger
	prev     uint64 // the ack floor's stream sequence read on the previous pass
	havePrev bool
	// The creation times of the stream and the consumer prev was read from.
	streamCreated, consCreated time.Time
}

// trimResult is what one pass did.
type trimResult struct {
	Floor  uint64 // the ack floor read on this pass
	Bound  uint64 // the purge removed every message below it (0: none)
	Purged uint64
}

// runOnce reads the floor and the waiting advisories and purges below the
// bound they allow.
func (t *streamTrimmer) runOnce(ctx context.Context) (trimResult, error) {
	var res trimResult
	s := t.cfg.Stream
	cons, err := t.js.Consumer(ctx, s.Name, s.Durable)
	if err != nil {
		return res, fmt.Errorf("trim: read consumer: %w", err)
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		return res, fmt.Errorf("trim: read consumer: %w", err)
	}
	res.Floor = ci.AckFloor.Stream
	payments, err := t.js.Stream(ctx, s.Name)
	if err != nil {
		return res, fmt.Errorf("trim: read stream: %w", err)
	}
	created := payments.CachedInfo().Created
	prev := t.prev
	same := t.havePrev && res.Floor >= prev && created.Equal(t.streamCreated) && ci.Created.Equal(t.consCreated)
	t.prev, t.havePrev, t.streamCreated, t.consCreated = res.Floor, true, created, ci.Created
	if !same || prev == 0 {
		return res, nil
	}
	bound := min(prev, res.Floor) + 1 // purge every message below it
	low, err := t.oldestAdvised(ctx)
	if err != nil {
		return res, err
	}
	if low > 0 && low < bound {
		bound = low
	}
	before := payments.CachedInfo().State
	// Purge with a sequence at or below the first one is not a no-op on
	// every server: skip it.
	if bound <= before.FirstSeq || bound <= 1 {
		return res, nil
	}
	if err := payments.Purge(ctx, jetstream.WithPurgeSequence(bound)); err != nil {
		return res, fmt.Errorf("trim: purge below %d: %w", bound, err)
	}
	res.Bound = bound
	res.Purged = min(bound, before.LastSeq+1) - before.FirstSeq
	return res, nil
}

// oldestAdvised returns the lowest payments-stream sequence a waiting
// MAX_DELIVERIES advisory names, 0 when none waits.
func (t *streamTrimmer) oldestAdvised(ctx context.Context) (uint64, error) {
	adv, err := t.js.Stream(ctx, t.cfg.Stream.AdvisoryStream)
	if err != nil {
		return 0, fmt.Errorf("trim: read advisory stream: %w", err)
	}
	st := adv.CachedInfo().State
	if st.Msgs == 0 {
		return 0, nil
	}
	if st.Msgs > maxTrimAdvisories {
		return 1, nil // trim nothing until the net has caught up
	}
	var low uint64
	for seq := st.FirstSeq; seq <= st.LastSeq; seq++ {
		raw, err := adv.GetMsg(ctx, seq)
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			return 0, fmt.Errorf("trim: read advisory %d: %w", seq, err)
		}
		var a maxDeliveriesAdvisory
		if json.Unmarshal(raw.Data, &a) != nil || a.StreamSeq == 0 {
			continue
		}
		if low == 0 || a.StreamSeq < low {
			low = a.StreamSeq
		}
	}
	return low, nil
}

// runStreamTrimmer trims every interval until ctx ends.
func runStreamTrimmer(ctx context.Context, js jetstream.JetStream, cfg Config, logger *slog.Logger) {
	t := &streamTrimmer{js: js, cfg: cfg, logger: logger}
	tick := time.NewTicker(cfg.TrimInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		res, err := t.runOnce(pctx)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			logger.Warn("trimming the payments stream failed; retrying", "error", err)
		case res.Purged > 0:
			logger.Debug("trimmed settled commands from the payments stream", "below_seq", res.Bound, "purged", res.Purged)
		}
	}
}
