package consumer_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
)

// writes records the store writes the processor makes after a call.
type writes struct {
	mu            sync.Mutex
	fail, release []string
}

func (w *writes) ProviderKeyWindow() time.Duration { return ledger.DefaultProviderKeyWindow }

func (w *writes) ClaimBatch(context.Context, string, time.Duration, []ledger.ClaimRequest) ([]ledger.ClaimResult, error) {
	return nil, errors.New("not used")
}
func (w *writes) Heartbeat(_ context.Context, l ledger.Lease, _ time.Duration) (ledger.Lease, error) {
	return l, nil
}
func (w *writes) Complete(context.Context, ledger.Lease, ledger.Completion) error { return nil }
func (w *writes) CompleteBatch(_ context.Context, items []ledger.CompleteItem) ([]error, error) {
	return make([]error, len(items)), nil
}
func (w *writes) Fail(_ context.Context, _ ledger.Lease, reason string) (ledger.Status, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fail = append(w.fail, reason)
	return ledger.StatusFailed, nil
}
func (w *writes) Release(_ context.Context, _ ledger.Lease, reason string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.release = append(w.release, reason)
	return nil
}
func (w *writes) RecordRefusal(context.Context, ledger.Refusal) (bool, error) { return true, nil }

type failing struct{ err error }

func (f failing) Charge(context.Context, provider.ChargeRequest) (*provider.Outcome, error) {
	return nil, f.err
}

// TestProcessorRecordsNotChargedOnlyOnProof maps provider answers to the
// store write that follows: only an answer that proves the request was not
// executed (ClassRetryable) may call Fail, the one write that can make a
// row `failed`; a 409 idempotency_key_in_use, a lock_timeout and every
// unknown outcome release the row (pending, maybe_charged).
func TestProcessorRecordsNotChargedOnlyOnProof(t *testing.T) {
	t.Parallel()
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	answer := func(status int, typ, code string) error {
		return &provider.Error{Class: provider.Classify(status, typ, code, nil), HTTPStatus: status, Type: typ, Code: code}
	}
	cases := []struct {
		name     string
		err      error
		wantFail bool
	}{
		{"409 idempotency_key_in_use", answer(409, "invalid_request_error", "idempotency_key_in_use"), false},
		{"409 lock_timeout", answer(409, "invalid_request_error", "lock_timeout"), false},
		{"429 lock_timeout", answer(429, "invalid_request_error", "lock_timeout"), false},
		{"500 api_error", answer(500, "api_error", ""), false},
		{"connection dropped after writing", &provider.Error{Class: provider.Classify(0, "", "", io.EOF), Err: io.EOF}, false},
		{"401", answer(401, "authentication_error", ""), true},
		{"connection refused", &provider.Error{Class: provider.Classify(0, "", "", refused), Err: refused}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := &writes{}
			cfg := consumer.Config{Holder: "w", Lease: 3 * time.Second,
				ProviderTry: provider.RetryPolicy{MaxTries: 1, AttemptTimeout: time.Second}}
			p := consumer.NewProcessor(st, failing{tc.err}, cfg, nil)
			cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: "k", Amount: 100, Currency: "usd", PaymentMethod: "pm_card_visa"}
			lease := &ledger.Lease{MerchantID: "m_1", IdempotencyKey: "k", ProviderKey: ledger.ProviderKey("m_1", "k"), Holder: "w", Attempt: 1, Until: time.Now().Add(3 * time.Second)}
			res := p.Handle(context.Background(), cmd, ledger.ClaimResult{Outcome: ledger.Claimed, Lease: lease}, nil)
			if res.Kind != consumer.Retry {
				t.Fatalf("result %v, want retry", res.Kind)
			}
			gotFail := len(st.fail) == 1 && len(st.release) == 0
			gotRelease := len(st.release) == 1 && len(st.fail) == 0
			if tc.wantFail && !gotFail || !tc.wantFail && !gotRelease {
				t.Fatalf("store writes: fail %q, release %q; want %s", st.fail, st.release,
					map[bool]string{true: "one Fail", false: "one Release"}[tc.wantFail])
			}
		})
	}
}

// beats is a store whose heartbeats succeed until lostAfter of them (0:
// always), then report the lease lost.
type beats struct {
	writes
	lostAfter int32
	n         atomic.Int32
}

func (b *beats) Heartbeat(_ context.Context, l ledger.Lease, d time.Duration) (ledger.Lease, error) {
	if n := b.n.Add(1); b.lostAfter > 0 && n >= b.lostAfter {
		return ledger.Lease{}, ledger.ErrLeaseLost
	}
	l.Until = time.Now().Add(d)
	return l, nil
}

// slow charges after d, or gives up when its context ends first.
type slow struct {
	d         time.Duration
	cancelled atomic.Bool // the call's context was cancelled, not timed out
}

func (s *slow) Charge(ctx context.Context, _ provider.ChargeRequest) (*provider.Outcome, error) {
	select {
	case <-time.After(s.d):
		return &provider.Outcome{ChargeID: "pi_1", HTTPStatus: 200, Response: []byte(`{"id":"pi_1"}`)}, nil
	case <-ctx.Done():
		s.cancelled.Store(errors.Is(ctx.Err(), context.Canceled))
		return nil, &provider.Error{Class: provider.ClassUnknown, Err: ctx.Err()}
	}
}

// TestHeartbeatDuringLongCall: a provider call longer than a third of the
// lease has the lease extended and progress reported every third of the
// lease, and completes; when a heartbeat finds the lease lost, the call is
// cancelled and nothing is completed or released by the old holder. No
// heartbeat is sent after the call is over.
func TestHeartbeatDuringLongCall(t *testing.T) {
	t.Parallel()
	const lease = 300 * time.Millisecond // a heartbeat every 100 ms
	cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: "k", Amount: 100, Currency: "usd", PaymentMethod: "pm_card_visa"}
	run := func(t *testing.T, st *beats, ch *slow) (consumer.Result, int32) {
		cfg := consumer.Config{Holder: "w", Lease: lease, CommitBatch: 1,
			ProviderTry: provider.RetryPolicy{MaxTries: 1, AttemptTimeout: 10 * time.Second}}
		p := consumer.NewProcessor(st, ch, cfg, nil)
		l := &ledger.Lease{MerchantID: "m_1", IdempotencyKey: "k", ProviderKey: ledger.ProviderKey("m_1", "k"), Holder: "w", Attempt: 1, Until: time.Now().Add(lease)}
		var progress atomic.Int32
		res := p.Handle(context.Background(), cmd, ledger.ClaimResult{Outcome: ledger.Claimed, Lease: l}, func() { progress.Add(1) })
		return res, progress.Load()
	}
	t.Run("kept", func(t *testing.T) {
		t.Parallel()
		st, ch := &beats{}, &slow{d: 250 * time.Millisecond}
		res, progress := run(t, st, ch)
		if res.Kind != consumer.Completed {
			t.Fatalf("result %v (%v), want completed", res.Kind, res.Err)
		}
		if n := st.n.Load(); n < 2 || n > 3 || progress != n {
			t.Errorf("%d heartbeats and %d progress reports in a 250 ms call, want 2 each", n, progress)
		}
		after := st.n.Load()
		time.Sleep(2 * lease / 3) // no ticker left to fire: nothing may come
		if n := st.n.Load(); n != after {
			t.Errorf("%d heartbeats after the call ended", n-after)
		}
	})
	t.Run("lost", func(t *testing.T) {
		t.Parallel()
		st, ch := &beats{lostAfter: 2}, &slow{d: 10 * time.Second}
		start := time.Now()
		res, _ := run(t, st, ch)
		if res.Kind != consumer.Retry || res.Err == nil || !strings.Contains(res.Err.Error(), "lease lost") {
			t.Fatalf("result %v (%v), want a retry for the lost lease", res.Kind, res.Err)
		}
		// Cancelled, not ended by the call's own timeout (0.9 of the
		// lease), which would end it soon after anyway.
		if !ch.cancelled.Load() || time.Since(start) > 2*time.Second {
			t.Errorf("call not cancelled when the lease was lost (cancelled %v after %v)", ch.cancelled.Load(), time.Since(start))
		}
		st.mu.Lock()
		defer st.mu.Unlock()
		if len(st.fail) != 0 || len(st.release) != 0 {
			t.Errorf("the old holder wrote: fail %q, release %q", st.fail, st.release)
		}
	})
}
