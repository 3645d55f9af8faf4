package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/client"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/stream"
)

// TestFollowOutcomes: a follower sees the merchant's events, only its
// own, in the stream's order, each once when a relay published one again
// within the duplicate window; it resumes after a stored sequence; a
// message that is not an event stops it with an error naming the message,
// never skipped; its context's end returns nil.
func TestFollowOutcomes(t *testing.T) {
	t.Parallel()
	nc := testenv.NATSConn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	u := testenv.Unique(t)
	cfg := stream.Config{OutcomeStream: "OUTCOMES_" + strings.ToUpper(u), OutcomePrefix: "outcomes." + u}
	if _, err := stream.EnsureOutcomeStream(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), cfg.OutcomeStream) })
	publish := func(merchant, key, kind, status string) {
		t.Helper()
		m, err := stream.OutcomeMsg(cfg, ledger.OutcomeEvent{EventID: merchant + ":" + key + ":" + kind, MerchantID: merchant,
			IdempotencyKey: key, Seq: 1, Kind: kind, Status: status, Amount: 1999, Currency: "usd", OccurredAt: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	publish("m_a", "k1", "charged", "succeeded")
	publish("m_b", "k9", "charged", "succeeded")
	publish("m_a", "k1", "charged", "succeeded") // the relay again: dropped by its id
	publish("m_a", "k2", "declined", "declined")
	publish("m_a", "k3", "refused", "refused")

	errEnough := errors.New("enough")
	follow := func(after uint64, n int) ([]uint64, []string, error) {
		t.Helper()
		fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		var seqs []uint64
		var ids []string
		err := client.FollowOutcomes(fctx, nc, client.OutcomesConfig{MerchantID: "m_a", Stream: cfg, After: after},
			func(seq uint64, e client.OutcomeEvent) error {
				seqs, ids = append(seqs, seq), append(ids, e.EventID)
				if len(ids) == n {
					return errEnough
				}
				return nil
			})
		return seqs, ids, err
	}
	seqs, ids, err := follow(0, 3)
	if !errors.Is(err, errEnough) || strings.Join(ids, " ") != "m_a:k1:charged m_a:k2:declined m_a:k3:refused" {
		t.Fatalf("followed %v (%v), want m_a's three events once each in order", ids, err)
	}
	if _, ids, err := follow(seqs[0], 2); !errors.Is(err, errEnough) || strings.Join(ids, " ") != "m_a:k2:declined m_a:k3:refused" {
		t.Fatalf("resumed after %d: %v (%v), want the two after it", seqs[0], ids, err)
	}

	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: cfg.OutcomeSubject("m_a"), Data: []byte(`{"schema":"other"}`)}); err != nil {
		t.Fatal(err)
	}
	if _, ids, err := follow(seqs[2], 1); err == nil || errors.Is(err, errEnough) || !strings.Contains(err.Error(), "message 5") {
		t.Fatalf("a message that is no event: %v (%v), want an error naming message 5", ids, err)
	}

	quiet, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	if err := client.FollowOutcomes(quiet, nc, client.OutcomesConfig{MerchantID: "m_c", Stream: cfg}, func(uint64, client.OutcomeEvent) error {
		return errors.New("m_c has no events")
	}); err != nil {
		t.Fatalf("a follower whose context ended: %v, want nil", err)
	}
	if err := client.FollowOutcomes(ctx, nc, client.OutcomesConfig{MerchantID: "", Stream: cfg}, nil); err == nil {
		t.Fatal("a follower with no merchant started")
	}
}
