package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/dedup"
)

// batchStore answers CompleteBatch with a fixed error per key; the other
// Store methods are not used by the committer.
type batchStore struct {
	Store
	byKey map[string]error
	err   error

	mu      sync.Mutex
	batches [][]string
}

func (s *batchStore) CompleteBatch(_ context.Context, items []dedup.CompleteItem) ([]error, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
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
	want := map[string]error{"ok": nil, "lost": dedup.ErrLeaseLost, "conflict": dedup.ErrLedgerConflict}
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
					err := c.Complete(context.Background(), dedup.Lease{MerchantID: "m_1", IdempotencyKey: key, Holder: "w", Attempt: 1}, dedup.Completion{})
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
