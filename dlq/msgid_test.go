package dlq_test

import (
	"bytes"
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// A merchant's command whose <merchant>:<key> spells a replay's or a
// republish's Nats-Msg-Id is stored, not dropped by the duplicate window
// as a copy of the other: merchant "replay" posting key <DLQ stream>:<seq>
// after that letter's replay, and merchant m posting key k:r1 after the
// gateway's first republish of m/k. Under the old ids both PubAcks were
// duplicates: the client heard "accepted" and nothing was ever charged.
func TestCommandsNeverDroppedAsReplayOrRepublish(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	seq := fileDeadLetter(t, js, cfg, stream.ReasonMaxDeliveries, "m_1", "dead", time.Now())
	rep, err := dlq.Replay(ctx, js, cfg, dlq.ReplayOptions{Seqs: []uint64{seq}})
	if err != nil || rep.Replayed != 1 {
		t.Fatalf("replay: %+v %v", rep, err)
	}

	pub, err := stream.NewCommandPublisher(js.Conn(), cfg, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	first := &payment.Command{MerchantID: "m", IdempotencyKey: "k", Amount: 100, Currency: "usd", PaymentMethod: "pm_card_visa"}
	if _, err := pub.Publish(ctx, first, nil, 1); err != nil {
		t.Fatalf("republish of m/k: %v", err)
	}

	s, err := js.Stream(ctx, cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ merchant, key string }{
		{"replay", cfg.DLQStream + ":" + strconv.FormatUint(seq, 10)},
		{"m", "k:r1"},
	} {
		b := body(c.merchant, c.key, 4200)
		m := stream.CommandMsg(cfg, c.merchant, c.key, b)
		ack, err := js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatalf("%s/%s: %v", c.merchant, c.key, err)
		}
		if ack.Duplicate {
			t.Errorf("%s/%s (Nats-Msg-Id %q) dropped as a duplicate of %s #%d: the client is told accepted and nothing is charged",
				c.merchant, c.key, m.Header.Get(nats.MsgIdHdr), ack.Stream, ack.Sequence)
			continue
		}
		got, err := s.GetMsg(ctx, ack.Sequence)
		if err != nil || got.Subject != m.Subject || !bytes.Equal(got.Data, b) {
			t.Errorf("%s/%s: the stream holds %v at #%d (%v), not the command", c.merchant, c.key, got, ack.Sequence, err)
		}
	}
}
