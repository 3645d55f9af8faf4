// Package provider owns the contract between paydedup and a payment provider:
// the [Provider] interface with its request and outcome types, the
// classification of every failure into a [Class], the sentinel errors, and a
// retry helper ([ChargeWithRetry]) built on backoff/v4. It imports no
// provider's client library: the Stripe adapter is provider/stripe (on
// stripe-go), and a Stripe-compatible simulator with fault injection, for
// tests, demos and the benchmark, is provider/stripesim.
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
//     401/403, another 4xx with a provider error body, connection refused or
//     any failure before the request left this process. Safe to retry
//     later; only this class lets a caller record "not charged".
//   - [ClassDeclined] (“declined”): a definitive business failure (card_error,
//     invalid_request_error on the parameters). Charge reports it as an
//     Outcome with Declined set, to be stored and replayed like a success.
//   - [ClassMismatch] (“idempotency_mismatch”): the provider saw this key with
//     other parameters (idempotency_error), or the request cannot be sent as
//     it is. It is a bug and is never retried.
//
// [Provider.Lookup] asks, without charging, what happened under a key. Stripe's
// search is eventually consistent (new objects usually appear within a
// minute), so a not-found answer is only evidence: the caller decides how long
// it must persist before it treats the key as never charged.
package provider
