// Package provider owns the contract between paydedup and a payment provider:
// the [Provider] interface with its request and outcome types, the
// classification of every failure into a [Class], the sentinel errors, and a
// retry helper ([ChargeWithRetry]) built on backoff/v4. It imports no
// provider's client library: the Stripe adapter is provider/stripe (on
// stripe-go), and a Stripe-compatible simulator with fault injection, for
// tests, demos and the benchmark, is lab/stripesim.
//
// # The provider contract
//
// A charge is always sent with a provider idempotency key
// ([ChargeRequest.ProviderKey]) that the caller derived from its own key and
// persisted before the first call. The provider remembers the first response
// it produced for a key and replays it, byte for byte, to every later request
// with the same key and the same parameters; that is what makes a blind retry
// safe. The provider keeps a key for a limited window (Stripe: at least 24 h);
// after it, the same key is a new request and can charge again, so callers must
// not retry blind once the window may have passed: they ask [Provider.Lookup]
// instead.
//
// [Provider.Charge] returns either a definitive [Outcome] (charged, or declined:
// a decline is an outcome, not an error) or an [*Error] carrying a [Class]:
//
//   - [ClassUnknown] (“unknown_outcome”): the provider may have charged —
//     timeouts, a connection dropped after the request was written, 5xx, a
//     409 idempotency_key_in_use or a lock_timeout (another request under the
//     same provider key is running and can charge; it may be net/http's own
//     resend of our request), or a "not executed" answer to a copy that
//     net/http resent after writing an earlier one. The caller must keep the
//     key pending and re-call with the same provider key (the provider
//     replays) or resolve it with a lookup. This is also the answer for
//     anything unrecognised, because it is the only safe one.
//   - [ClassRetryable] (“retryable”): the provider provably did not execute
//     the request and holds nothing under its key for it — a 429 rate limit,
//     another 4xx with a provider error body, connection refused or any
//     failure before the request left this process. Safe to retry later;
//     with ClassRejected and ClassUnauthorized, the only classes that let a
//     caller record "not charged".
//   - [ClassDeclined] (“declined”): a definitive business failure (a 402
//     card_error, whose decline_code or code is kept as the DeclineCode).
//     Charge reports it as an Outcome with Declined set, to be stored and
//     replayed like a success.
//   - [ClassMismatch] (“idempotency_mismatch”): the provider saw this key with
//     other parameters (idempotency_error), or the request cannot be sent as
//     it is. It is a bug and is never retried.
//   - [ClassRejected] (“rejected”): the provider refused our request (a 400
//     invalid_request_error other than idempotency_error, or a 404 on
//     create). Not charged, not the customer's decline: the request or the
//     account is wrong and a person must look.
//   - [ClassUnauthorized] (“unauthorized”): a 401 or 403, the API key is
//     bad or revoked. Not charged; every call fails alike until the key is
//     fixed, so the caller stops calling for a while rather than fail each
//     payment.
//
// An Outcome is charged, declined or Processing. Stripe's PaymentIntent
// statuses map to them so: succeeded (and requires_capture) is charged;
// processing (asynchronous methods such as bank debits) is Processing: money
// may still move, the key is settled and only a lookup by the intent's id
// tells how it ended; requires_payment_method, canceled and
// requires_confirmation are declined; requires_action (the customer must
// authenticate, only on-session: off-session Stripe answers a 402
// authentication_required) is canceled through the API under [CancelKey]
// and then declined with [DeclineAuthenticationRequired]; if that cancel
// fails the answer is ClassUnknown, never a decline.
//
// [Provider.Lookup] asks, without charging, what happened under a key. Stripe's
// search is eventually consistent (new objects usually appear within a
// minute), so a not-found answer is only evidence: the caller decides how long
// it must persist before it treats the key as never charged. A search hit
// counts only when its metadata, amount and currency are the row's
// ([CheckIntent]); it is then retrieved by id before its status is believed.
// An intent that is not the row's is reported as ClassUnknown wrapping
// [ErrForeignIntent], so a row is never completed from someone else's
// intent.
//
// # After the charge
//
// A charge sent with [ChargeRequest.ManualCapture] authorizes: the Outcome
// is [Outcome.Authorized] (Stripe's requires_capture), money held, not
// moved. Capture ([CaptureRequest]), cancel ([CancelRequest]) and refund
// ([RefundRequest]) each go under a provider key of their own and answer
// in the same classes, a definitive no being an outcome with Refused set
// ([Rejection.Refusal], [RefusalCodes]). Their lookups never act: a
// capture or a cancel is read back from the intent ([IntentOutcome]), a
// refund is found by its metadata among the payment's refunds
// ([RefundVerdict]). The interfaces are declared by the packages that
// call them.
package provider
