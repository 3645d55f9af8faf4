package ledger

import "sync"

// Subscription receives a value on C (buffered, coalescing) each time its
// key may have completed: a hint to re-read the key, never its outcome.
// Close it when done. A store's notifier makes one with NewSubscription
// and sends on it with Wake.
type Subscription struct {
	C <-chan struct{}

	c           chan struct{}
	unsubscribe func(*Subscription)
	once        sync.Once
}

// NewSubscription returns a subscription whose Close calls unsubscribe,
// once.
func NewSubscription(unsubscribe func(*Subscription)) *Subscription {
	c := make(chan struct{}, 1)
	return &Subscription{C: c, c: c, unsubscribe: unsubscribe}
}

// Close unsubscribes. It is safe to call more than once.
func (s *Subscription) Close() { s.once.Do(func() { s.unsubscribe(s) }) }

// Wake sends on C, unless a wake is already pending.
func (s *Subscription) Wake() {
	select {
	case s.c <- struct{}{}:
	default: // a wake is already pending
	}
}
