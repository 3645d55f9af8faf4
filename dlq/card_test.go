package dlq_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// A card_data letter is never replayed, not even with --force: its body
// keeps the card number masked, so a replay would publish another command.
// The refusal says so. Before, --force replayed it as any bad input.
func TestReplayRefusesCardData(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	h := nats.Header{}
	h.Set(stream.HeaderIdempotencyKey, "c-1")
	d := stream.Letter{Reason: string(payment.ReasonCardData), Err: payment.CardDataError("description"),
		OrigSubject: cfg.SubjectPrefix + ".m_1", OrigStream: cfg.Name, OrigSeq: uint64(time.Now().UnixNano()), Deliveries: 1,
		Header: h, Data: []byte(`{"merchant_id":"m_1","idempotency_key":"c-1","amount":100,"currency":"usd",` +
			`"payment_method":"pm_card_visa","description":"4111 1111 1111 1111"}`), FailedAt: time.Now()}
	ack, err := js.PublishMsg(ctx, d.Msg(cfg))
	if err != nil {
		t.Fatal(err)
	}
	for _, opts := range []dlq.ReplayOptions{
		{Seqs: []uint64{ack.Sequence}, Force: true},
		{All: true, Force: true},
		{All: true, Reason: string(payment.ReasonCardData), Force: true},
		{All: true, Force: true, DryRun: true},
	} {
		rep, err := dlq.Replay(ctx, js, cfg, opts)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Refused != 1 || rep.Replayed+rep.WouldReplay != 0 || len(rep.Results) != 1 ||
			!strings.Contains(rep.Results[0].Detail, "card number") {
			t.Fatalf("%+v: %+v", opts, rep)
		}
	}
	s, err := js.Stream(ctx, cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Fatalf("the payments stream holds %d messages (%v): a card_data letter was replayed", info.State.Msgs, err)
	}
	if _, err := dlq.Get(ctx, js, cfg, ack.Sequence); err != nil {
		t.Fatalf("the refused letter is gone: %v", err)
	}
}
