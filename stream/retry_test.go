package stream_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// streamsLater gives a test its own topology whose payments stream takes
// its subjects only after delay, as a stream without a leader yet looks to
// a publisher (no responders, while the stream exists: a stream that does
// not exist is a refusal); it returns the configuration and a wait for
// the streams.
func streamsLater(t *testing.T, js jetstream.JetStream, delay time.Duration) (stream.Config, func()) {
	t.Helper()
	cfg := testenv.Streams(t, js).WithDefaults()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Name, Subjects: []string{cfg.SubjectPrefix + "-later.>"}}); err != nil {
		t.Fatal(err)
	}
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

// commandPublisherLater is a command publisher (8 s timeout) on a
// topology whose streams appear only after 700 ms (see streamsLater).
func commandPublisherLater(t *testing.T) (jetstream.JetStream, stream.Config, *stream.CommandPublisher, func()) {
	t.Helper()
	js, err := jetstream.New(testenv.NATSConn(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg, created := streamsLater(t, js, 700*time.Millisecond)
	p, err := stream.NewCommandPublisher(js.Conn(), cfg, 8*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return js, cfg, p, created
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
	js, cfg, p, created := commandPublisherLater(t)
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
	wrong, err := stream.NewCommandPublisher(js.Conn(), other, 8*time.Second)
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

// A batch publish awaits every PubAck: commands sent while the stream
// cannot answer are sent again until it stores them (a twin in the batch
// gets the first copy's sequence), and a command the stream refuses, or
// that cannot be built, fails alone.
func TestCommandPublisherBatchAwaitsEveryPubAck(t *testing.T) {
	t.Parallel()
	js, cfg, p, created := commandPublisherLater(t)
	ctx := context.Background()
	cmd := func(key, desc string) *payment.Command {
		return &payment.Command{MerchantID: "m_1", IdempotencyKey: key, Amount: 100, Currency: "usd", PaymentMethod: "pm_card_visa", Description: desc}
	}
	var batch []stream.BatchCommand
	for _, k := range []string{"k-1", "k-2", "k-3", "k-1"} {
		batch = append(batch, stream.BatchCommand{Cmd: cmd(k, "")})
	}
	res := p.PublishBatch(ctx, batch)
	created()
	seqs := map[uint64]bool{}
	for i, r := range res {
		if r.Err != nil || r.Seq == 0 {
			t.Fatalf("command %d while the stream appears: seq %d, %v", i, r.Seq, r.Err)
		}
		seqs[r.Seq] = true
	}
	if len(seqs) != 3 || res[3].Seq != res[0].Seq {
		t.Fatalf("sequences %+v: want 3 distinct, the twin with the first's", res)
	}

	// The stream now refuses messages over 512 bytes: the long command
	// fails, with the server's refusal, and the others are stored.
	s, err := js.Stream(ctx, cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	sc := s.CachedInfo().Config
	sc.MaxMsgSize = 512
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res = p.PublishBatch(ctx, []stream.BatchCommand{
		{Cmd: cmd("k-4", "")},
		{Cmd: cmd("k-5", strings.Repeat("x", 1000))},
		{Cmd: nil},
		{Cmd: cmd("k-6", ""), Republish: 2},
	})
	var api *jetstream.APIError
	switch {
	case res[0].Err != nil || res[3].Err != nil || res[0].Seq != 4 || res[3].Seq != 5:
		t.Fatalf("the good commands: %+v, want seqs 4 and 5", res)
	case !errors.As(res[1].Err, &api):
		t.Fatalf("the long command: %+v, want the server's refusal", res[1])
	case res[2].Err == nil:
		t.Fatal("a nil command published")
	case time.Since(start) > 2*time.Second:
		t.Fatalf("a refusal was retried: %v", time.Since(start))
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 5 {
		t.Fatalf("stream holds %v messages (%v), want 5", info.State.Msgs, err)
	}
}
