package main

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// kindPlanter records payments and their operations through the store,
// as the worker does, at the times its clock says.
type kindPlanter struct {
	t     *testing.T
	ctx   context.Context
	clk   *clock.Fake
	store *dedup.Store
}

func newKindPlanter(t *testing.T, dbURL string, at time.Time) *kindPlanter {
	t.Helper()
	pool, err := pg.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	clk := clock.NewFake(at)
	store, err := dedup.New(pool, dedup.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return &kindPlanter{t: t, ctx: context.Background(), clk: clk, store: store}
}

// payment claims a charge or an authorize for lease; done completes it
// (charged, or authorized).
func (p *kindPlanter) payment(kind, key string, amount int64, lease time.Duration, done bool) {
	p.t.Helper()
	c := &payment.Command{MerchantID: "m_1", IdempotencyKey: key, Amount: amount, Currency: "usd", PaymentMethod: "pm_card_visa", Kind: kind}
	res, err := p.store.Claim(p.ctx, "w", lease, ledger.NewClaimRequest(c))
	if err != nil || res.Lease == nil {
		p.t.Fatalf("claim %s: %v %+v", key, err, res)
	}
	if !done {
		return
	}
	comp := ledger.Completion{ChargeID: "pi_" + key, ResponseStatus: 200, Response: json.RawMessage(`{"status":"succeeded"}`)}
	if kind == payment.KindAuthorize {
		comp = ledger.Completion{ChargeID: "pi_" + key, Authorized: true, ResponseStatus: 200, Response: json.RawMessage(`{"status":"requires_capture"}`)}
	}
	if err := p.store.Complete(p.ctx, *res.Lease, comp); err != nil {
		p.t.Fatal(err)
	}
}

// op claims a capture or a cancel of pay for lease and leaves it as
// status says: pending, unknown (released), succeeded or refused.
func (p *kindPlanter) op(kind, key, pay string, amount int64, lease time.Duration, status string, received int64) {
	p.t.Helper()
	req := ledger.NewPaymentOpRequest(&payment.Command{MerchantID: "m_1", IdempotencyKey: key, PaymentKey: pay, Amount: amount, Kind: kind})
	res, err := p.store.ClaimPaymentOp(p.ctx, "w", lease, req)
	if err != nil || res.Lease == nil {
		p.t.Fatalf("claim %s %s: %v %+v", kind, key, err, res)
	}
	switch status {
	case ledger.OpUnknown:
		err = p.store.ReleasePaymentOp(p.ctx, *res.Lease, "timeout")
	case ledger.OpSucceeded:
		err = p.store.CompletePaymentOp(p.ctx, *res.Lease, ledger.PaymentOpCompletion{Status: ledger.OpSucceeded, AmountReceived: received,
			ResponseStatus: 200, Response: json.RawMessage(`{"status":"ok"}`)})
	case ledger.OpRefused:
		err = p.store.CompletePaymentOp(p.ctx, *res.Lease, ledger.PaymentOpCompletion{Status: ledger.OpRefused, Reason: "card_declined",
			ResponseStatus: 402, Response: json.RawMessage(`{"error":"declined"}`)})
	}
	if err != nil {
		p.t.Fatalf("%s %s %s: %v", kind, key, status, err)
	}
}

// refund claims a refund of pay for lease and leaves it as status says.
func (p *kindPlanter) refund(key, pay string, amount int64, lease time.Duration, status string) {
	p.t.Helper()
	req := ledger.NewRefundRequest(&payment.Command{MerchantID: "m_1", IdempotencyKey: key, PaymentKey: pay, Amount: amount, Kind: payment.KindRefund})
	res, err := p.store.ClaimRefund(p.ctx, "w", lease, req)
	if err != nil || res.Lease == nil {
		p.t.Fatalf("claim refund %s: %v %+v", key, err, res)
	}
	switch status {
	case ledger.RefundUnknown:
		err = p.store.ReleaseRefund(p.ctx, *res.Lease, "timeout")
	case ledger.RefundSucceeded, ledger.RefundProcessing, ledger.RefundFailed:
		err = p.store.CompleteRefund(p.ctx, *res.Lease, ledger.RefundCompletion{Status: status, RefundID: "re_" + key,
			ResponseStatus: 200, Response: json.RawMessage(`{"status":"` + status + `"}`)})
	case ledger.RefundRefused:
		err = p.store.CompleteRefund(p.ctx, *res.Lease, ledger.RefundCompletion{Status: status, Reason: "charge_disputed",
			ResponseStatus: 400, Response: json.RawMessage(`{"error":"charge_disputed"}`)})
	}
	if err != nil {
		p.t.Fatalf("refund %s %s: %v", key, status, err)
	}
}

// TestStatusCountsByKind: status counts each kind's rows by status (a
// charge's and an authorize's keys, refunds, captures, cancels), the
// stuck ones (an operation pending past its lease), each kind's dead
// letters, and the ledger's authorizations, in JSON and in the table.
func TestStatusCountsByKind(t *testing.T) {
	t.Parallel()
	dbURL := testenv.PostgresURL(t)
	w := newCLIWorld(t, dbURL, true)
	now := time.Now()
	p := newKindPlanter(t, dbURL, now.Add(-time.Hour))
	const short, long = time.Minute, 2 * time.Hour // short leases have run out by now
	p.payment(payment.KindAuthorize, "a-cap", 1000, short, true)
	p.op(payment.KindCapture, "cap-1", "a-cap", 600, short, ledger.OpSucceeded, 600)
	p.refund("ref-ok", "a-cap", 100, short, ledger.RefundSucceeded)
	p.refund("ref-stuck", "a-cap", 50, short, ledger.RefundPending)
	p.payment(payment.KindAuthorize, "a-can", 500, short, true)
	p.op(payment.KindCancel, "can-1", "a-can", 0, short, ledger.OpSucceeded, 0)
	p.payment(payment.KindAuthorize, "a-hang", 300, short, true)
	p.op(payment.KindCapture, "cap-stuck", "a-hang", 0, short, ledger.OpPending, 0)
	p.payment(payment.KindAuthorize, "a-unk", 300, short, true)
	p.op(payment.KindCapture, "cap-unk", "a-unk", 0, short, ledger.OpUnknown, 0)
	p.payment(payment.KindAuthorize, "a-ref", 300, short, true)
	p.op(payment.KindCapture, "cap-no", "a-ref", 0, short, ledger.OpRefused, 0)
	p.payment(payment.KindCharge, "c-1", 1000, short, true)
	p.refund("ref-unk", "c-1", 100, short, ledger.RefundUnknown)
	p.refund("ref-proc", "c-1", 100, short, ledger.RefundProcessing)
	p.refund("ref-no", "c-1", 100, short, ledger.RefundRefused)
	p.clk.Set(now.Add(-5 * time.Second))
	p.payment(payment.KindAuthorize, "a-live", 700, long, false)
	p.refund("ref-live", "c-1", 100, long, ledger.RefundPending)

	// A refund's command and a charge's, dead-lettered.
	for i, body := range []string{`{"merchant_id":"m_1","idempotency_key":"ref-dl","kind":"refund","payment_key":"c-1","amount":5}`,
		`{"merchant_id":"m_1","idempotency_key":"c-dl","amount":5,"currency":"usd"}`} {
		d := stream.Letter{Reason: stream.ReasonMaxDeliveries, Err: errors.New("x"), OrigSubject: w.cfg.SubjectPrefix + ".m_1", OrigStream: w.cfg.Name,
			OrigSeq: uint64(i + 1), Deliveries: 1, Header: nats.Header{}, Data: []byte(body), FailedAt: now}
		if _, err := w.js.PublishMsg(p.ctx, d.Msg(w.cfg)); err != nil {
			t.Fatal(err)
		}
	}

	out, errOut, err := w.run("", "status", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	var rep statusReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	one := uint64(1)
	zero := uint64(0)
	want := map[string]kindCounts{
		payment.KindCharge:    {ByStatus: map[string]int64{"pending": 0, "completed": 1, "failed": 0}, DeadLettered: &one},
		payment.KindAuthorize: {ByStatus: map[string]int64{"pending": 1, "completed": 5, "failed": 0}, DeadLettered: &zero},
		payment.KindCapture:   {ByStatus: map[string]int64{"pending": 1, "unknown": 1, "succeeded": 1, "refused": 1}, Stuck: 1, DeadLettered: &zero},
		payment.KindCancel:    {ByStatus: map[string]int64{"pending": 0, "unknown": 0, "succeeded": 1, "refused": 0}, DeadLettered: &zero},
		payment.KindRefund: {ByStatus: map[string]int64{"pending": 2, "unknown": 1, "processing": 1, "succeeded": 1, "failed": 0, "refused": 1},
			Stuck: 1, DeadLettered: &one},
	}
	got, _ := json.Marshal(rep.Kinds)
	wantJSON, _ := json.Marshal(want)
	if string(got) != string(wantJSON) {
		t.Errorf("kinds\n got %s\nwant %s", got, wantJSON)
	}
	if a := rep.Authorizations; a["authorized"] != 3 || a["captured"] != 1 || a["canceled"] != 1 {
		t.Errorf("authorizations %v, want 3 held, 1 captured, 1 canceled", a)
	}
	if dl := rep.DeadLetters; dl == nil || dl.ByKind["refund"] != 1 || dl.ByKind["charge"] != 1 || dl.KindsRead != 2 {
		t.Errorf("dead letters %+v", dl)
	}

	out, _, err = w.run("", "status")
	if err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{
		`(?m)^charge\s+pending 0, completed 1, failed 0\s+0\s+1$`,
		`(?m)^authorize\s+pending 1, completed 5, failed 0\s+0\s+0$`,
		`(?m)^capture\s+pending 1, unknown 1, succeeded 1, refused 1\s+1\s+0$`,
		`(?m)^cancel\s+pending 0, unknown 0, succeeded 1, refused 0\s+0\s+0$`,
		`(?m)^refund\s+pending 2, unknown 1, processing 1, succeeded 1, failed 0, refused 1\s+1\s+1$`,
		`(?m)^authorizations\s+authorized 3, captured 1, canceled 1`,
		`(?m)^by kind\s+charge 1, refund 1$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("status output does not match %q:\n%s", re, out)
		}
	}
}
