package consumer

import (
	"time"

	"github.com/paydedup/paydedup/stream"
)

// Kind is what processing one message came to.
type Kind int

// Result kinds.
const (
	// Completed: charged now, outcome committed.
	Completed Kind = iota + 1
	// Declined: a definitive decline, committed; never retried.
	Declined
	// Duplicate: the key was already completed; the stored outcome stands.
	Duplicate
	// InFlight: another holder has the key's lease.
	InFlight
	// Retry: no outcome committed; safe to try again later (known not
	// charged, unknown outcome left pending, or a store/provider outage).
	Retry
	// DeadLetter: the message can never succeed as it is.
	DeadLetter
)

func (k Kind) String() string {
	switch k {
	case Completed:
		return "completed"
	case Declined:
		return "declined"
	case Duplicate:
		return "duplicate"
	case InFlight:
		return "in_flight"
	case Retry:
		return "retry"
	case DeadLetter:
		return "dead_letter"
	}
	return "unknown"
}

// Result is the outcome of processing one command.
type Result struct {
	Kind Kind
	// Delay is when retrying is worthwhile (InFlight, Retry); zero lets the
	// worker choose by the delivery count.
	Delay time.Duration
	// Reason is the dead-letter reason (DeadLetter).
	Reason string
	// Err says what went wrong, for logs and the dead letter's Dlq-Error.
	Err error
	// Attempt is the lease's attempt number when the key was claimed.
	Attempt int
	// pause is the cause of the worker's pause when an outage cut this
	// message's work short (see gate): the worker holds the message and
	// runs it again when the pause ends, instead of settling this result.
	pause string
	// unavailable: the provider call ended as the outage rule counts
	// (providerUnavailable). On the message's last delivery the worker
	// then asks the provider whether it is down (Worker.lastDelivery).
	unavailable bool
	// stopped: the worker's stop ended the payment's wait under its lease
	// (for a call slot or a rate limit), no fault of the message. On its
	// last delivery it is published again without counting a requeue
	// (Worker.requeueLast), as a held message is.
	stopped bool
}

// held reports whether the worker holds the message instead of settling
// r: only a retry that an outage cut short.
func (r Result) held() bool { return r.Kind == Retry && r.pause != "" }

// ActionKind is the fate of a message.
type ActionKind int

// Actions.
const (
	Ack ActionKind = iota + 1
	Nak
	DeadLetterTerm
	// Requeue: the last delivery ended without an outcome and the message
	// was published again as a new message (Worker.requeueLast), then
	// termed.
	Requeue
)

func (a ActionKind) String() string {
	switch a {
	case Ack:
		return "ack"
	case Nak:
		return "nak"
	case DeadLetterTerm:
		return "dead_letter"
	case Requeue:
		return "requeue"
	}
	return "unknown"
}

// Action is what the worker does with a message.
type Action struct {
	Kind   ActionKind
	Delay  time.Duration // for Nak, before jitter
	Reason string        // for DeadLetterTerm
}

// decide maps a result to the message's fate. It is the one place that does:
// committed outcomes and duplicates are acked; results that can never
// succeed are dead-lettered; everything else is nakked with a delay, except
// on the last allowed delivery, where it is dead-lettered as max_deliveries
// so it is never silently dropped by the server.
func decide(r Result, deliveries uint64, maxDeliver int, base, maxDelay time.Duration) Action {
	switch r.Kind {
	case Completed, Declined, Duplicate:
		return Action{Kind: Ack}
	case DeadLetter:
		return Action{Kind: DeadLetterTerm, Reason: r.Reason}
	}
	if lastDelivery(deliveries, maxDeliver) {
		return Action{Kind: DeadLetterTerm, Reason: stream.ReasonMaxDeliveries}
	}
	delay := r.Delay
	switch {
	case delay <= 0:
		delay = backoff(deliveries, base, maxDelay)
	case r.Kind == InFlight:
		// The holder usually finishes long before its lease ends: look
		// again soon, backing off per delivery, but never later than the
		// lease's end (when the key may be taken over).
		delay = min(delay, backoff(deliveries, base, maxDelay))
	}
	return Action{Kind: Nak, Delay: min(delay, maxDelay)}
}

// lastDelivery reports whether delivery number deliveries is the last that
// MaxDeliver allows (0: no limit): a retry then is dead-lettered.
func lastDelivery(deliveries uint64, maxDeliver int) bool {
	return maxDeliver > 0 && deliveries >= uint64(maxDeliver)
}

// backoff is base doubling per delivery, capped at maxDelay.
func backoff(deliveries uint64, base, maxDelay time.Duration) time.Duration {
	d := base
	for i := uint64(1); i < deliveries && d < maxDelay; i++ {
		d *= 2
	}
	return min(d, maxDelay)
}
