package storehook_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/lab/storehook"
	"github.com/paydedup/paydedup/ledger"
)

// The wrapper is a worker's store.
var _ consumer.Store = (*storehook.Wrapper)(nil)

// recorder is a store that records which methods reached it.
type recorder struct{ got []string }

func (r *recorder) ClaimBatch(_ context.Context, _ string, _ time.Duration, reqs []ledger.ClaimRequest) ([]ledger.ClaimResult, error) {
	r.got = append(r.got, "ClaimBatch")
	return make([]ledger.ClaimResult, len(reqs)), nil
}

func (r *recorder) Heartbeat(_ context.Context, l ledger.Lease, d time.Duration) (ledger.Lease, error) {
	r.got = append(r.got, "Heartbeat")
	l.Until = l.Until.Add(d)
	return l, nil
}

func (r *recorder) Complete(context.Context, ledger.Lease, ledger.Completion) error {
	r.got = append(r.got, "Complete")
	return nil
}

func (r *recorder) CompleteBatch(_ context.Context, items []ledger.CompleteItem) ([]error, error) {
	r.got = append(r.got, "CompleteBatch")
	return make([]error, len(items)), nil
}

func (r *recorder) Fail(context.Context, ledger.Lease, string) (ledger.Status, error) {
	r.got = append(r.got, "Fail")
	return ledger.StatusFailed, nil
}

func (r *recorder) Release(context.Context, ledger.Lease, string) error {
	r.got = append(r.got, "Release")
	return nil
}

func (r *recorder) RecordRefusal(context.Context, ledger.Refusal) (bool, error) {
	r.got = append(r.got, "RecordRefusal")
	return true, nil
}

func (r *recorder) ProviderKeyWindow() time.Duration { return time.Hour }

// TestWrapperForwardsAndHooks: with no hooks every call reaches the store
// with its answer; a before hook's error answers a call without the store;
// an after hook's error replaces an answer the store gave; calls are
// counted per method and in all.
func TestWrapperForwardsAndHooks(t *testing.T) {
	ctx := context.Background()
	inner := &recorder{}
	w := storehook.Wrap(inner)
	l := ledger.Lease{IdempotencyKey: "k"}
	if res, err := w.ClaimBatch(ctx, "h", time.Second, make([]ledger.ClaimRequest, 2)); err != nil || len(res) != 2 {
		t.Fatalf("claim batch: %d results, %v", len(res), err)
	}
	if got, err := w.Heartbeat(ctx, l, time.Minute); err != nil || !got.Until.Equal(l.Until.Add(time.Minute)) {
		t.Fatalf("heartbeat: %+v %v, want the store's renewed lease", got, err)
	}
	if err := w.Complete(ctx, l, ledger.Completion{}); err != nil {
		t.Fatal(err)
	}
	if errs, err := w.CompleteBatch(ctx, make([]ledger.CompleteItem, 3)); err != nil || len(errs) != 3 {
		t.Fatalf("complete batch: %v %v", errs, err)
	}
	if st, err := w.Fail(ctx, l, "r"); err != nil || st != ledger.StatusFailed {
		t.Fatalf("fail: %v %v", st, err)
	}
	if err := w.Release(ctx, l, "r"); err != nil {
		t.Fatal(err)
	}
	if wrote, err := w.RecordRefusal(ctx, ledger.Refusal{StreamSeq: 1}); err != nil || !wrote {
		t.Fatalf("record refusal: %v %v, want the store's answer", wrote, err)
	}
	if w.ProviderKeyWindow() != time.Hour {
		t.Fatal("provider key window not forwarded")
	}
	if len(inner.got) != 7 || w.Calls(storehook.Any) != 7 || w.Calls(storehook.Complete) != 1 {
		t.Fatalf("store saw %v, wrapper counted %d", inner.got, w.Calls(storehook.Any))
	}

	killed := errors.New("killed")
	w.Before(storehook.Fail, storehook.FailNth(2, killed))
	lost := errors.New("answer lost")
	var seen []ledger.Status
	w.After(storehook.Fail, func(_ context.Context, c *storehook.Call) error {
		seen = append(seen, c.Status)
		if c.N == 3 {
			return lost
		}
		return nil
	})
	inner.got = nil
	if st, err := w.Fail(ctx, l, "r"); !errors.Is(err, killed) || st != "" {
		t.Fatalf("second fail: %q %v, want the before hook's error", st, err)
	}
	if st, err := w.Fail(ctx, l, "r"); !errors.Is(err, lost) || st != "" {
		t.Fatalf("third fail: %q %v, want the after hook's error and no status", st, err)
	}
	if len(inner.got) != 1 || len(seen) != 1 || seen[0] != ledger.StatusFailed {
		t.Fatalf("store saw %v, after hook saw %v: want only the third call to reach the store", inner.got, seen)
	}
	if w.Calls(storehook.Fail) != 3 {
		t.Fatalf("%d fails counted, want 3", w.Calls(storehook.Fail))
	}
}
