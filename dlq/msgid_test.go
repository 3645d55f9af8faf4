package dlq_test

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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

// unreadable is a JetStream whose payments stream cannot be read (its
// info request fails), as when the server times out.
type unreadable struct {
	jetstream.JetStream
	name string
}

func (u unreadable) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if name == u.name {
		return nil, errors.New("injected: no answer from the stream")
	}
	return u.JetStream.Stream(ctx, name)
}

// A replay whose PubAck is a duplicate deletes the letter only when the
// stored message is its replay (stream.SameStored): another message under
// the id keeps the letter and says so, and a check that could not read the
// stored message is unknown, not "another message": the letter is kept
// and the operator told to replay it again.
func TestReplayDuplicateOfAnotherMessageKeepsLetter(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	seq := fileDeadLetter(t, js, cfg, stream.ReasonMaxDeliveries, "m_1", "held", time.Now())
	squatter := stream.CommandMsg(cfg, "m_1", "held", body("m_1", "held", 999))
	squatter.Header.Set(nats.MsgIdHdr, stream.ReplayMsgID(cfg, seq))
	if _, err := js.PublishMsg(ctx, squatter); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		js   jetstream.JetStream
		want string
	}{
		{"unreadable", unreadable{js, cfg.Name}, "unknown whether"},
		{"another message", js, "another message"},
	} {
		rep, err := dlq.Replay(ctx, c.js, cfg, dlq.ReplayOptions{Seqs: []uint64{seq}})
		if err != nil || len(rep.Results) != 1 {
			t.Fatalf("%s: %+v %v", c.name, rep, err)
		}
		res := rep.Results[0]
		if res.Outcome != dlq.Failed || !strings.Contains(res.Detail, c.want) || !strings.Contains(res.Detail, "the dead letter is kept") {
			t.Errorf("%s: %s %q, want failed saying %q and that the letter is kept", c.name, res.Outcome, res.Detail, c.want)
		}
		if _, err := dlq.Get(ctx, js, cfg, seq); err != nil {
			t.Fatalf("%s: the dead letter is gone: %v", c.name, err)
		}
	}
}
