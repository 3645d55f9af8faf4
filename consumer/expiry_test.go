package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
	"github.com/paydedup/paydedup/stream"
)

// oldStream creates the payments stream as a worker before this one did:
// Limits retention, a max age (2 s here, 24 h by default) and DiscardOld.
func (e *env) oldStream(maxAge time.Duration) {
	e.t.Helper()
	if _, err := e.js.CreateStream(e.ctx, jetstream.StreamConfig{
		Name: e.cfg.Stream.Name, Subjects: []string{e.cfg.Stream.SubjectPrefix + ".>"}, Storage: jetstream.FileStorage,
		Retention: jetstream.LimitsPolicy, MaxAge: maxAge, Duplicates: maxAge, Discard: jetstream.DiscardOld,
	}); err != nil {
		e.t.Fatal(err)
	}
}

// TestOutageLongerThanStreamMaxAgeLosesNothing: the provider drops every
// call for longer than the payments stream of an older worker kept a
// message (a 2 s max age here, 24 h by default). The worker updates the
// stream on start; every payment published before the outage is charged
// exactly once after it; none expires from the stream unprocessed.
func TestOutageLongerThanStreamMaxAgeLosesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	outageConfig(e)
	e.cfg.Stream.MaxDeliver = 10
	// The trimmer runs through the outage: it must remove only what is
	// settled.
	e.cfg.TrimInterval = 200 * time.Millisecond
	e.oldStream(2 * time.Second)
	if err := e.sim.SetFaults(stripesim.Faults{RateFailBeforeCharge: 1}); err != nil {
		t.Fatal(err)
	}
	e.cfg.FetchBatch, e.cfg.Concurrency, e.cfg.Stream.MaxAckPending = 2, 2, 2
	proc, _ := e.runPausable("w1", e.store, e.stripe)
	var keys []string
	for i := range 8 {
		keys = append(keys, fmt.Sprintf("long-%d", i))
		e.publish("m_1", body("m_1", keys[i], 100), "", nil)
	}
	e.eventually("paused", func() bool { return errors.Is(proc.Paused(e.ctx), consumer.ErrProviderUnavailable) })
	// The outage outlasts the old max age by half again.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	if err := e.sim.SetFaults(stripesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(8 * time.Second)
	for e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) < len(keys) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`); n != len(keys) {
		t.Fatalf("%d of %d payments charged after the outage, %d dead letters: the rest expired from the stream unprocessed", n, len(keys), len(e.deadLetters()))
	}
	e.quiescent()
	e.chargedOnceEach(keys)
	e.eventually("the settled commands trimmed from the stream", func() bool { return len(e.streamMessages(e.cfg.Stream.Name)) == 0 })
}

// TestStopHoldingALastDeliveryDuringAnOutage: a worker holds a message on
// its last delivery through a provider outage (one payment: the last
// delivery's lookup finds the provider down and pauses the worker), and is
// stopped. The message is not dead-lettered: an outage is no message's
// fault. A second worker, started after the outage, charges it once.
func TestStopHoldingALastDeliveryDuringAnOutage(t *testing.T) {
	t.Parallel()
	e := setup(t)
	outageConfig(e)
	e.cfg.Stream.MaxDeliver = 2
	if err := e.sim.SetFaults(stripesim.Faults{RateFailBeforeCharge: 1}); err != nil {
		t.Fatal(err)
	}
	proc, stop := e.runPausable("w1", e.store, e.stripe)
	e.publish("m_1", body("m_1", "last-held", 100), "", nil)
	e.eventually("paused, holding the message", func() bool {
		return errors.Is(proc.Paused(e.ctx), consumer.ErrProviderUnavailable) && proc.Held() == 1
	})
	stop()
	if dls := e.deadLetters(); len(dls) != 0 {
		p, _ := stream.ParseDeadLetter(dls[0].Header)
		t.Fatalf("the stop dead-lettered the held last delivery: %s after %d deliveries: %s", p.Reason, p.Deliveries, p.Error)
	}
	if err := e.sim.SetFaults(stripesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	e.runPausable("w2", e.store, e.stripe)
	e.eventually("charged after the outage", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == 1
	})
	e.quiescent()
	e.chargedOnceEach([]string{"last-held"})
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters, want 0", n)
	}
}

// keyRefuser answers every call 401 authentication_error while refuse is
// set (an API key revoked on a Friday evening), and passes calls through
// to the provider otherwise.
type keyRefuser struct {
	p      *stripe.Client
	refuse atomic.Bool
}

func (k *keyRefuser) err() error {
	return &provider.Error{Class: provider.Classify(401, "authentication_error", "", nil), HTTPStatus: 401, Type: "authentication_error"}
}

func (k *keyRefuser) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	if k.refuse.Load() {
		return nil, k.err()
	}
	return k.p.Charge(ctx, req)
}

func (k *keyRefuser) Lookup(ctx context.Context, req provider.LookupRequest) (provider.LookupResult, error) {
	if k.refuse.Load() {
		return provider.LookupResult{}, k.err()
	}
	return k.p.Lookup(ctx, req)
}

// TestKeyRefusedLongerThanStreamMaxAgeLosesNothing: the provider refuses
// the API key for longer than an older worker's stream kept a message;
// when the key is accepted again every payment is charged once.
func TestKeyRefusedLongerThanStreamMaxAgeLosesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	outageConfig(e)
	e.cfg.Stream.MaxDeliver = 10
	e.oldStream(2 * time.Second)
	k := &keyRefuser{p: e.stripe}
	k.refuse.Store(true)
	proc, _ := e.runPausable("w1", e.store, k)
	var keys []string
	for i := range 8 {
		keys = append(keys, fmt.Sprintf("revoked-%d", i))
		e.publish("m_1", body("m_1", keys[i], 100), "", nil)
	}
	e.eventually("paused on the refused key", func() bool { return errors.Is(proc.Paused(e.ctx), consumer.ErrProviderUnauthorized) })
	time.Sleep(3 * time.Second) // the key stays refused past the old max age
	k.refuse.Store(false)
	e.eventually("all charged once the key is accepted", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == len(keys)
	})
	e.quiescent()
	e.chargedOnceEach(keys)
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters, want 0", n)
	}
}
