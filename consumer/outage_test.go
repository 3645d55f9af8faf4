package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
	"github.com/paydedup/paydedup/stream"
)

// outageConfig is a delivery schedule an outage outlasts in a few seconds:
// three deliveries, naks of at most 300 ms, and pauses of 100 ms doubling
// to 400 ms between probes.
func outageConfig(e *env) {
	e.cfg.Stream.MaxDeliver = 3
	e.cfg.RetryBase, e.cfg.RetryMax = 50*time.Millisecond, 300*time.Millisecond
	e.cfg.PauseFirst, e.cfg.PauseLongest = 100*time.Millisecond, 400*time.Millisecond
}

// runPausable runs a worker on store and charger like env.run, and returns
// its processor (for the readiness check) and its stop.
func (e *env) runPausable(holder string, store consumer.Store, charger consumer.Charger) (*consumer.Processor, func()) {
	e.t.Helper()
	cfg := e.cfg
	cfg.Holder = holder
	proc := consumer.NewProcessor(store, charger, cfg, nil)
	w, err := consumer.NewWorker(e.nc, proc, cfg, nil, nil, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				e.t.Errorf("worker %s: %v", holder, err)
			}
		})
	}
	e.t.Cleanup(stop)
	e.waitStreams()
	return proc, stop
}

// noDeadLetterWhile fails the test at the first dead letter filed during d
// (polled), and returns when d is over.
func (e *env) noDeadLetterWhile(what string, d time.Duration) {
	e.t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if dls := e.deadLetters(); len(dls) > 0 {
			p, _ := stream.ParseDeadLetter(dls[0].Header)
			e.t.Fatalf("%d dead letter(s) during %s, the first %s after %d deliveries: %s", len(dls), what, p.Reason, p.Deliveries, p.Error)
		}
	}
}

// exhausted is how many messages ran out of deliveries: the MAX_DELIVERIES
// advisories the advisory stream captured.
func (e *env) exhausted() uint64 {
	e.t.Helper()
	s, err := e.js.Stream(e.ctx, e.cfg.WithDefaults().Stream.AdvisoryStream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	return info.State.Msgs
}

// chargedOnceEach fails unless every key was charged exactly once and its
// row completed.
func (e *env) chargedOnceEach(keys []string) {
	e.t.Helper()
	for _, k := range keys {
		if n := e.charges("m_1", k); n != 1 {
			e.t.Errorf("%s charged %d times, want 1", k, n)
		}
	}
	if n := e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`); n != len(keys) {
		e.t.Errorf("%d rows completed, want %d", n, len(keys))
	}
}

// TestProviderOutagePausesWithoutSpendingDeliveries: the provider answers
// every call 500 for longer than the whole delivery schedule (three
// deliveries of at most 300 ms naks). The worker pauses (readiness says
// why), keeps the messages it holds, probes, and files no dead letter; no
// message runs out of deliveries. When the provider answers again every
// payment is charged exactly once.
func TestProviderOutagePausesWithoutSpendingDeliveries(t *testing.T) {
	t.Parallel()
	e := setup(t)
	outageConfig(e)
	if err := e.sim.SetFaults(stripesim.Faults{Rate5xx: 1}); err != nil {
		t.Fatal(err)
	}
	proc, _ := e.runPausable("w1", e.store, e.stripe)
	var keys []string
	for i := range 10 {
		keys = append(keys, fmt.Sprintf("out-%d", i))
		e.publish("m_1", body("m_1", keys[i], 100), "", nil)
	}
	e.eventually("readiness says the provider is unavailable", func() bool {
		return errors.Is(proc.Paused(e.ctx), consumer.ErrProviderUnavailable)
	})
	// Ten times the delivery schedule.
	e.noDeadLetterWhile("the outage", 10*time.Duration(e.cfg.Stream.MaxDeliver)*e.cfg.RetryMax)
	if err := proc.Paused(e.ctx); !errors.Is(err, consumer.ErrProviderUnavailable) {
		t.Fatalf("readiness at the end of the outage = %v, want ErrProviderUnavailable", err)
	}
	if err := e.sim.SetFaults(stripesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("all completed after the outage", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == len(keys)
	})
	e.quiescent()
	e.chargedOnceEach(keys)
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters, want 0", n)
	}
	if n := e.exhausted(); n != 0 {
		t.Fatalf("%d messages ran out of deliveries, want 0", n)
	}
	if err := proc.Paused(e.ctx); err != nil {
		t.Fatalf("readiness after the outage: %v", err)
	}
}

// TestStopDuringOutageNaksHeldWork: SIGTERM while the worker holds messages
// through a provider outage acks none of them; a worker started after the
// outage charges each once.
func TestStopDuringOutageNaksHeldWork(t *testing.T) {
	t.Parallel()
	e := setup(t)
	outageConfig(e)
	// The answers before the gate closes are nakked and spend deliveries;
	// on a loaded machine a message could spend all three, and a stop then
	// settles it as its last delivery (max_deliveries). This test is about
	// the stop: give each message room.
	e.cfg.Stream.MaxDeliver = 10
	if err := e.sim.SetFaults(stripesim.Faults{RateFailBeforeCharge: 1}); err != nil {
		t.Fatal(err)
	}
	proc, stop := e.runPausable("w1", e.store, e.stripe)
	var keys []string
	for i := range 6 {
		keys = append(keys, fmt.Sprintf("held-%d", i))
		e.publish("m_1", body("m_1", keys[i], 100), "", nil)
	}
	e.eventually("paused, holding messages", func() bool {
		return errors.Is(proc.Paused(e.ctx), consumer.ErrProviderUnavailable) && proc.Held() > 0
	})
	stop()
	c := e.workerConsumer()
	info, err := c.Info(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if owed := int(info.NumPending) + info.NumAckPending; owed != len(keys) {
		t.Fatalf("%d messages still owed after the stop, want %d: held work was acked", owed, len(keys))
	}
	if err := e.sim.SetFaults(stripesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	e.runPausable("w2", e.store, e.stripe)
	e.eventually("all completed after a restart", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == len(keys)
	})
	e.quiescent()
	e.chargedOnceEach(keys)
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters, want 0", n)
	}
}

// TestLowTrafficOutageHoldsTheLastDelivery: one payment alone, and the
// provider answers every call 500 (or refuses the connection) for longer
// than its three
// deliveries: too few keys for the outage rule. On the last delivery the
// worker asks the provider something that charges nothing; that fails
// too, so the worker pauses and holds the message instead of
// dead-lettering it max_deliveries. When the provider answers again the
// payment is charged exactly once.
func TestLowTrafficOutageHoldsTheLastDelivery(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		faults stripesim.Faults
	}{
		{"500", stripesim.Faults{Rate5xx: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			outageConfig(e)
			if err := e.sim.SetFaults(c.faults); err != nil {
				t.Fatal(err)
			}
			proc, _ := e.runPausable("w1", e.store, e.stripe)
			e.publish("m_1", body("m_1", "alone", 100), "", nil)
			// Ten times the delivery schedule.
			e.noDeadLetterWhile("the outage", 10*time.Duration(e.cfg.Stream.MaxDeliver)*e.cfg.RetryMax)
			if err := proc.Paused(e.ctx); !errors.Is(err, consumer.ErrProviderUnavailable) || proc.Held() != 1 {
				t.Fatalf("readiness at the end of the outage = %v holding %d, want ErrProviderUnavailable holding 1", err, proc.Held())
			}
			if err := e.sim.SetFaults(stripesim.Faults{}); err != nil {
				t.Fatal(err)
			}
			e.eventually("completed after the outage", func() bool {
				return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == 1
			})
			e.quiescent()
			e.chargedOnceEach([]string{"alone"})
			if n := len(e.deadLetters()); n != 0 {
				t.Fatalf("%d dead letters, want 0", n)
			}
			if n := e.exhausted(); n != 0 {
				t.Fatalf("%d messages ran out of deliveries, want 0", n)
			}
			if err := proc.Paused(e.ctx); err != nil {
				t.Fatalf("readiness after the outage: %v", err)
			}
		})
	}
}

// refusedConnection is a call that provably never reached the provider
// (ClassRetryable, and unavailable in the outage rule's count; a 429 is
// neither: see TestRateLimitWaitsUnderTheLease).
func refusedConnection() error {
	err := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	return &provider.Error{Class: provider.Classify(0, "", "", err), Err: err}
}

// loneFailure refuses the connection for one key and passes the others on; its
// lookups (which charge nothing) reach the provider and are counted.
type loneFailure struct {
	provider.Provider
	key     string
	lookups *atomic.Int32
}

func (l loneFailure) Lookup(ctx context.Context, req provider.LookupRequest) (provider.LookupResult, error) {
	l.lookups.Add(1)
	return l.Provider.Lookup(ctx, req)
}

func (l loneFailure) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	if req.IdempotencyKey == l.key {
		return nil, refusedConnection()
	}
	return l.Provider.Charge(ctx, req)
}

// TestLoneFailureStillRunsOutOfDeliveries: one message the provider keeps
// refusing while the others are charged is its own failure, not an outage,
// however many times in a row it fails: on its last delivery the provider
// answers the worker's lookup, so it is dead-lettered max_deliveries and
// the worker never pauses.
func TestLoneFailureStillRunsOutOfDeliveries(t *testing.T) {
	t.Parallel()
	e := setup(t)
	outageConfig(e)
	// More deliveries than the answers that make an outage: the lone
	// key's later ones fail with no other answer between them.
	e.cfg.Stream.MaxDeliver = 2 * consumer.OutageAnswers
	lone := loneFailure{Provider: e.stripe, key: "lone", lookups: new(atomic.Int32)}
	proc, _ := e.runPausable("w1", e.store, lone)
	e.publish("m_1", body("m_1", "lone", 100), "", nil)
	var keys []string
	for i := range 20 {
		keys = append(keys, fmt.Sprintf("ok-%d", i))
		e.publish("m_1", body("m_1", keys[i], 100), "", nil)
	}
	e.eventually("max_deliveries dead letter", func() bool { return len(e.deadLetters()) == 1 })
	p, err := stream.ParseDeadLetter(e.deadLetters()[0].Header)
	if err != nil || p.Reason != stream.ReasonMaxDeliveries || p.Deliveries != uint64(e.cfg.Stream.MaxDeliver) {
		t.Fatalf("dead letter %+v %v, want max_deliveries after %d", p, err, e.cfg.Stream.MaxDeliver)
	}
	e.quiescent()
	for _, k := range keys {
		if n := e.charges("m_1", k); n != 1 {
			t.Errorf("%s charged %d times, want 1", k, n)
		}
	}
	if err := proc.Paused(e.ctx); err != nil {
		t.Fatalf("readiness = %v: one failing message paused the worker", err)
	}
	if n := lone.lookups.Load(); n != 1 {
		t.Fatalf("%d lookups, want 1: the last delivery asks whether the provider is down", n)
	}
}

// pgLink is a TCP proxy in front of PostgreSQL that can be taken down:
// then every open connection is closed and new ones are refused.
type pgLink struct{ proxy *toxiproxy.Proxy }

func newPGLink(t *testing.T, upstream string) *pgLink {
	t.Helper()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(server, "postgres", fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), upstream)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	l := &pgLink{proxy: p}
	t.Cleanup(l.down)
	return l
}

func (l *pgLink) down() { l.proxy.Stop() }

func (l *pgLink) up(t *testing.T) {
	t.Helper()
	if err := l.proxy.Start(); err != nil {
		t.Fatalf("postgres link back up: %v", err)
	}
}

// TestPostgresOutagePausesWithoutSpendingDeliveries: PostgreSQL becomes
// unreachable from the worker for several leases, with payments between
// their charge and their commit and more arriving. Claims and commits fail
// with connection errors; the worker pauses (readiness says why), files no
// dead letter, and when PostgreSQL is back every payment completes, each
// charged once.
func TestPostgresOutagePausesWithoutSpendingDeliveries(t *testing.T) {
	t.Parallel()
	e, link, store := pgOutageEnv(t)
	sim, client, cfg := e.sim, e.stripe, e.cfg
	// Each charge takes 200 ms: the cut finds payments charged and not yet
	// committed.
	if err := sim.SetFaults(stripesim.Faults{Latency: 200 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	proc, _ := e.runPausable("w1", store, client)
	var keys []string
	publish := func(n int) {
		for range n {
			k := fmt.Sprintf("pg-%d", len(keys))
			keys = append(keys, k)
			e.publish("m_1", body("m_1", k, 100), "", nil)
		}
	}
	publish(10)
	e.eventually("charges under way", func() bool { return len(sim.Charges()) > 0 })
	link.down()
	publish(10)
	e.eventually("readiness says PostgreSQL is unavailable", func() bool {
		return errors.Is(proc.Paused(e.ctx), consumer.ErrStoreUnavailable)
	})
	// Four leases, and ten times the delivery schedule.
	e.noDeadLetterWhile("the outage", max(4*cfg.Lease, 10*time.Duration(e.cfg.Stream.MaxDeliver)*e.cfg.RetryMax))
	link.up(t)
	e.eventually("all completed after the outage", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == len(keys)
	})
	e.quiescent()
	e.chargedOnceEach(keys)
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters, want 0", n)
	}
	if n := e.exhausted(); n != 0 {
		t.Fatalf("%d messages ran out of deliveries, want 0", n)
	}
	if err := proc.Paused(e.ctx); err != nil {
		t.Fatalf("readiness after the outage: %v", err)
	}
}

// pgOutageEnv is a test's world whose worker store reaches PostgreSQL
// through a link the test can take down; the test's own reads go direct.
func pgOutageEnv(t *testing.T) (*env, *pgLink, *dedup.Store) {
	t.Helper()
	u := testenv.PostgresURL(t)
	direct, err := pg.Connect(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close)
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	link := newPGLink(t, pu.Host)
	pu.Host = link.proxy.Listen
	viaLink, err := pg.Connect(context.Background(), pu.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(viaLink.Close)
	store, err := dedup.New(viaLink, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	directStore, err := dedup.New(direct, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	nc := testenv.NATSConn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	sim, client := testenv.Provider(t, 7, 2*time.Second)
	cfg := consumer.Config{Stream: testenv.Streams(t, js)}
	cfg.Lease, cfg.Stream.AckWait = time.Second, 2*time.Second
	cfg.ProviderTry = provider.RetryPolicy{MaxTries: 1, AttemptTimeout: 700 * time.Millisecond}
	cfg.DrainTimeout, cfg.Concurrency, cfg.FetchBatch = 2*time.Second, 16, 50
	e := &env{t: t, ctx: context.Background(), pool: direct, store: directStore, nc: nc, js: js, sim: sim, stripe: client, cfg: cfg}
	outageConfig(e)
	return e, link, store
}

// TestPostgresOutageAtClaimHoldsTheBatch: PostgreSQL is unreachable before
// the messages arrive, so the batch the worker fetches fails at its claim.
// It is held: nakked, nothing would probe but the fetch after each pause,
// which would spend a delivery of each message every time. When PostgreSQL
// is back all complete, each charged once.
func TestPostgresOutageAtClaimHoldsTheBatch(t *testing.T) {
	t.Parallel()
	e, link, store := pgOutageEnv(t)
	proc, _ := e.runPausable("w1", store, e.stripe)
	link.down()
	var keys []string
	for i := range 10 {
		keys = append(keys, fmt.Sprintf("claim-%d", i))
		e.publish("m_1", body("m_1", keys[i], 100), "", nil)
	}
	e.eventually("readiness says PostgreSQL is unavailable", func() bool {
		return errors.Is(proc.Paused(e.ctx), consumer.ErrStoreUnavailable)
	})
	e.noDeadLetterWhile("the outage", max(4*e.cfg.Lease, 10*time.Duration(e.cfg.Stream.MaxDeliver)*e.cfg.RetryMax))
	if proc.Held() == 0 {
		t.Fatal("no message held at the end of the outage")
	}
	link.up(t)
	e.eventually("all completed after the outage", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == len(keys)
	})
	e.quiescent()
	e.chargedOnceEach(keys)
	if n := e.exhausted(); n != 0 {
		t.Fatalf("%d messages ran out of deliveries, want 0", n)
	}
}

// TestProviderOutageHoldsARefund: the provider answers every call 500
// for longer than a refund's whole delivery schedule. The refund goes
// through the charges' pause gate and hold: on its last delivery the
// worker asks the provider something that moves no money, that fails too,
// and the refund is held instead of dead-lettered max_deliveries with its
// row left unknown. When the provider answers again it is refunded once.
func TestProviderOutageHoldsARefund(t *testing.T) {
	t.Parallel()
	e := setup(t)
	outageConfig(e)
	proc, _ := e.runPausable("w1", e.store, e.stripe)
	charge := e.charged("m_1", "pay-out", 1000)
	if err := e.sim.SetFaults(stripesim.Faults{Rate5xx: 1}); err != nil {
		t.Fatal(err)
	}
	e.publish("m_1", refundBody("m_1", "refund-out", "pay-out", 400), "", nil)
	// Ten times the delivery schedule.
	e.noDeadLetterWhile("the outage", 10*time.Duration(e.cfg.Stream.MaxDeliver)*e.cfg.RetryMax)
	if err := proc.Paused(e.ctx); !errors.Is(err, consumer.ErrProviderUnavailable) || proc.Held() != 1 {
		t.Fatalf("readiness at the end of the outage = %v holding %d, want ErrProviderUnavailable holding 1", err, proc.Held())
	}
	if err := e.sim.SetFaults(stripesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	if r := e.refundDone("m_1", "refund-out"); r.Status != ledger.RefundSucceeded {
		t.Fatalf("refund %+v, want succeeded", r)
	}
	e.quiescent()
	if got := e.refundsAt(charge); len(got) != 1 || got[0].Amount != 400 {
		t.Fatalf("refunds at the provider %+v, want one of 400", got)
	}
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters, want 0", n)
	}
	if n := e.exhausted(); n != 0 {
		t.Fatalf("%d messages ran out of deliveries, want 0", n)
	}
}

// unprobed is the provider without its charge lookup (no Prober): a last
// delivery that ended unavailable cannot be probed, so only the outage
// rule holds it.
type unprobed struct{ p *stripe.Client }

func (u unprobed) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	return u.p.Charge(ctx, req)
}

func (u unprobed) Refund(ctx context.Context, req provider.RefundRequest) (*provider.RefundOutcome, error) {
	return u.p.Refund(ctx, req)
}

func (u unprobed) LookupRefund(ctx context.Context, req provider.RefundLookupRequest) (provider.RefundLookupResult, error) {
	return u.p.LookupRefund(ctx, req)
}

// TestRefundsCountTowardsTheOutageRule: three refunds, and the provider
// answers every call 500 for longer than their delivery schedule. Their
// failed calls count towards the outage rule (OutageAnswers calls of
// OutageKeys keys) as charges' do: the worker pauses and holds them,
// where a worker that cannot probe a last delivery would dead-letter them
// max_deliveries. After the outage each is refunded once.
func TestRefundsCountTowardsTheOutageRule(t *testing.T) {
	t.Parallel()
	e := setup(t)
	outageConfig(e)
	_, stop := e.runPausable("w1", e.store, e.stripe)
	var charges []string
	for i := range 3 {
		charges = append(charges, e.charged("m_1", fmt.Sprintf("pay-%d", i), 1000))
	}
	stop()
	if err := e.sim.SetFaults(stripesim.Faults{Rate5xx: 1}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		e.publish("m_1", refundBody("m_1", fmt.Sprintf("refund-%d", i), fmt.Sprintf("pay-%d", i), 400), "", nil)
	}
	proc, _ := e.runPausable("w2", e.store, unprobed{e.stripe})
	e.eventually("readiness says the provider is unavailable", func() bool {
		return errors.Is(proc.Paused(e.ctx), consumer.ErrProviderUnavailable)
	})
	e.noDeadLetterWhile("the outage", 10*time.Duration(e.cfg.Stream.MaxDeliver)*e.cfg.RetryMax)
	if err := e.sim.SetFaults(stripesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if r := e.refundDone("m_1", fmt.Sprintf("refund-%d", i)); r.Status != ledger.RefundSucceeded {
			t.Fatalf("refund %+v, want succeeded", r)
		}
	}
	e.quiescent()
	for _, c := range charges {
		if got := e.refundsAt(c); len(got) != 1 || got[0].Amount != 400 {
			t.Fatalf("refunds at the provider of %s: %+v, want one of 400", c, got)
		}
	}
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters, want 0", n)
	}
	if n := e.exhausted(); n != 0 {
		t.Fatalf("%d messages ran out of deliveries, want 0", n)
	}
}
