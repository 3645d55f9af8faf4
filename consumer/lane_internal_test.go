package consumer

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/stream"
)

// TestLaneManagerPasses drives the lane manager pass by pass on a fake
// clock: with merchant A's backlog in front, it opens a lane for B (not
// for A, whose backlog the shared consumer works through) starting after
// what the shared consumer delivered; it deletes B's lane once idle for
// laneIdle, and does not open it again for the commands that lane passed;
// a new command of B opens it again, delivering only that command; once
// the backlog is gone every lane is deleted.
func TestLaneManagerPasses(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(testenv.NATSConn(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Stream: testenv.Streams(t, js), Lanes: 4, FetchBatch: 10}.WithDefaults()
	_, shared, err := stream.EnsureStreams(ctx, js, cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	publish := func(merchant string, n, from int) {
		t.Helper()
		for i := range n {
			if _, err := js.Publish(ctx, cfg.Stream.SubjectPrefix+"."+merchant, fmt.Appendf(nil, "%s-%d", merchant, from+i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	clock := time.Unix(0, 0)
	m := newLaneManager(js, cfg, nil)
	m.now = func() time.Time { return clock }
	pass := func() laneResult {
		t.Helper()
		res, err := m.runOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	drain := func(c jetstream.Consumer) []string {
		t.Helper()
		b, err := c.FetchNoWait(100)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for msg := range b.Messages() {
			got = append(got, string(msg.Data()))
			if err := msg.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return got
	}
	subjectB := cfg.Stream.SubjectPrefix + ".m_b"

	publish("m_a", 40, 0)
	publish("m_b", 2, 0)
	// The shared consumer delivered A's first 5 (and acked none).
	b, err := shared.FetchNoWait(5)
	if err != nil {
		t.Fatal(err)
	}
	for range b.Messages() {
	}
	publish("m_b", 1, 2)
	res := pass()
	if !slices.Equal(res.Open, []string{subjectB}) || !slices.Equal(res.Opened, []string{subjectB}) {
		t.Fatalf("pass with A's backlog: %+v, want B's lane opened", res)
	}
	lanes := m.open()
	if got := drain(lanes[0].cons); !slices.Equal(got, []string{"m_b-0", "m_b-1", "m_b-2"}) {
		t.Fatalf("B's lane delivered %q", got)
	}
	if res := pass(); len(res.Open) != 1 || len(res.Deleted) != 0 {
		t.Fatalf("pass right after: %+v, want the lane kept", res)
	}
	clock = clock.Add(laneIdle)
	if res := pass(); len(res.Open) != 0 || !slices.Equal(res.Deleted, []string{subjectB}) {
		t.Fatalf("pass after %v idle: %+v, want B's lane deleted", laneIdle, res)
	}
	if res := pass(); len(res.Open) != 0 {
		t.Fatalf("pass after the deletion: %+v, want no lane for what B's lane passed", res)
	}
	publish("m_b", 1, 3)
	if res := pass(); !slices.Equal(res.Opened, []string{subjectB}) {
		t.Fatalf("pass after B's new command: %+v, want B's lane again", res)
	}
	if got := drain(m.open()[0].cons); !slices.Equal(got, []string{"m_b-3"}) {
		t.Fatalf("B's new lane delivered %q, want only the new command", got)
	}
	// The backlog is gone: the shared consumer delivered everything.
	for {
		b, err := shared.FetchNoWait(100)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for range b.Messages() {
			n++
		}
		if n == 0 {
			break
		}
	}
	if res := pass(); len(res.Open) != 0 || !slices.Equal(res.Deleted, []string{subjectB}) {
		t.Fatalf("pass without a backlog: %+v, want every lane deleted", res)
	}
}
