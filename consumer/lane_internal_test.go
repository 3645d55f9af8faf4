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
// clock: with merchant A's backlog in front (found at two passes in a
// row), it opens a lane for B (not
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
	if res := pass(); len(res.Open) != 0 {
		t.Fatalf("first pass with A's backlog: %+v, want no lane until a second pass finds the backlog too", res)
	}
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

// TestLaneNotForTheNextMerchant: a big merchant C whose commands the shared
// consumer delivered and acked, but which the stream still stores (above
// the ack floor, pinned by one unacked message), has the most stored; then
// merchant A's burst makes the backlog. The backlog is A's, the merchant of
// the shared consumer's next messages, not C's: a lane opens for B only. A
// lane for A would start on the very messages the shared consumer delivers
// next, and both would claim each of them.
func TestLaneNotForTheNextMerchant(t *testing.T) {
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
	publish := func(merchant string, n int) {
		for i := range n {
			if _, err := js.Publish(ctx, cfg.Stream.SubjectPrefix+"."+merchant, fmt.Appendf(nil, "%s-%d", merchant, i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish("m_x", 1) // delivered, never acked: pins the ack floor
	publish("m_c", 100)
	b, err := shared.FetchNoWait(101)
	if err != nil {
		t.Fatal(err)
	}
	for msg := range b.Messages() {
		if msg.Subject() != cfg.Stream.SubjectPrefix+".m_x" {
			_ = msg.DoubleAck(ctx)
		}
	}
	publish("m_a", 60) // the backlog
	publish("m_b", 2)  // a merchant behind it
	m := newLaneManager(js, cfg, nil)
	if _, err := m.runOnce(ctx); err != nil { // the first pass that finds the backlog opens no lane
		t.Fatal(err)
	}
	res, err := m.runOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{cfg.Stream.SubjectPrefix + ".m_b"}; !slices.Equal(res.Opened, want) {
		t.Fatalf("lanes opened %v (backlog %d), want %v only", res.Opened, res.Backlog, want)
	}
}

// TestLaneManagerHysteresis drives the lane manager on a fixed clock
// through a backlog that comes and goes around the thresholds: between
// one and laneOpenBatches fetch batches pending no lane opens, nor at the
// first pass past them; once the
// backlog is down to a batch a lane with a message in work stays until it
// settles, and its deletion records what it passed, so that when the
// backlog comes back the lane does not open again for it, only for a new
// command.
func TestLaneManagerHysteresis(t *testing.T) {
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
	deliver := func(n int) { // the shared consumer delivers n, acks none
		t.Helper()
		b, err := shared.FetchNoWait(n)
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for range b.Messages() {
			got++
		}
		if got != n {
			t.Fatalf("shared consumer delivered %d, want %d", got, n)
		}
	}
	m := newLaneManager(js, cfg, nil)
	m.now = func() time.Time { return time.Unix(0, 0) } // no lane is ever idle for laneIdle
	pass := func() laneResult {
		t.Helper()
		res, err := m.runOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	subjectB := cfg.Stream.SubjectPrefix + ".m_b"

	publish("m_a", 30, 0)
	publish("m_b", 1, 0)
	deliver(15)
	if res := pass(); len(res.Open) != 0 {
		t.Fatalf("pass with %d pending (between one and %d batches): %+v, want no lane", res.Backlog, laneOpenBatches, res)
	}
	publish("m_a", 8, 30)
	publish("m_b", 1, 1)
	pass()
	if res := pass(); !slices.Equal(res.Opened, []string{subjectB}) {
		t.Fatalf("pass with %d pending: %+v, want B's lane", res.Backlog, res)
	}
	b, err := m.open()[0].cons.FetchNoWait(2)
	if err != nil {
		t.Fatal(err)
	}
	var held []jetstream.Msg
	for msg := range b.Messages() {
		held = append(held, msg)
	}
	if len(held) != 2 {
		t.Fatalf("B's lane delivered %d, want 2", len(held))
	}
	if err := held[0].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	deliver(16) // down to 9 pending: the backlog is over
	if res := pass(); !slices.Equal(res.Open, []string{subjectB}) || len(res.Deleted) != 0 {
		t.Fatalf("pass after the backlog, B's lane with a message in work: %+v, want it kept", res)
	}
	if err := held[1].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	if res := pass(); len(res.Open) != 0 || !slices.Equal(res.Deleted, []string{subjectB}) {
		t.Fatalf("pass after the lane's message settled: %+v, want B's lane deleted", res)
	}
	publish("m_a", 15, 38) // the backlog is back
	for range 2 {
		if res := pass(); len(res.Open) != 0 {
			t.Fatalf("pass with the backlog back: %+v, want no lane for what B's lane passed", res)
		}
	}
	publish("m_b", 1, 2)
	if res := pass(); !slices.Equal(res.Opened, []string{subjectB}) {
		t.Fatalf("pass after B's new command: %+v, want B's lane again", res)
	}
	b, err = m.open()[0].cons.FetchNoWait(10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for msg := range b.Messages() {
		got = append(got, string(msg.Data()))
	}
	if !slices.Equal(got, []string{"m_b-2"}) {
		t.Fatalf("B's new lane delivered %q, want only the new command", got)
	}
}

// TestLaneManagerOpensAtOnceBehindADeepBacklog: a backlog of more than
// laneDeepBatches fetch batches is no passing burst: the lanes open at the
// first look, not the second, so a merchant behind it waits one tick less.
func TestLaneManagerOpensAtOnceBehindADeepBacklog(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(testenv.NATSConn(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Stream: testenv.Streams(t, js), Lanes: 4, FetchBatch: 10}.WithDefaults()
	if _, _, err := stream.EnsureStreams(ctx, js, cfg.Stream); err != nil {
		t.Fatal(err)
	}
	for i := range laneDeepBatches*10 + 1 {
		if _, err := js.Publish(ctx, cfg.Stream.SubjectPrefix+".m_a", fmt.Appendf(nil, "a-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.Publish(ctx, cfg.Stream.SubjectPrefix+".m_b", []byte("b-0")); err != nil {
		t.Fatal(err)
	}
	m := newLaneManager(js, cfg, nil)
	res, err := m.runOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{cfg.Stream.SubjectPrefix + ".m_b"}; !slices.Equal(res.Opened, want) {
		t.Fatalf("first pass with %d pending: %+v, want B's lane", res.Backlog, res)
	}
}
