package dlq

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/stream"
)

// ReplayOneForTest replays one dead letter already read, as each of two
// concurrent replays does after both read it and before either deleted it.
func ReplayOneForTest(ctx context.Context, js jetstream.JetStream, cfg stream.Config, d Info) (ReplayResult, error) {
	cfg = cfg.WithDefaults()
	dlqs, err := js.Stream(ctx, cfg.DLQStream)
	if err != nil {
		return ReplayResult{}, err
	}
	res := ReplayResult{Seq: d.Seq, Reason: d.Reason, Subject: d.OrigSubject}
	replayOne(ctx, js, dlqs, cfg, d, &res)
	return res, nil
}

// ResignOneForTest re-signs one dead letter already read, as each of two
// concurrent runs does after both read it and before either deleted it.
func ResignOneForTest(ctx context.Context, js jetstream.JetStream, cfg stream.Config, d Info) (ResignResult, error) {
	cfg = cfg.WithDefaults()
	dlqs, err := js.Stream(ctx, cfg.DLQStream)
	if err != nil {
		return ResignResult{}, err
	}
	res := ResignResult{Seq: d.Seq, Reason: d.Reason}
	resignOne(ctx, js, dlqs, cfg, d, &res)
	return res, nil
}
