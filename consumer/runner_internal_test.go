package consumer

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/payment"
)

// The runner runs every task, hands a task to a goroutine that finished
// one rather than start another, cancels a batch's context only after its
// last task, and stop leaves no goroutine behind (goleak in TestMain).
//
// A goroutine counts itself idle just before it parks, so a task handed
// over in between finds no receiver and starts a goroutine of its own (as
// it may in production: harmless). On a loaded machine that can happen in
// any one round; a runner that never reuses its goroutines starts three
// in every round, so the test asks for one round with a single goroutine.
func TestRunnerReusesGoroutinesAndReleasesBatches(t *testing.T) {
	t.Parallel()
	var started []int64
	for range 20 {
		n := runThreeTasksInTurn(t)
		if n == 1 {
			return
		}
		started = append(started, n)
	}
	t.Errorf("3 tasks one after another started %v goroutines in 20 rounds, want 1 in some round", started)
}

// runThreeTasksInTurn runs three tasks of one batch, each after the
// previous is over, and returns how many goroutines the runner started.
func runThreeTasksInTurn(t *testing.T) int64 {
	t.Helper()
	r := newRunner()
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	b := newBatchRefs(ctx, cancel, &wg)

	ran := make(chan int, 3)
	for i := range 3 {
		b.add()
		// One at a time: each task waits until the previous one is over,
		// so an idle goroutine is there to take it.
		if i > 0 {
			<-ran
			waitIdle(t, r)
		}
		r.do(task{run: func() { ran <- i }, batch: b})
	}
	<-ran
	if ctx.Err() != nil {
		t.Fatal("the batch's context was cancelled while its handler still holds it")
	}
	b.release() // the handler's own reference
	wg.Wait()
	if ctx.Err() == nil {
		t.Fatal("the batch's context was not cancelled after its last task")
	}
	r.stop()
	return r.started.Load()
}

// waitIdle waits until one of r's goroutines waits for work.
func waitIdle(t *testing.T, r *runner) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for r.idle.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no runner goroutine became idle")
		}
		time.Sleep(time.Millisecond)
	}
}

// A confirmed ack shares its batch's deadline while that has at least half
// of settleTimeout left, and gets one of its own after.
func TestAckContextSharedWhileFresh(t *testing.T) {
	t.Parallel()
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	b := newBatchRefs(ctx, cancel, &wg)
	defer b.release()
	got, done := b.ackContext()
	if got != b.ack {
		t.Error("a fresh batch's ack does not use the batch's context")
	}
	done()
	if b.ack.Err() != nil {
		t.Fatal("one ack's cancel ended the batch's shared context")
	}

	// The batch is old: its shared deadline is nearly over.
	b.ackCancel()
	b.ack, b.ackCancel = context.WithDeadline(b.settle, time.Now().Add(settleTimeout/2-time.Second))
	got, done = b.ackContext()
	defer done()
	if got == b.ack {
		t.Fatal("an ack late in its batch shares a deadline with less than settleTimeout/2 left")
	}
	if dl, ok := got.Deadline(); !ok || time.Until(dl) < settleTimeout-time.Second {
		t.Errorf("a late ack's own deadline is %v away, want settleTimeout", time.Until(dl))
	}
}

// A message's logger writes exactly what l.With of its attributes wrote:
// the same attributes in the same order, inside the same groups, through
// With and WithGroup, at the handler's levels.
func TestMessageLoggerMatchesWith(t *testing.T) {
	t.Parallel()
	meta := &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: 42}, NumDelivered: 3}
	cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: "k_1"}
	cases := []struct {
		name    string
		traceID string
		cmd     *payment.Command
		attempt int
	}{
		{"decoded, claimed", "4bf92f3577b34da6a3ce929d0e0e4736", cmd, 2},
		{"decoded, not claimed", "", cmd, 0},
		{"not decodable", "", nil, 0},
	}
	for _, c := range cases {
		var want, got bytes.Buffer
		noTime := func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}
		opts := &slog.HandlerOptions{Level: slog.LevelInfo, ReplaceAttr: noTime}
		wbase := slog.New(slog.NewJSONHandler(&want, opts)).With("service", "w")
		gbase := slog.New(slog.NewJSONHandler(&got, opts)).With("service", "w")

		args := []any{"stream_seq", meta.Sequence.Stream, "deliveries", meta.NumDelivered}
		if c.traceID != "" {
			args = append(args, "trace_id", c.traceID)
		}
		if c.cmd != nil {
			args = append(args, "merchant_id", c.cmd.MerchantID, "idempotency_key", c.cmd.IdempotencyKey)
		}
		if c.attempt > 0 {
			args = append(args, "attempt", c.attempt)
		}
		wl := wbase.With(args...)
		var m msgLog
		m.init(gbase, meta, c.traceID, c.cmd, c.attempt)
		gl := m.logger()

		for _, l := range []*slog.Logger{wl, gl} {
			l.Info("payment completed", "charge_id", "ch_1", slog.Bool("declined", false))
			l.Debug("not logged at info")
			l.With("error", "x").Warn("with")
			l.WithGroup("g").Error("group", "a", 1)
		}
		if got.String() != want.String() {
			t.Errorf("%s: message logger wrote\n%s\nwant (l.With)\n%s", c.name, got.String(), want.String())
		}
	}
}

// BenchmarkMessageLogLine is the worker's one line per payment, "payment
// completed", through a message's logger into the JSON handler the
// worker ships with (to io.Discard): its CPU and allocations per line.
func BenchmarkMessageLogLine(b *testing.B) {
	meta := &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: 42}, NumDelivered: 1}
	cmd := &payment.Command{MerchantID: "m_bench", IdempotencyKey: "550e8400-e29b-41d4-a716-446655440000"}
	base := slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo})).With("service", "paydedup-worker")
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		var m msgLog
		m.init(base, meta, "4bf92f3577b34da6a3ce929d0e0e4736", cmd, 1)
		m.logger().LogAttrs(ctx, slog.LevelInfo, "payment completed", slog.String("charge_id", "pi_3MtwBwLkdIwHu7ix28a3tqPa"),
			slog.Bool("declined", false), slog.Bool("processing", false), slog.String("decline_code", ""), slog.Bool("replayed", false))
	}
}
