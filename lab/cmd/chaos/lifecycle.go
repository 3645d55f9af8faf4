package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/paydedup/paydedup/client"
)

// The money lifecycle (issue 56): besides paying, a share of the gateway
// clients' payments go on through the HTTP door under the same faults.
// Some are authorized (capture_method manual), then captured, all or
// part, then refunded once or twice; some authorizations are canceled;
// some charges are refunded, the last refund at times asking more than
// is left (the ledger's rules must refuse it, over_refundable). Each
// operation has its own Idempotency-Key, is sent by the Go client (which
// retries it with the same key and body, as it does a payment), and only
// once the payment it acts on is known settled (a GET says it is final),
// and the one before it on the payment is final. At the end
// checkOperations judges every operation, and the provider's ledger as a
// whole, against the simulator's records of its refunds, captures and
// cancels.

// lifePlan is what happens to a payment after it is paid.
type lifePlan int

const (
	planNone          lifePlan = iota
	planAuthCapture            // authorize, capture all or part, refund once or twice
	planAuthCancel             // authorize, cancel
	planChargeRefunds          // charge, refund once or twice
)

// The shares of the clients' valid payments that go on (about 12 %).
const (
	shareAuthCapture   = 0.05
	shareAuthCancel    = 0.03
	shareChargeRefunds = 0.04
)

// drawPlan draws the plan of a valid payment, and its operations' amounts
// later (planFor), from rng.
func drawPlan(rng *rand.Rand) lifePlan {
	switch x := rng.Float64(); {
	case x < shareAuthCapture:
		return planAuthCapture
	case x < shareAuthCapture+shareAuthCancel:
		return planAuthCancel
	case x < shareAuthCapture+shareAuthCancel+shareChargeRefunds:
		return planChargeRefunds
	}
	return planNone
}

// opLog is everything one operation's key was answered, in order, and
// what it was last shown as.
type opLog struct {
	kind    string // client.KindRefund, KindCapture or KindCancel
	key     string
	payKey  string
	asked   int64 // the amount asked; 0: the rest, the whole
	expect  string
	answers []answer
	last    *client.OperationResult // the last operation an answer showed
	gaveUp  bool                    // the client gave up on it without an answer
	err     string                  // the client's last error, for the report
}

// opTold folds an operation's answers: accepted (a 202, or an answer in
// flight), rejected (422 payment-rejected: the ledger's rules refused it,
// never sent) and its last shown status.
func (o *opLog) opTold() (accepted, rejected bool) {
	for _, a := range o.answers {
		switch {
		case a.status == 202, a.status == 200 && a.state != "" && a.state != string(client.StatusPublishUnknown):
			accepted = true
		case a.status == 201, a.status == 402:
			accepted = true
		case a.status == 422 && a.problem == "payment-rejected":
			rejected = true
		}
	}
	return accepted, rejected
}

// final reports the status the operation ended with, "" if none shown.
func (o *opLog) final() client.Status {
	if o.last != nil && o.last.Final() {
		return o.last.Status
	}
	return ""
}

func (o *opLog) told() string {
	seen := make([]string, len(o.answers))
	for i, a := range o.answers {
		seen[i] = a.label()
	}
	s := "answers: " + or(strings.Join(seen, ", "), "none")
	if o.err != "" {
		s += "; error: " + o.err
	}
	if o.gaveUp {
		s += "; the client gave up"
	}
	return s
}

// opsLog holds the run's operations.
type opsLog struct {
	mu    sync.Mutex
	all   []*opLog
	byKey map[string]*opLog
	wg    sync.WaitGroup // the lifecycles under way
	// Payments whose lifecycle ended early, by why.
	skipped map[string]int
}

func (l *opsLog) add(o *opLog) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byKey == nil {
		l.byKey = map[string]*opLog{}
	}
	l.all = append(l.all, o)
	l.byKey[o.key] = o
}

func (l *opsLog) get(key string) *opLog {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byKey[key]
}

func (l *opsLog) skip(why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.skipped == nil {
		l.skipped = map[string]int{}
	}
	l.skipped[why]++
}

// observeOp records one answer to an operation's key.
func (l *opsLog) observeOp(x client.Exchange, a answer) bool {
	o := l.get(x.Key)
	if o == nil {
		return false
	}
	if x.Operation != nil {
		op := *x.Operation
		l.mu.Lock()
		o.last = &op
		l.mu.Unlock()
	}
	l.mu.Lock()
	o.answers = append(o.answers, a)
	l.mu.Unlock()
	return true
}

// settledPayment polls the payment under key until a GET shows it final
// (succeeded, refunded in part or whole, authorized, declined), or the
// deadline passes.
func settledPayment(ctx context.Context, c *client.Client, key string, deadline time.Time) (client.Result, bool) {
	pause := newPollPause()
	for time.Now().Before(deadline) && ctx.Err() == nil {
		gctx, cancel := context.WithDeadline(ctx, deadline)
		r, err := c.Get(gctx, key)
		cancel()
		if err == nil && r.Final() {
			return r, true
		}
		pause(ctx)
	}
	return client.Result{}, false
}

// newPollPause returns a pause between polls: 300 ms, growing by half
// each time up to 2 s, so a payment or an operation long queued (an
// outage, a rate-limited provider) is not asked for more than it moves.
func newPollPause() func(context.Context) {
	d := 300 * time.Millisecond
	return func(ctx context.Context) {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
		d = min(d*3/2, 2*time.Second)
	}
}

// operate sends the operation o, then polls it (GET) until it is final or
// the deadline passes; it returns the final result, if one was shown.
func operate(ctx context.Context, c *client.Client, o *opLog, deadline time.Time) (client.OperationResult, bool) {
	octx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var r client.OperationResult
	var err error
	switch o.kind {
	case client.KindCapture:
		r, err = c.Capture(octx, o.payKey, o.key, o.asked)
	case client.KindCancel:
		r, err = c.Cancel(octx, o.payKey, o.key)
	default:
		r, err = c.Refund(octx, o.payKey, o.key, o.asked)
	}
	if err != nil {
		o.err = err.Error()
		if errors.Is(err, client.ErrOutcomeUnknown) || octx.Err() != nil {
			o.gaveUp = true
		}
		return r, false
	}
	pause := newPollPause()
	for !r.Final() && time.Now().Before(deadline) && ctx.Err() == nil {
		pause(ctx)
		gctx, cancel := context.WithDeadline(ctx, deadline)
		g, err := c.GetOperation(gctx, o.kind, o.key)
		cancel()
		if err == nil {
			r = g
		}
	}
	return r, r.Final()
}

// lifecycle carries the payment under payKey, told charged or accepted,
// through its plan: each operation once the payment is settled and the
// operation before it final.
func (h *harness) lifecycle(ctx context.Context, c *client.Client, ord gwOrder, payKey string) {
	l := &h.gw.ops
	rng := rand.New(rand.NewPCG(h.cfg.seed^0x11fe, uint64(ord.n)))
	step := func() time.Time { return time.Now().Add(h.cfg.clientGiveUp) }
	pay, ok := settledPayment(ctx, c, payKey, step())
	switch {
	case !ok:
		l.skip("payment_not_settled")
		return
	case ord.plan == planChargeRefunds && pay.Status != client.StatusSucceeded,
		ord.plan != planChargeRefunds && pay.Status != client.StatusAuthorized:
		l.skip("payment_" + string(pay.Status))
		return
	}
	newOp := func(kind string, i int, asked int64, expect string) *opLog {
		o := &opLog{kind: kind, key: fmt.Sprintf("%s-%s%d", payKey, kind, i), payKey: payKey, asked: asked, expect: expect}
		l.add(o)
		return o
	}
	received := pay.Amount
	switch ord.plan {
	case planAuthCancel:
		operate(ctx, c, newOp(client.KindCancel, 0, 0, ""), step())
		return
	case planAuthCapture:
		asked := int64(0) // all of it
		if rng.IntN(2) == 0 {
			asked = max(1, pay.Amount*int64(5+rng.IntN(5))/10)
		}
		r, ok := operate(ctx, c, newOp(client.KindCapture, 0, asked, ""), step())
		if !ok || r.Status != client.StatusSucceeded {
			l.skip("capture_not_succeeded")
			return
		}
		received = r.Amount
	}
	// One or two refunds; at times a last one asking for all it received,
	// more than is left (refused over_refundable by the ledger's rules).
	refunds := 1 + rng.IntN(2)
	over := rng.IntN(4) == 0
	left := received
	for i := range refunds {
		if _, ok := settledPayment(ctx, c, payKey, step()); !ok {
			l.skip("payment_not_settled")
			return
		}
		asked := int64(0) // the rest
		if i < refunds-1 || rng.IntN(2) == 0 {
			asked = max(1, left/int64(2+rng.IntN(3)))
		}
		r, ok := operate(ctx, c, newOp(client.KindRefund, i, asked, ""), step())
		if !ok {
			return
		}
		if r.Status == client.StatusSucceeded {
			left -= r.Amount
		}
	}
	if over && left < received {
		if _, ok := settledPayment(ctx, c, payKey, step()); ok {
			operate(ctx, c, newOp(client.KindRefund, refunds, received, "over_refundable"), step())
		}
	}
}

// askOpsFinal asks, once the run has settled, for each operation that
// was accepted and not yet shown final (GetOperation, side by side), as a
// client would to learn how it ended; for up to opsFinalRounds rounds,
// running `paydedup reconcile --once` between them when some stay in
// flight (an operation whose answer was lost waits for a lookup).
func (h *harness) askOpsFinal(ctx context.Context) error {
	l := &h.gw.ops
	clients := make([]*client.Client, h.cfg.gatewayClients)
	for i := range clients {
		c, err := h.newClient()
		if err != nil {
			return err
		}
		clients[i] = c
	}
	for round := 0; round < opsFinalRounds && ctx.Err() == nil; round++ {
		var pending []*opLog
		for _, o := range l.all {
			if accepted, rejected := o.opTold(); accepted && !rejected && o.final() == "" {
				pending = append(pending, o)
			}
		}
		if len(pending) == 0 {
			return nil
		}
		h.logf("operations: %d accepted and not yet final, asking (round %d)", len(pending), round+1)
		if round > 0 {
			if err := runOnce(ctx, "paydedup reconcile", filepath.Join(h.logs, "reconcile.log"), h.workerEnv(),
				h.bin, "reconcile", "--once", "--grace", "1s", "--search-lag", "1s"); err != nil {
				h.logf("%v", err)
			}
		}
		ch := make(chan *opLog)
		var wg sync.WaitGroup
		for _, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for o := range ch {
					gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					_, _ = c.GetOperation(gctx, o.kind, o.key) // recorded by observe
					cancel()
				}
			}()
		}
		for _, o := range pending {
			ch <- o
		}
		close(ch)
		wg.Wait()
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
	return nil
}

// opsFinalRounds bounds askOpsFinal (about 10 s a round).
const opsFinalRounds = 6

// checkOps reads the provider's ledger and judges the operations.
func (h *harness) checkOps(ctx context.Context) error {
	l, err := h.ledger(ctx)
	if err != nil {
		return err
	}
	g := h.gw
	g.opsVerdict = checkOperations(gwMerchant, g.ops.all, l)
	var skipped []string
	for _, why := range slices.Sorted(maps.Keys(g.ops.skipped)) {
		skipped = append(skipped, fmt.Sprintf("%s=%d", why, g.ops.skipped[why]))
	}
	h.logf("operations: provider refunds=%d captures=%d cancels=%d; lifecycles ended early: %s",
		len(l.Refunds), len(l.Captures), len(l.Cancels), or(strings.Join(skipped, " "), "none"))
	return nil
}

// reportOps prints the operations' violations and their line; it returns
// whether every promise held.
func (h *harness) reportOps() bool {
	v := h.gw.opsVerdict
	for i, b := range v.broken {
		if i == 50 {
			fmt.Fprintf(h.out, "chaos: VIOLATION operation: … and %d more\n", len(v.broken)-50)
			break
		}
		fmt.Fprintf(h.out, "chaos: VIOLATION operation: %s\n", b)
	}
	fmt.Fprintf(h.out, "chaos: ops: captures=%d refunds=%d cancels=%d succeeded=%d rejected=%d double=%d over_refunded=%d unended=%d broken=%d\n",
		v.captures, v.refunds, v.cancels, v.succeeded, v.rejected, v.double, v.overRefunded, v.unended, len(v.broken))
	return v.ok()
}

func (v opsVerdict) summary() string {
	return fmt.Sprintf(" ops_captures=%d ops_refunds=%d ops_cancels=%d ops_double=%d ops_over_refunded=%d ops_unended=%d",
		v.captures, v.refunds, v.cancels, v.double, v.overRefunded, v.unended)
}
