package stream_test

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/stream"
)

// The publisher checks every duplicate PubAck against the message the
// stream holds under the Nats-Msg-Id: the same bytes, or the same command
// written otherwise, is a duplicate; another payment under the key is a
// reused key (not stored); a message that can no longer be read (deleted
// while its id is still in the window) is unknown, never a duplicate.
func TestPublisherChecksDuplicates(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	var results []stream.PublishResult
	pub, err := stream.NewPublisher(js.Conn(), stream.PublisherConfig{Window: 8, OnResult: func(r stream.PublishResult) {
		results = append(results, r)
	}})
	if err != nil {
		t.Fatal(err)
	}
	send := func(key string, data []byte) {
		t.Helper()
		if err := pub.Publish(ctx, stream.CommandMsg(cfg, "m_1", key, data)); err != nil {
			t.Fatal(err)
		}
	}
	send("k-1", body("m_1", "k-1", 100))
	send("k-1", body("m_1", "k-1", 100)) // byte for byte
	send("k-1", []byte(`{"payment_method":"pm_card_visa", "currency":"usd", "amount":100, "merchant_id":"m_1", "idempotency_key":"k-1"}`))
	send("k-1", body("m_1", "k-1", 101)) // another payment under the key
	send("k-2", body("m_1", "k-2", 100))
	st := pub.Close()
	if st.Stored != 2 || st.Duplicates != 2 || st.Reused != 1 || st.Failed != 1 || st.Unknown != 0 || st.Outstanding() != 0 {
		t.Fatalf("stats %+v: want 2 stored, 2 duplicates, 1 reused", st)
	}
	if r := results[3]; !r.Reused || r.Duplicate || r.Err != nil || r.Seq != 1 || r.Stream != cfg.Name {
		t.Fatalf("another payment under k-1: %+v, want reused, held by %s #1", r, cfg.Name)
	}
	if r := results[2]; !r.Duplicate || r.Reused || r.Seq != 1 {
		t.Fatalf("the same payment written otherwise: %+v, want a duplicate of #1", r)
	}

	// The message holding k-2's id is deleted while the id is still in the
	// window: the duplicate cannot be checked.
	s, err := js.Stream(ctx, cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteMsg(ctx, results[4].Seq); err != nil {
		t.Fatal(err)
	}
	results = nil
	pub, err = stream.NewPublisher(js.Conn(), stream.PublisherConfig{OnResult: func(r stream.PublishResult) {
		results = append(results, r)
	}})
	if err != nil {
		t.Fatal(err)
	}
	send("k-2", body("m_1", "k-2", 100))
	st = pub.Close()
	r := results[0]
	if st.Unknown != 1 || st.Failed != 1 || !r.Unknown() || r.Duplicate || r.Reused || !strings.Contains(r.Err.Error(), "could not be read") {
		t.Fatalf("a duplicate of a deleted message: %+v, result %+v, want unknown", st, r)
	}
	if r.Msg.Header.Get(nats.MsgIdHdr) != "m_1:k-2" {
		t.Fatalf("result for %v", r.Msg.Header)
	}
}
