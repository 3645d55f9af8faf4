package stream_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// A stream that does not exist is a refusal, told at once (not after the
// publish timeout's retries), by Publish, PublishBatch and Ready, each
// saying to start a worker.
func TestCommandPublisherMissingStreamRefusedAtOnce(t *testing.T) {
	t.Parallel()
	js, err := jetstream.New(testenv.NATSConn(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := testenv.Streams(t, js) // never created
	p, err := stream.NewCommandPublisher(js.Conn(), cfg, 8*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: "k-1", Amount: 100, Currency: "usd", PaymentMethod: "pm_card_visa"}
	start := time.Now()
	_, err = p.Publish(ctx, cmd, nil, 0)
	if !stream.Refused(err) || !errors.Is(err, stream.ErrStreamMissing) || time.Since(start) > 2500*time.Millisecond {
		t.Fatalf("publish without a stream: %v after %v, want a refusal at once", err, time.Since(start))
	}
	start = time.Now()
	res := p.PublishBatch(ctx, []stream.BatchCommand{{Cmd: cmd}})
	if !stream.Refused(res[0].Err) || !errors.Is(res[0].Err, stream.ErrStreamMissing) || time.Since(start) > 2500*time.Millisecond {
		t.Fatalf("batch publish without a stream: %v after %v, want a refusal at once", res[0].Err, time.Since(start))
	}
	if err := p.Ready(ctx); err == nil || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), "paydedup worker") {
		t.Fatalf("Ready without a stream: %v", err)
	}
}

// A duplicate PubAck counts as the command's publish only when the copy
// stored under its Nats-Msg-Id is the same command (the same bytes, or
// other bytes that decode to it); another command there is a refusal
// (ErrMsgIDTaken), by Publish and PublishBatch.
func TestCommandPublisherDuplicateIsChecked(t *testing.T) {
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
	cmd := func(key string, amount int64) *payment.Command {
		return &payment.Command{MerchantID: "m_1", IdempotencyKey: key, Amount: amount, Currency: "usd", PaymentMethod: "pm_card_visa"}
	}
	// Put on the queue by another publisher: k-other with another amount,
	// k-same with the same command in other bytes (fields reordered).
	raw := map[string]string{
		"k-other": `{"merchant_id":"m_1","idempotency_key":"k-other","amount":999,"currency":"usd","payment_method":"pm_card_visa"}`,
		"k-same":  `{"amount":100,"merchant_id":"m_1","currency":"usd","idempotency_key":"k-same","payment_method":"pm_card_visa"}`,
	}
	seqs := map[string]uint64{}
	for k, body := range raw {
		ack, err := js.PublishMsg(ctx, stream.CommandMsg(cfg, "m_1", k, []byte(body)))
		if err != nil {
			t.Fatal(err)
		}
		seqs[k] = ack.Sequence
	}
	_, err = p.Publish(ctx, cmd("k-other", 100), nil, 0)
	if !stream.Refused(err) || !errors.Is(err, stream.ErrMsgIDTaken) {
		t.Fatalf("publish under another command's id: %v, want ErrMsgIDTaken", err)
	}
	if seq, err := p.Publish(ctx, cmd("k-same", 100), nil, 0); err != nil || seq != seqs["k-same"] {
		t.Fatalf("publish of the same command in other bytes: seq %d (stored %d), %v", seq, seqs["k-same"], err)
	}
	res := p.PublishBatch(ctx, []stream.BatchCommand{{Cmd: cmd("k-other", 100)}, {Cmd: cmd("k-same", 100)}, {Cmd: cmd("k-new", 100)}})
	if !stream.Refused(res[0].Err) || !errors.Is(res[0].Err, stream.ErrMsgIDTaken) {
		t.Fatalf("batch publish under another command's id: %+v", res[0])
	}
	if res[1].Err != nil || res[1].Seq != seqs["k-same"] || res[2].Err != nil || res[2].Seq == 0 {
		t.Fatalf("batch publish: %+v", res)
	}
	// A publish twice is one message, its second PubAck a checked duplicate.
	if seq, err := p.Publish(ctx, cmd("k-new", 100), nil, 0); err != nil || seq != res[2].Seq {
		t.Fatalf("the same command again: seq %d (first %d), %v", seq, res[2].Seq, err)
	}
}
