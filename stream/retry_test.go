package stream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/internal/testenv"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// streamsLater gives a test its own topology and creates its streams only
// after delay, as a stream without a leader yet looks to a publisher (no
// responders); it returns the configuration and a wait for the creation.
func streamsLater(t *testing.T, js jetstream.JetStream, delay time.Duration) (stream.Config, func()) {
	t.Helper()
	cfg := testenv.Streams(t, js).WithDefaults()
	done := make(chan error, 1)
	timer := time.AfterFunc(delay, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _, err := stream.EnsureStreams(ctx, js, cfg)
		done <- err
	})
	t.Cleanup(func() { timer.Stop() })
	return cfg, func() {
		t.Helper()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// A message published while its stream cannot answer is sent again, with
// the same Nats-Msg-Id, until the stream stores it: it is not lost, and a
// retried copy is not stored twice.
func TestPublisherRetriesUntilPubAck(t *testing.T) {
	t.Parallel()
	js, err := jetstream.New(testenv.NATSConn(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg, created := streamsLater(t, js, 700*time.Millisecond)
	pub, err := stream.NewPublisher(js.Conn(), stream.PublisherConfig{AckTimeout: time.Second, Retry: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, k := range []string{"k-1", "k-2", "k-1"} {
		if err := pub.Publish(ctx, stream.CommandMsg(cfg, "m_1", k, body("m_1", k, 100))); err != nil {
			t.Fatal(err)
		}
	}
	st := pub.Close()
	created()
	if st.Failed != 0 || st.Stored != 2 || st.Duplicates != 1 || st.Retried == 0 {
		t.Fatalf("stats %+v: want 2 stored, 1 duplicate, none failed, some retried", st)
	}
	s, err := js.Stream(ctx, cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 2 {
		t.Fatalf("stream holds %v messages (%v), want 2", info.State.Msgs, err)
	}

	// Retry < 0: the first failure is final.
	never, err := stream.NewPublisher(js.Conn(), stream.PublisherConfig{Retry: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := never.Publish(ctx, nats.NewMsg("nobody.listens."+testenv.Unique(t))); err != nil {
		t.Fatal(err)
	}
	if st := never.Close(); st.Failed != 1 || st.Retried != 0 {
		t.Fatalf("stats without retry %+v", st)
	}
}

// The gateway's publish retries within its timeout too; a refusal by the
// server (another stream expected) is not retried.
func TestCommandPublisherRetriesUntilPubAck(t *testing.T) {
	t.Parallel()
	nc := testenv.NATSConn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg, created := streamsLater(t, js, 700*time.Millisecond)
	p, err := stream.NewCommandPublisher(nc, cfg, 8*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: "k-1", Amount: 100, Currency: "usd", PaymentMethod: "pm_card_visa"}
	seq, err := p.Publish(ctx, cmd, nil, 0)
	created()
	if err != nil || seq != 1 {
		t.Fatalf("publish while the stream appears: seq %d, %v", seq, err)
	}
	if again, err := p.Publish(ctx, cmd, nil, 0); err != nil || again != seq {
		t.Fatalf("the same command again: seq %d (first %d), %v", again, seq, err)
	}

	// The subject belongs to another stream than the one expected: the
	// server refuses, at once.
	other := cfg
	other.Name = cfg.Name + "_OTHER"
	wrong, err := stream.NewCommandPublisher(nc, other, 8*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = wrong.Publish(ctx, cmd, nil, 0)
	var api *jetstream.APIError
	if !errors.As(err, &api) || time.Since(start) > 2*time.Second {
		t.Fatalf("publish to the wrong stream: %v after %v, want an API error at once", err, time.Since(start))
	}
	if stream.Retryable(err) || !stream.Retryable(jetstream.ErrNoStreamResponse) || !stream.Retryable(context.DeadlineExceeded) {
		t.Fatal("Retryable misclassifies")
	}
}
