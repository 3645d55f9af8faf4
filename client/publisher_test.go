package client_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/client"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/stream"
)

// TestPublishLostPubAckStoredOnce: the stream stores the command and its
// PubAck is lost on the way back. The publisher sends the same message
// (same Nats-Msg-Id) again once the link is back; the stream drops the
// copy and the publish is reported as a duplicate of what it stored: one
// message. Another payment under the key is refused: by the publisher
// itself, and, from another publisher, by the stream's duplicate window
// (ErrKeyReused), nothing stored.
func TestPublishLostPubAckStoredOnce(t *testing.T) {
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
	u, err := url.Parse(testenv.NATSURL(t))
	if err != nil {
		t.Fatal(err)
	}
	link := testenv.NewLink(t, "publisher-nats", u.Host)
	nc, err := nats.Connect(link.URL("nats"), nats.Timeout(5*time.Second), nats.ReconnectWait(50*time.Millisecond), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	pub, err := client.NewPublisher(nc, client.PublisherConfig{MerchantID: "m_a", Stream: cfg, Timeout: 2 * time.Second, RetryFor: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	msgs := func() uint64 {
		s, err := js.Stream(ctx, cfg.Name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}

	if err := link.Lose(testenv.ServerToClient); err != nil {
		t.Fatal(err)
	}
	type published struct {
		p   client.Published
		err error
	}
	done := make(chan published, 1)
	go func() {
		p, err := pub.Publish(ctx, "k-1", visa(100))
		done <- published{p, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for msgs() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the stream never stored the command")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case r := <-done:
		t.Fatalf("the publish ended with its PubAck lost: %+v, %v", r.p, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := link.Restore(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || !r.p.Duplicate || r.p.Seq == 0 || r.p.Stream != cfg.Name {
		t.Fatalf("the publish after its lost PubAck: %+v, %v; want a duplicate of the stored copy", r.p, r.err)
	}
	if n := msgs(); n != 1 {
		t.Fatalf("%d messages, want the command stored once", n)
	}

	again, err := pub.Publish(ctx, "k-1", visa(100))
	if err != nil || !again.Duplicate || again.Seq != r.p.Seq {
		t.Fatalf("the same payment again: %+v, %v; want a duplicate", again, err)
	}
	if _, err := pub.Publish(ctx, "k-1", visa(150)); !errors.Is(err, client.ErrKeyReused) {
		t.Fatalf("another payment under the key: %v, want ErrKeyReused", err)
	}
	other, err := client.NewPublisher(js.Conn(), client.PublisherConfig{MerchantID: "m_a", Stream: cfg, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Publish(ctx, "k-1", visa(150)); !errors.Is(err, client.ErrKeyReused) || !errors.Is(err, stream.ErrMsgIDTaken) {
		t.Fatalf("another payment under the key from another publisher: %v, want ErrKeyReused", err)
	}
	if n := msgs(); n != 1 {
		t.Fatalf("%d messages, want 1", n)
	}
	fresh, err := other.Publish(ctx, "k-2", visa(150))
	if err != nil || fresh.Duplicate || fresh.Seq == r.p.Seq {
		t.Fatalf("a new key: %+v, %v", fresh, err)
	}
}

// TestPublishGivingUpIsOutcomeUnknown: no PubAck ever comes back; the
// publisher gives up after RetryFor with ErrOutcomeUnknown (the command
// may be stored: publish it again later, same key and payment), not a
// refusal.
func TestPublishGivingUpIsOutcomeUnknown(t *testing.T) {
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
	u, err := url.Parse(testenv.NATSURL(t))
	if err != nil {
		t.Fatal(err)
	}
	link := testenv.NewLink(t, "publisher-nats", u.Host)
	nc, err := nats.Connect(link.URL("nats"), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	pub, err := client.NewPublisher(nc, client.PublisherConfig{MerchantID: "m_a", Stream: cfg, Timeout: time.Second, RetryFor: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := link.Lose(testenv.ServerToClient); err != nil {
		t.Fatal(err)
	}
	_, err = pub.Publish(ctx, "k-lost", visa(100))
	if !errors.Is(err, client.ErrOutcomeUnknown) || stream.Refused(err) {
		t.Fatalf("no PubAck: %v, want ErrOutcomeUnknown", err)
	}
}
