package consumer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/stream"
)

// TestTrimmerSurvivesARecreatedStream: the trimmer purged the settled
// commands of the payments stream, then the stream is deleted and created
// again (a lost JetStream store, an operator recreating it) under the
// running trimmer. The new commands start again at low sequences, below
// the floor the trimmer read on its previous pass: none of them is purged
// until the new consumer acks it.
func TestTrimmerSurvivesARecreatedStream(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js, err := jetstream.New(testenv.NATSConn(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Stream: testenv.Streams(t, js)}.WithDefaults()
	tr := &streamTrimmer{js: js, cfg: cfg}
	publish := func(n int, from int) {
		t.Helper()
		for i := range n {
			if _, err := js.Publish(ctx, cfg.Stream.SubjectPrefix+".m_1", []byte(fmt.Sprintf("cmd-%d", from+i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	msgs := func() uint64 {
		t.Helper()
		s, err := js.Stream(ctx, cfg.Stream.Name)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().State.Msgs
	}
	pass := func() trimResult {
		t.Helper()
		res, err := tr.runOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}

	_, cons, err := stream.EnsureStreams(ctx, js, cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	publish(20, 0)
	batch, err := cons.Fetch(20, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pass()
	if res := pass(); res.Purged != 20 || msgs() != 0 {
		t.Fatalf("second pass purged %d (bound %d), %d left; want the 20 settled commands purged", res.Purged, res.Bound, msgs())
	}

	// The stream is lost and created again; new commands arrive, none
	// settled yet.
	if err := js.DeleteStream(ctx, cfg.Stream.Name); err != nil {
		t.Fatal(err)
	}
	if _, _, err := stream.EnsureStreams(ctx, js, cfg.Stream); err != nil {
		t.Fatal(err)
	}
	publish(5, 100)
	for range 3 {
		if res := pass(); res.Purged != 0 {
			t.Fatalf("the trimmer purged %d new commands below %d after the stream was recreated (floor now %d)", res.Purged, res.Bound, res.Floor)
		}
	}
	if n := msgs(); n != 5 {
		t.Fatalf("%d commands in the recreated stream, want the 5 unsettled ones", n)
	}
}
