package client_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/client"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/stream"
)

// TestPublishRefusedAfterUnknownIsOutcomeUnknown: the first Publish
// stores the command but loses its PubAck (ErrOutcomeUnknown: publish it
// again later, same key and payment). Later, past the duplicate window,
// the stream is full: the second Publish's refusal says nothing of the
// stored copy, so it is ErrOutcomeUnknown, not a refusal.
func TestPublishRefusedAfterUnknownIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	js, err := jetstream.New(testenv.NATSConn(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cfg := testenv.Streams(t, js)
	cfg.DuplicateWindow = 2 * time.Second
	cfg.StreamMaxMsgs = 1
	cfg = cfg.WithDefaults()
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
	pub, err := client.NewPublisher(nc, client.PublisherConfig{MerchantID: "m_a", Stream: cfg, Timeout: time.Second, RetryFor: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := link.Lose(testenv.ServerToClient); err != nil {
		t.Fatal(err)
	}
	_, err = pub.Publish(ctx, "k", visa(100))
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("first, PubAck lost: %v, want ErrOutcomeUnknown", err)
	}
	if err := link.Restore(); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("the stream holds %d messages after the lost PubAck, want k's command", info.State.Msgs)
	}
	time.Sleep(cfg.DuplicateWindow + time.Second) // past the duplicate window: the stream refuses, full
	_, err = pub.Publish(ctx, "k", visa(100))
	if !errors.Is(err, client.ErrOutcomeUnknown) || stream.Refused(err) {
		t.Fatalf("the stream holds k's command, yet the second publish answers %v (refused %v)", err, stream.Refused(err))
	}
	if !strings.Contains(err.Error(), stream.ErrStreamFull.Error()) {
		t.Fatalf("second publish: %v, want the full stream named as its cause", err)
	}
}

// TestRetryForPastDuplicateWindowRefused: a RetryFor that reaches the
// stream's duplicate window could store a second copy of the command under
// the same Nats-Msg-Id; NewPublisher refuses it.
func TestRetryForPastDuplicateWindowRefused(t *testing.T) {
	t.Parallel()
	nc := testenv.NATSConn(t)
	cfg := stream.Config{DuplicateWindow: 30 * time.Second}
	for _, tc := range []struct {
		retryFor time.Duration
		ok       bool
	}{{29 * time.Second, true}, {30 * time.Second, false}, {time.Minute, false}} {
		_, err := client.NewPublisher(nc, client.PublisherConfig{MerchantID: "m_a", Stream: cfg, RetryFor: tc.retryFor})
		if (err == nil) != tc.ok {
			t.Errorf("RetryFor %v with a 30 s duplicate window: %v, want ok=%v", tc.retryFor, err, tc.ok)
		}
	}
	// The default RetryFor reaches a 1 min window.
	if _, err := client.NewPublisher(nc, client.PublisherConfig{MerchantID: "m_a", Stream: stream.Config{DuplicateWindow: time.Minute}}); err == nil {
		t.Error("the default RetryFor (1 min) with a 1 min duplicate window: accepted")
	}
}
