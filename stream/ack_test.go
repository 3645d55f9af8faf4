package stream_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// TestPublishAckTellsDuplicate: PublishAck says whether the stream stored
// the command or dropped it as a copy of itself, at the first copy's
// sequence, so a publisher can report a duplicate.
func TestPublishAckTellsDuplicate(t *testing.T) {
	t.Parallel()
	js, err := jetstream.New(testenv.NATSConn(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cfg := testenv.Streams(t, js).WithDefaults()
	if _, _, err := stream.EnsureStreams(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	p, err := stream.NewCommandPublisher(js.Conn(), cfg, 8*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: "k-1", Amount: 100, Currency: "usd", PaymentMethod: "pm_card_visa"}
	first, err := p.PublishAck(ctx, cmd, nil)
	if err != nil || first.Duplicate || first.Seq == 0 || first.Stream != cfg.Name {
		t.Fatalf("first publish: %+v, %v", first, err)
	}
	again, err := p.PublishAck(ctx, cmd, nil)
	if err != nil || !again.Duplicate || again.Seq != first.Seq {
		t.Fatalf("second publish: %+v, %v; want a duplicate of #%d", again, err, first.Seq)
	}
}
