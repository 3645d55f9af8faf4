package budget

import (
	"context"

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

// Charge implements provider.Provider.
func (p *Provider) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	if err := p.b.Wait(ctx); err != nil {
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
	if err := p.b.Wait(ctx); err != nil {
		return provider.LookupResult{}, err
	}
	p.b.metrics.requests.Inc()
	res, err := p.next.Lookup(ctx, req)
	if err != nil {
		p.b.Observe(ctx, err)
	}
	return res, err
}
