package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Pauses after the provider refuses the API key: the first, doubling on
// each refusal in a row up to the longest.
const (
	AuthPauseFirst   = 5 * time.Second
	AuthPauseLongest = 5 * time.Minute
)

// ErrProviderUnauthorized is the readiness error while the provider refuses
// the worker's API key.
var ErrProviderUnauthorized = errors.New("provider refused the API key")

// authGate remembers that the provider refused the API key (401/403): until
// the pause ends the worker fetches nothing, and one answer under the key
// that is not a refusal opens it again.
type authGate struct {
	mu      sync.Mutex
	refusal error
	until   time.Time
	streak  int
}

// refused records a refusal and returns how long to pause.
func (g *authGate) refused(err error) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	pause := AuthPauseFirst
	for range min(g.streak, 10) {
		pause = min(2*pause, AuthPauseLongest)
	}
	g.streak++
	g.refusal = err
	g.until = time.Now().Add(pause)
	return pause
}

// accepted records an answer that was not a refusal.
func (g *authGate) accepted() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.refusal, g.streak, g.until = nil, 0, time.Time{}
}

// pausedFor is how long the worker must still wait before it fetches.
func (g *authGate) pausedFor() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return time.Until(g.until)
}

// ProviderAuthorized is a readiness check: an error wrapping
// ErrProviderUnauthorized while the last provider answer refused the API key
// (the worker then stops consuming and tries again after a pause).
func (p *Processor) ProviderAuthorized(context.Context) error {
	p.auth.mu.Lock()
	defer p.auth.mu.Unlock()
	if p.auth.refusal == nil {
		return nil
	}
	return fmt.Errorf("%w (%d in a row; next try after %s): %v", ErrProviderUnauthorized, p.auth.streak,
		p.auth.until.UTC().Format(time.RFC3339), p.auth.refusal)
}
