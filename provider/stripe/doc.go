// Package stripe is the Stripe adapter: a [Client] that implements
// provider.Provider on Stripe's PaymentIntents API through stripe-go, the one
// package that imports it. It charges with confirm=true under the caller's
// provider idempotency key, maps every answer to a provider.Outcome or a
// classified *provider.Error, and looks a key up by metadata search
// ([SearchQuery]). It never retries by itself; provider.ChargeWithRetry and
// the worker do.
package stripe
