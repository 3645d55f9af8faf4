package gateway_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// raceStore runs a hook once before AcquireNewIntakes, between the
// retry's arrival and its batch's first statement.
type raceStore struct {
	gateway.Store
	once sync.Once
	hook atomic.Pointer[func()]
}

func (s *raceStore) AcquireNewIntakes(ctx context.Context, reqs []ledger.ClaimRequest, apiKeys [][]byte, lease, retention time.Duration) ([]ledger.IntakeResult, error) {
	if f := s.hook.Load(); f != nil {
		s.once.Do(*f)
	}
	return s.Store.AcquireNewIntakes(ctx, reqs, apiKeys, lease, retention)
}

// TestIntakeHeldOtherBody422: a retry finds the intake held by its first
// request, but another body claimed the key meanwhile (a queue publisher's,
// just before the retry's batch): 422, not 409 or a replay.
func TestIntakeHeldOtherBody422(t *testing.T) {
	t.Parallel()
	rs := &raceStore{}
	w := setupWith(t, gateway.Config{}, options{store: func(s gateway.Store) gateway.Store { rs.Store = s; return rs }})
	body := payBody(100, "pm_card_visa")
	wantStatus(t, w.post("held", body), http.StatusAccepted)
	hook := func() {
		other := &payment.Command{MerchantID: "m_a", IdempotencyKey: "held", Amount: 999, Currency: "usd", PaymentMethod: "pm_card_visa"}
		if _, err := w.store.Claim(w.ctx, "queue-worker", time.Minute, ledger.NewClaimRequest(other)); err != nil {
			t.Error(err)
		}
	}
	rs.hook.Store(&hook)
	r := w.post("held", body)
	wantStatus(t, r, http.StatusUnprocessableEntity)
	if p := r.problem(t); p.Type != gateway.ProblemKeyReused {
		t.Fatalf("problem %+v", p)
	}
}

// unpublished acknowledges a publish without publishing: the gateway's copy
// never reaches the worker, so nothing but the key's completion can wake a
// waiter (its own copy's key_reused dead letter would wake it too).
type unpublished struct{ gateway.Publisher }

func (unpublished) Publish(context.Context, *payment.Command, map[string]string, int) (uint64, error) {
	return 1 << 40, nil
}

// TestPreferWaitOtherBody422: a POST waits for its key, but another body
// published straight on the queue is consumed first and completes the key:
// woken by that completion, the waiter answers 422, never the other
// payment's outcome.
func TestPreferWaitOtherBody422(t *testing.T) {
	t.Parallel()
	w := setupWith(t, gateway.Config{}, options{pub: func(p gateway.Publisher) gateway.Publisher { return unpublished{p} }})
	m := nats.NewMsg(w.cfg.Stream.SubjectPrefix + ".m_a")
	m.Data = []byte(`{"merchant_id":"m_a","idempotency_key":"race","amount":999,"currency":"usd","payment_method":"pm_card_visa"}`)
	if _, err := w.js.PublishMsg(w.ctx, m); err != nil {
		t.Fatal(err)
	}
	got := make(chan response, 1)
	go func() {
		r, err := w.req(w.ctx, http.MethodPost, "/v1/payments", w.keyA, payBody(100, "pm_card_visa"),
			map[string]string{"Idempotency-Key": "race", "Prefer": "wait=20"})
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	w.eventually("the POST published", func() bool {
		in, err := w.gwStore.GetIntake(w.ctx, "m_a", "race")
		return err == nil && !in.PublishedAt.IsZero()
	})
	w.startWorker()
	r := <-got
	wantStatus(t, r, http.StatusUnprocessableEntity)
	if p := r.problem(t); p.Type != gateway.ProblemKeyReused {
		t.Fatalf("problem %+v", p)
	}
	if c := w.charges("m_a", "race"); c != 1 {
		t.Fatalf("%d charges", c)
	}
}
