package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/ledger"
)

// batchStore answers CompleteBatch with a fixed error per key; the other
// Store methods are not used by the committer.
type batchStore struct {
	Store
	byKey map[string]error
	err   error

	mu        sync.Mutex
	batches   [][]string
	deadlines []time.Time // each flush's context deadline (zero: none)
}

func (s *batchStore) Complete(ctx context.Context, l ledger.Lease, _ ledger.Completion) error {
	_, err := s.CompleteBatch(ctx, []ledger.CompleteItem{{Lease: l}})
	return err
}

func (s *batchStore) CompleteBatch(ctx context.Context, items []ledger.CompleteItem) ([]error, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, _ := ctx.Deadline()
	s.deadlines = append(s.deadlines, d)
	var keys []string
	errs := make([]error, len(items))
	for i, it := range items {
		keys = append(keys, it.Lease.IdempotencyKey)
		errs[i] = s.byKey[it.Lease.IdempotencyKey]
	}
	s.batches = append(s.batches, keys)
	if s.err != nil {
		return nil, s.err
	}
	return errs, nil
}

// TestGroupCommitHandsEachCallerItsOwnResult: the callers sharing one group
// commit each get their own item's result, so a lost lease or a ledger
// conflict in the batch is never reported to its caller as committed (which
// would ack it), and a failed flush fails every caller.
func TestGroupCommitHandsEachCallerItsOwnResult(t *testing.T) {
	t.Parallel()
	want := map[string]error{"ok": nil, "lost": ledger.ErrLeaseLost, "conflict": ledger.ErrLedgerConflict}
	flushErr := errors.New("database down")
	for _, failFlush := range []bool{false, true} {
		t.Run(fmt.Sprintf("flush_fails=%v", failFlush), func(t *testing.T) {
			t.Parallel()
			st := &batchStore{byKey: want}
			if failFlush {
				st.err = flushErr
			}
			c := newCommitter(st, len(want), time.Minute) // flushed when full, not by the timer
			got := map[string]error{}
			var mu sync.Mutex
			var wg sync.WaitGroup
			for key := range want {
				wg.Add(1)
				go func() {
					defer wg.Done()
					err := c.Complete(context.Background(), time.Now().Add(time.Minute), ledger.Lease{MerchantID: "m_1", IdempotencyKey: key, Holder: "w", Attempt: 1}, ledger.Completion{})
					mu.Lock()
					got[key] = err
					mu.Unlock()
				}()
			}
			wg.Wait()
			if len(st.batches) != 1 || len(st.batches[0]) != len(want) {
				t.Fatalf("batches %v, want one of %d items", st.batches, len(want))
			}
			for key, w := range want {
				if failFlush {
					w = flushErr
				}
				if !errors.Is(got[key], w) || (w == nil && got[key] != nil) {
					t.Errorf("caller of %s got %v, want %v", key, got[key], w)
				}
			}
		})
	}
}

// TestGroupCommitFlushesByTheLeadersDeadline: the flush runs under the
// deadline its leader was given (the worker's settle deadline), with or
// without batching: the deadline is made by the committer, not passed in a
// context.
func TestGroupCommitFlushesByTheLeadersDeadline(t *testing.T) {
	t.Parallel()
	first, second := time.Now().Add(time.Hour), time.Now().Add(2*time.Hour)
	lease := func(key string) ledger.Lease {
		return ledger.Lease{MerchantID: "m_1", IdempotencyKey: key, Holder: "w", Attempt: 1}
	}

	st := &batchStore{}
	c := newCommitter(st, 2, time.Minute) // flushed when full
	done := make(chan error, 1)
	go func() { done <- c.Complete(context.Background(), first, lease("a"), ledger.Completion{}) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		led := c.cur != nil && len(c.cur.items) == 1
		c.mu.Unlock()
		if led {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first caller never started a batch")
		}
	}
	if err := c.Complete(context.Background(), second, lease("b"), ledger.Completion{}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(st.deadlines) != 1 || !st.deadlines[0].Equal(first) {
		t.Fatalf("flush deadlines %v, want one flush by the leader's %v", st.deadlines, first)
	}

	single := &batchStore{}
	if err := newCommitter(single, 1, 0).Complete(context.Background(), second, lease("c"), ledger.Completion{}); err != nil {
		t.Fatal(err)
	}
	if len(single.deadlines) != 1 || !single.deadlines[0].Equal(second) {
		t.Fatalf("unbatched commit deadlines %v, want %v", single.deadlines, second)
	}
}
