package stream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/stream"
)

// A Publisher told its stream refuses at once a message that finds no
// responders because the stream does not exist (ErrStreamMissing, not
// stored), instead of resending it for Retry as for a leader change.
func TestPublisherMissingStreamRefusedAtOnce(t *testing.T) {
	t.Parallel()
	nc := testenv.NATSConn(t)
	var results []stream.PublishResult
	pub, err := stream.NewPublisher(nc, stream.PublisherConfig{Stream: "NONE_" + testenv.Unique(t), Retry: 30 * time.Second,
		OnResult: func(r stream.PublishResult) { results = append(results, r) }})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := pub.Publish(context.Background(), nats.NewMsg("nobody.listens."+testenv.Unique(t))); err != nil {
		t.Fatal(err)
	}
	st := pub.Close()
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("took %v, want the refusal at once", took)
	}
	if st.Refused != 1 || st.Unknown != 0 || len(results) != 1 || !results[0].Refused || !errors.Is(results[0].Err, stream.ErrStreamMissing) {
		t.Fatalf("stats %+v, results %+v: want one refusal for the missing stream", st, results)
	}
}
