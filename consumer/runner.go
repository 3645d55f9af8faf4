package consumer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// runnerIdle is how long a runner goroutine with nothing to do waits for
// the next message's work before it exits.
const runnerIdle = 5 * time.Second

// runner runs the messages' work on goroutines that outlive one message.
// A payment's goroutine grows its stack through the frames of the claim,
// the provider call and the commit; a new goroutine per payment grew, and
// copied, its stack several times for every payment. A goroutine that
// finishes a task takes the next one offered while it waits (a task never
// waits for a goroutine: with none idle, it gets a new one), and exits
// after runnerIdle without one or when the runner stops.
type runner struct {
	work chan task
	quit chan struct{}
	wg   sync.WaitGroup

	started atomic.Int64 // goroutines started, for tests
	idle    atomic.Int64 // goroutines waiting for a task, for tests
}

// task is one message's work and the batch that waits for it.
type task struct {
	run   func()
	batch *batchRefs
}

func newRunner() *runner {
	return &runner{work: make(chan task), quit: make(chan struct{})}
}

// do runs t on an idle goroutine, or on a new one when none is idle. The
// batch must already count t (batchRefs.add).
func (r *runner) do(t task) {
	select {
	case r.work <- t:
	default:
		r.wg.Add(1)
		r.started.Add(1)
		go r.loop(t)
	}
}

func (r *runner) loop(t task) {
	defer r.wg.Done()
	idle := time.NewTimer(runnerIdle)
	defer idle.Stop()
	for {
		t.run()
		t.batch.release()
		t.batch.wg.Done()
		idle.Reset(runnerIdle)
		r.idle.Add(1)
		select {
		case t = <-r.work:
			r.idle.Add(-1)
		case <-idle.C:
			return
		case <-r.quit:
			return
		}
	}
}

// stop makes the idle goroutines exit and waits for them. Call it once,
// after every task given to do has finished.
func (r *runner) stop() {
	close(r.quit)
	r.wg.Wait()
}

// batchRefs is a fetched batch's shared state. It counts the batch's
// unfinished work: its handler and each task it gave the runner. The
// batch's context is cancelled when the last of them finishes. wg is the
// worker's count of work in flight, which a drain waits for: each task is
// in it from add until it finishes.
type batchRefs struct {
	n      atomic.Int64
	cancel context.CancelFunc
	wg     *sync.WaitGroup

	// settle is the context settling runs on: the batch's, without its
	// cancellation (see Worker.settle). ack has a deadline settleTimeout
	// after the batch began; the confirmed acks of the batch's messages
	// share it (ackContext).
	settle    context.Context
	ack       context.Context
	ackCancel context.CancelFunc
}

func newBatchRefs(ctx context.Context, cancel context.CancelFunc, wg *sync.WaitGroup) *batchRefs {
	b := &batchRefs{cancel: cancel, wg: wg, settle: context.WithoutCancel(ctx)}
	b.ack, b.ackCancel = context.WithDeadline(b.settle, time.Now().Add(settleTimeout))
	b.n.Store(1)
	return b
}

// add counts one more task of the batch.
func (b *batchRefs) add() {
	b.n.Add(1)
	b.wg.Add(1)
}

// release drops one reference; the last cancels the batch's contexts.
func (b *batchRefs) release() {
	if b.n.Add(-1) == 0 {
		b.ackCancel()
		b.cancel()
	}
}

// ackContext returns the context a confirmed ack waits under, and its
// cancel: a deadline at least settleTimeout/2 and at most settleTimeout
// away. It is the batch's shared one while that has half of settleTimeout
// left, which covers the messages that settle with their batch's group
// commits, rather than a context and a timer per message.
func (b *batchRefs) ackContext() (context.Context, context.CancelFunc) {
	if dl, _ := b.ack.Deadline(); time.Until(dl) >= settleTimeout/2 {
		return b.ack, func() {}
	}
	return context.WithDeadline(b.settle, time.Now().Add(settleTimeout))
}
