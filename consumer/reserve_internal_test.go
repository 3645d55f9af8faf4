package consumer

import (
	"context"
	"testing"
	"time"
)

// reserve on an idle worker takes a whole fetch batch at once; on a
// saturated one (fewer than half a batch of slots free) it waits a moment
// for the slots that settling messages free, so that a busy worker claims
// fewer, bigger batches; and it never waits past its bound when nothing is
// freed, nor for a slot once ctx ends.
func TestReserveGathersABatchWhenSaturated(t *testing.T) {
	t.Parallel()
	w := &Worker{cfg: Config{FetchBatch: 8}}
	ctx := context.Background()

	idle := make(chan struct{}, 20)
	if n := w.reserve(ctx, idle); n != 8 {
		t.Fatalf("idle worker: reserved %d slots, want the fetch batch, 8", n)
	}

	fill := func(taken int) chan struct{} {
		s := make(chan struct{}, 10)
		for range taken {
			s <- struct{}{}
		}
		return s
	}
	// Two free, and three more freed 20 ms later: it waits for them (here
	// up to a minute, so that the test does not race the goroutine).
	patient := &Worker{cfg: w.cfg, gather: time.Minute}
	busy := fill(8)
	go func() {
		time.Sleep(20 * time.Millisecond)
		for range 3 {
			<-busy
		}
	}()
	if n := patient.reserve(ctx, busy); n < 4 {
		t.Fatalf("saturated worker: reserved %d slots, want it to wait for the 3 freed (at least 4)", n)
	}

	// Two free, none freed: back within its bound with what it had.
	stuck := fill(8)
	start := time.Now()
	if n := w.reserve(ctx, stuck); n != 2 {
		t.Fatalf("saturated worker, nothing freed: reserved %d slots, want 2", n)
	}
	if waited := time.Since(start); waited > reserveGather+100*time.Millisecond {
		t.Fatalf("saturated worker, nothing freed: waited %v, want about %v", waited, reserveGather)
	}

	// Fewer slots in all than half a batch (a small MaxAckPending): an idle
	// worker takes them all at once, it does not wait for slots that
	// cannot exist.
	small := make(chan struct{}, 3)
	start = time.Now()
	if n := patient.reserve(ctx, small); n != 3 {
		t.Fatalf("idle worker, 3 slots in all: reserved %d, want 3", n)
	}
	if waited := time.Since(start); waited > time.Second {
		t.Fatalf("idle worker, 3 slots in all: waited %v for slots that do not exist", waited)
	}

	// No slot free and ctx ended: 0, at once.
	full := fill(10)
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if n := w.reserve(ended, full); n != 0 {
		t.Fatalf("no slot and ctx ended: reserved %d, want 0", n)
	}
}
