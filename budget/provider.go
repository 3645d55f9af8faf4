package budget

import (
	"context"
	"sync"
	"time"

	"github.com/paydedup/paydedup/provider"
)

// Provider is a provider.Provider whose every call, charge or lookup,
// first takes a token of the budget, and whose 429s teach it.
type Provider struct {
	next provider.Provider
	b    *Budget
}

var _ provider.Provider = (*Provider)(nil)

// Wrap returns next behind the budget.
func (b *Budget) Wrap(next provider.Provider) *Provider { return &Provider{next: next, b: b} }

// waitKey is the context key of a waitRecorder.
type waitKey struct{}

// waitRecorder sums the time the budget held back the calls under one
// context: its waits for tokens, and from a refusal (no token before the
// deadline) to the caller's next call, the retry's backoff.
type waitRecorder struct {
	mu      sync.Mutex
	waited  time.Duration
	refused time.Time // the last refusal, until the next call
}

// WithWaitRecorder returns ctx with a recorder of the time the budget
// held back the calls under it (Waited reads it): a caller that times
// the provider's calls, as the call limit does, subtracts it, since a
// wait for the fleet's budget is not the provider's latency.
func WithWaitRecorder(ctx context.Context) context.Context {
	return context.WithValue(ctx, waitKey{}, new(waitRecorder))
}

// Waited is how long, in all, the budget held back the calls under ctx
// since WithWaitRecorder: the waits for a token, and the time from a
// refusal to the next call (a retry's backoff); 0 without a recorder.
func Waited(ctx context.Context) time.Duration {
	w, ok := ctx.Value(waitKey{}).(*waitRecorder)
	if !ok {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.waited
}

// record adds to ctx's recorder, if any, a wait from start to end, and
// the time since the last refusal; refused says this wait was one.
func record(ctx context.Context, start, end time.Time, refused bool) {
	w, ok := ctx.Value(waitKey{}).(*waitRecorder)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.refused.IsZero() {
		w.waited += max(0, start.Sub(w.refused))
		w.refused = time.Time{}
	}
	w.waited += end.Sub(start)
	if refused {
		w.refused = end
	}
}

// Charge implements provider.Provider.
func (p *Provider) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	if err := p.b.Wait(ctx, req.MerchantID); err != nil {
		return nil, err
	}
	p.b.metrics.requests.Inc()
	out, err := p.next.Charge(ctx, req)
	if err != nil {
		p.b.Observe(ctx, err)
	}
	return out, err
}

// Lookup implements provider.Provider.
func (p *Provider) Lookup(ctx context.Context, req provider.LookupRequest) (provider.LookupResult, error) {
	if err := p.b.Wait(ctx, req.MerchantID); err != nil {
		return provider.LookupResult{}, err
	}
	p.b.metrics.requests.Inc()
	res, err := p.next.Lookup(ctx, req)
	if err != nil {
		p.b.Observe(ctx, err)
	}
	return res, err
}

// refunder is the part of an adapter that refunds (provider/stripe's
// Client, the simulator's).
type refunder interface {
	Refund(ctx context.Context, req provider.RefundRequest) (*provider.RefundOutcome, error)
	LookupRefund(ctx context.Context, req provider.RefundLookupRequest) (provider.RefundLookupResult, error)
}

// errNoRefunds answers a refund through a provider that cannot make one:
// nothing was sent.
var errNoRefunds = &provider.Error{Class: provider.ClassRejected, Message: "the provider behind the budget does not refund"}

// Refund takes a token of the budget, as a charge does, and asks next to
// refund.
func (p *Provider) Refund(ctx context.Context, req provider.RefundRequest) (*provider.RefundOutcome, error) {
	r, ok := p.next.(refunder)
	if !ok {
		return nil, errNoRefunds
	}
	if err := p.b.Wait(ctx, req.MerchantID); err != nil {
		return nil, err
	}
	p.b.metrics.requests.Inc()
	out, err := r.Refund(ctx, req)
	if err != nil {
		p.b.Observe(ctx, err)
	}
	return out, err
}

// LookupRefund takes a token of the budget, as a lookup does, and asks
// next for the refund.
func (p *Provider) LookupRefund(ctx context.Context, req provider.RefundLookupRequest) (provider.RefundLookupResult, error) {
	r, ok := p.next.(refunder)
	if !ok {
		return provider.RefundLookupResult{}, errNoRefunds
	}
	if err := p.b.Wait(ctx, req.MerchantID); err != nil {
		return provider.RefundLookupResult{}, err
	}
	p.b.metrics.requests.Inc()
	res, err := r.LookupRefund(ctx, req)
	if err != nil {
		p.b.Observe(ctx, err)
	}
	return res, err
}

// intentMover is the part of an adapter that captures and cancels an
// authorization, and retrieves an intent (provider/stripe's Client).
type intentMover interface {
	Capture(ctx context.Context, req provider.CaptureRequest) (*provider.IntentOutcome, error)
	Cancel(ctx context.Context, req provider.CancelRequest) (*provider.IntentOutcome, error)
	RetrieveIntent(ctx context.Context, req provider.RetrieveIntentRequest) (*provider.IntentOutcome, error)
}

// errNoIntentOps answers a capture, a cancel or a retrieve through a
// provider that cannot make one: nothing was sent.
var errNoIntentOps = &provider.Error{Class: provider.ClassRejected, Message: "the provider behind the budget does not capture or cancel"}

// intentCall takes a token of the budget for merchant, as a charge does,
// and makes call through next.
func (p *Provider) intentCall(ctx context.Context, merchant string, call func(intentMover) (*provider.IntentOutcome, error)) (*provider.IntentOutcome, error) {
	m, ok := p.next.(intentMover)
	if !ok {
		return nil, errNoIntentOps
	}
	if err := p.b.Wait(ctx, merchant); err != nil {
		return nil, err
	}
	p.b.metrics.requests.Inc()
	out, err := call(m)
	if err != nil {
		p.b.Observe(ctx, err)
	}
	return out, err
}

// Capture takes a token of the budget and asks next to capture.
func (p *Provider) Capture(ctx context.Context, req provider.CaptureRequest) (*provider.IntentOutcome, error) {
	return p.intentCall(ctx, req.MerchantID, func(m intentMover) (*provider.IntentOutcome, error) { return m.Capture(ctx, req) })
}

// Cancel takes a token of the budget and asks next to cancel.
func (p *Provider) Cancel(ctx context.Context, req provider.CancelRequest) (*provider.IntentOutcome, error) {
	return p.intentCall(ctx, req.MerchantID, func(m intentMover) (*provider.IntentOutcome, error) { return m.Cancel(ctx, req) })
}

// RetrieveIntent takes a token of the budget, as a lookup does, and asks
// next for the intent.
func (p *Provider) RetrieveIntent(ctx context.Context, req provider.RetrieveIntentRequest) (*provider.IntentOutcome, error) {
	return p.intentCall(ctx, req.MerchantID, func(m intentMover) (*provider.IntentOutcome, error) { return m.RetrieveIntent(ctx, req) })
}
