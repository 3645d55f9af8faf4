// Package client is paydedup's Go client: it keeps the client contract
// (docs/clients.md) so that the code that pays does not have to.
//
// A Client speaks to the HTTP door (`paydedup gateway`). It takes the
// caller's idempotency key and makes and stores none itself: make one key
// per payment (a UUID), store it with the order before the first call, and
// give it to every call about that payment, also after a restart.
//
//	c, err := client.New("https://pay.example.com", apiKey)
//	res, err := c.Create(ctx, order.PaymentKey, client.Payment{Amount: 1999, Currency: "usd", PaymentMethod: "pm_card_visa"})
//	res, err = c.Wait(ctx, order.PaymentKey) // the outcome, once a worker charged it
//
// Create sends the payment and retries, with the same key and the same
// body, every answer that may have been accepted (a timeout, a lost
// connection, an answer that is not the gateway's, 503
// publish-outcome-unknown) and every answer that asks to come back
// (429, 503 and 500 with their Retry-After, which it honours), for at most
// RetryFor or until ctx ends. It never sends a payment under another key.
// When it gives up after an answer that may have been accepted, its error
// is ErrOutcomeUnknown: the payment may still be charged, so keep the key
// and call Create again later with the same payment, never a new key. The
// Client remembers such a key: a later call with it that ends on an answer
// saying "nothing accepted" (503 unavailable, 429, 500) is ErrOutcomeUnknown
// too, until a Get answers 404 not-accepted.
//
// Each answer becomes a Result (queued, processing, retrying,
// waiting_for_operator with its Reason, succeeded with its ChargeID,
// declined) or an error: a *Problem for the gateway's refusals, which
// errors.Is matches against ErrKeyReused, ErrCardData, ErrInvalidRequest,
// ErrUnauthenticated, ErrNotFound, ErrNotAccepted and ErrRejected.
//
// WithObserver shows the caller every request a Client sends and what came
// back, the answers it retries included: for a log or an audit of what the
// gateway said.
//
// A Client remembers, for its whole life, the fingerprint of the payment
// each key was first sent with, and refuses (ErrKeyReused, before sending
// anything) to send another payment under the same key: that is a bug in
// the caller, and the gateway would refuse it too (422). It is a map of one
// small entry per key; Forget drops a key whose payment is final.
//
// Refund, Capture and Cancel act on a payment (named by its key), each
// under its own idempotency key, by Create's contract: the same retries
// with the same key and body, ErrOutcomeUnknown when it gives up after an
// answer that may have been accepted, and the key bound to the operation,
// its payment and its amount (another is ErrKeyReused, before anything is
// sent). Each returns an OperationResult (queued, processing, succeeded,
// failed or refused with its Reason) or a *Problem: the ledger's refusal
// (over_refundable...) is ErrRejected with Problem.Reason. GetOperation
// reads one under its own key.
//
// A Publisher publishes payment commands straight on the payments stream
// (payments.requests.<merchant_id>) as the workers expect them: the
// Nats-Msg-Id <merchant_id>:<idempotency_key>, the PubAck awaited and
// checked, a lost PubAck retried with the same message id, and a publish
// the stream's duplicate window dropped as a copy of the same command
// reported as Published.Duplicate. FollowOutcomes follows a merchant's
// outcome events (payments.outcomes.<merchant_id>) in the stream's order,
// from the oldest kept or after a stored stream sequence; handle each
// event_id once.
package client
