package consumer_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/stream"
)

// paced is a provider that answers at most rate charges a second, every
// caller waiting its turn: a slow account, not a refusing one.
type paced struct {
	consumer.Charger
	lim *rate.Limiter
}

func (p paced) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	if err := p.lim.Wait(ctx); err != nil {
		return nil, &provider.Error{Class: provider.ClassRetryable, Err: err}
	}
	return p.Charger.Charge(ctx, req)
}

// laneEnv is setup with a narrow shared window (MaxAckPending 16), lanes
// on, and a provider paced to 100 charges a second shared by the workers.
func laneEnv(t *testing.T) (*env, consumer.Charger) {
	e := setup(t)
	e.cfg.Lanes = 4
	e.cfg.FetchBatch, e.cfg.Concurrency, e.cfg.Stream.MaxAckPending = 8, 16, 16
	return e, paced{Charger: e.stripe, lim: rate.NewLimiter(100, 1)}
}

// completed counts merchant's completed keys.
func (e *env) completed(merchant string) int {
	return e.count(`SELECT count(*) FROM idempotency_keys WHERE merchant_id = $1 AND status = 'completed'`, merchant)
}

// lanes lists the lane consumers on the payments stream.
func (e *env) lanes() []string {
	e.t.Helper()
	s, err := e.js.Stream(e.ctx, e.cfg.Stream.Name)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	names := s.ConsumerNames(e.ctx)
	for n := range names.Name() {
		if strings.HasPrefix(n, e.cfg.Stream.Durable+"-lane-") {
			out = append(out, n)
		}
	}
	if err := names.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// TestLanesServeMerchantBehindBacklog: merchant A's 800 payments are
// published, then merchant B's 20; two workers share a provider that
// charges 100 a second. B's payments are all charged while most of A's
// still wait (through B's lane), every payment is charged exactly once
// (the shared consumer's later copies of B's are duplicates), nothing is
// dead-lettered, and the lanes are gone once the backlog is. Without
// lanes (Lanes 0) B's payments were charged only after A's backlog, and
// this test failed at its first check.
func TestLanesServeMerchantBehindBacklog(t *testing.T) {
	t.Parallel()
	e, charger := laneEnv(t)
	e.waitStreamsCreate()
	const nA, nB = 800, 20
	for i := range nA {
		e.publish("m_a", body("m_a", fmt.Sprintf("a-%d", i), 100), "", nil)
	}
	e.run("w1", e.store, charger, nil)
	e.run("w2", e.store, charger, nil)
	e.eventually("A's backlog under way", func() bool { return e.completed("m_a") > 0 })
	for i := range nB {
		e.publish("m_b", body("m_b", fmt.Sprintf("b-%d", i), 100), "", nil)
	}
	e.eventually("B's payments charged", func() bool { return e.completed("m_b") == nB })
	if a := e.completed("m_a"); a > nA/2 {
		t.Fatalf("B's payments charged only after %d of A's %d: behind the backlog", a, nA)
	}
	cs, err := stream.ConsumerState(e.ctx, e.js, e.cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.Lanes) != 1 || cs.Lanes[0].Subject != e.cfg.Stream.SubjectPrefix+".m_b" {
		t.Errorf("lanes while A's backlog drains: %+v, want B's", cs.Lanes)
	}
	e.eventually("A's backlog drained", func() bool { return e.completed("m_a") == nA })
	e.quiescent()
	for i := range nA {
		if n := e.charges("m_a", fmt.Sprintf("a-%d", i)); n != 1 {
			t.Fatalf("a-%d charged %d times", i, n)
		}
	}
	for i := range nB {
		if n := e.charges("m_b", fmt.Sprintf("b-%d", i)); n != 1 {
			t.Fatalf("b-%d charged %d times", i, n)
		}
	}
	if dl := e.deadLetters(); len(dl) != 0 {
		t.Fatalf("%d dead letters", len(dl))
	}
	e.eventually("lanes deleted after the backlog", func() bool { return len(e.lanes()) == 0 })
}

// TestLaneBadInputDeadLetteredOnce: merchant B's malformed command and
// its command carrying a card number, published behind A's backlog, reach
// B's lane first, which leaves them to the shared consumer: each is
// dead-lettered exactly once (by the shared consumer), and the card
// number's original is erased from the stream; B's good command is
// charged before the backlog drains, once.
func TestLaneBadInputDeadLetteredOnce(t *testing.T) {
	t.Parallel()
	e, charger := laneEnv(t)
	e.waitStreamsCreate()
	const nA = 500
	for i := range nA {
		e.publish("m_a", body("m_a", fmt.Sprintf("a-%d", i), 100), "", nil)
	}
	e.run("w1", e.store, charger, nil)
	e.run("w2", e.store, charger, nil)
	e.eventually("A's backlog under way", func() bool { return e.completed("m_a") > 0 })
	e.publish("m_b", []byte(`{"merchant_id":`), "", map[string]string{"X-Case": "malformed"})
	e.publish("m_b", []byte(`{"merchant_id":"m_b","idempotency_key":"b-card","amount":100,"currency":"usd","payment_method":"pm_card_visa","description":"4111 1111 1111 1111"}`), "",
		map[string]string{"X-Case": "card"})
	e.publish("m_b", body("m_b", "b-good", 100), "", nil)
	e.eventually("B's good payment charged", func() bool { return e.completed("m_b") == 1 })
	if a := e.completed("m_a"); a >= nA {
		t.Fatalf("B's payment charged only after A's backlog (%d)", a)
	}
	e.eventually("A's backlog drained", func() bool { return e.completed("m_a") == nA })
	e.quiescent()
	e.eventually("both letters filed", func() bool { return len(e.deadLetters()) >= 2 })
	byCase := map[string]int{}
	for _, m := range e.deadLetters() {
		p, err := stream.ParseDeadLetter(m.Header)
		if err != nil {
			t.Fatal(err)
		}
		byCase[m.Header.Get("X-Case")+":"+p.Reason]++
	}
	if len(byCase) != 2 || byCase["malformed:malformed_json"] != 1 || byCase["card:card_data"] != 1 {
		t.Fatalf("dead letters by case and reason: %v, want one malformed_json and one card_data", byCase)
	}
	for _, m := range e.streamMessages(e.cfg.Stream.Name) {
		if strings.Contains(string(m.Data), "4111") {
			t.Fatalf("the card number's original is still in the payments stream (seq %d)", m.Sequence)
		}
	}
	if e.charges("m_b", "b-good") != 1 {
		t.Fatal("b-good not charged once")
	}
}

// TestLaneWorkerStoppedHoldingMessage: the worker that fetched B's
// payment from B's lane stops while the payment's provider call hangs;
// the payment is still charged exactly once, by the other worker, through
// the lane's redelivery or the shared consumer's delivery.
func TestLaneWorkerStoppedHoldingMessage(t *testing.T) {
	t.Parallel()
	e, charger := laneEnv(t)
	e.cfg.DrainTimeout = 200 * time.Millisecond
	e.waitStreamsCreate()
	const nA = 400
	for i := range nA {
		e.publish("m_a", body("m_a", fmt.Sprintf("a-%d", i), 100), "", nil)
	}
	hung := make(chan struct{}, 1)
	stop1 := e.run("w1", e.store, hangOn{Charger: charger, key: "b-held", hung: hung}, nil)
	e.eventually("A's backlog under way", func() bool { return e.completed("m_a") > 0 })
	e.publish("m_b", body("m_b", "b-held", 100), "", nil)
	<-hung
	stop1()
	e.run("w2", e.store, charger, nil)
	e.eventually("B's payment charged", func() bool { return e.completed("m_b") == 1 })
	e.eventually("A's backlog drained", func() bool { return e.completed("m_a") == nA })
	e.quiescent()
	if n := e.charges("m_b", "b-held"); n != 1 {
		t.Fatalf("b-held charged %d times", n)
	}
	if dl := e.deadLetters(); len(dl) != 0 {
		t.Fatalf("%d dead letters", len(dl))
	}
}

// hangOn hangs every charge of key until its context ends (the worker
// stopping), telling hung when the first starts.
type hangOn struct {
	consumer.Charger
	key  string
	hung chan struct{}
}

func (h hangOn) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	if req.IdempotencyKey != h.key {
		return h.Charger.Charge(ctx, req)
	}
	select {
	case h.hung <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return nil, &provider.Error{Class: provider.ClassUnknown, Err: ctx.Err()}
}

// lanePollForTest is longer than a lane fetcher's poll (100 ms).
const lanePollForTest = 150 * time.Millisecond

// heldMerchant holds the charges of one merchant until release is closed.
type heldMerchant struct {
	consumer.Charger
	merchant string
	release  chan struct{}
}

func (h heldMerchant) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	if req.MerchantID == h.merchant {
		select {
		case <-h.release:
		case <-ctx.Done():
			return nil, &provider.Error{Class: provider.ClassRetryable, Err: ctx.Err()}
		}
	}
	return h.Charger.Charge(ctx, req)
}

// TestLaneSharedBetweenWorkers: merchant B's 100 payments, behind A's
// backlog, reach the workers through B's lane, whose window holds 64 in
// work. With B's charges held, the first worker claims half of that
// window and no more; a second worker started then claims the other half:
// B's payments are spread over the workers, each serving B in turn within
// its part of the fleet's rate, rather than one worker holding B's whole
// line while the other serves only A. Once released, every payment is
// charged once.
func TestLaneSharedBetweenWorkers(t *testing.T) {
	t.Parallel()
	e, charger := laneEnv(t)
	e.waitStreamsCreate()
	release := make(chan struct{})
	held := heldMerchant{Charger: charger, merchant: "m_b", release: release}
	const nA, nB = 800, 100
	for i := range nA {
		e.publish("m_a", body("m_a", fmt.Sprintf("a-%d", i), 100), "", nil)
	}
	e.run("w1", e.store, held, nil)
	e.eventually("A's backlog under way", func() bool { return e.completed("m_a") > 0 })
	for i := range nB {
		e.publish("m_b", body("m_b", fmt.Sprintf("b-%d", i), 100), "", nil)
	}
	byHolder := func() map[string]int {
		rows, err := e.pool.Query(e.ctx, `SELECT locked_by, count(*) FROM idempotency_keys
			WHERE merchant_id = 'm_b' AND status = 'pending' GROUP BY locked_by`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		got := map[string]int{}
		for rows.Next() {
			var holder string
			var n int
			if err := rows.Scan(&holder, &n); err != nil {
				t.Fatal(err)
			}
			got[holder] = n
		}
		return got
	}
	var got map[string]int
	half := func() bool {
		got = byHolder()
		for _, n := range got {
			if n > 32 {
				t.Fatalf("B's payments claimed by holder: %v: one worker holds more than half of the lane's 64", got)
			}
		}
		return got["w1"] == 32
	}
	e.eventually("the first worker holds half of B's lane window", half)
	// It takes no more while B's charges are held.
	for range 10 {
		time.Sleep(2 * lanePollForTest)
		half()
	}
	e.run("w2", e.store, held, nil)
	e.eventually("the second worker holds the other half", func() bool { return half() && got["w2"] == 32 })
	close(release)
	e.eventually("all charged", func() bool { return e.completed("m_a") == nA && e.completed("m_b") == nB })
	e.quiescent()
	for i := range nB {
		if n := e.charges("m_b", fmt.Sprintf("b-%d", i)); n != 1 {
			t.Fatalf("b-%d charged %d times", i, n)
		}
	}
}
