// Package stripesim is a Stripe-compatible payment provider for tests, demos
// and the benchmark: a [Simulator], an http.Handler serving the subset of
// Stripe's v1 API that paydedup uses (payment intents with idempotency keys,
// retrieve, search) with injected [Faults] and a [Ledger] of what it charged,
// and a [Client] that calls the same simulator in-process, without HTTP, as
// the Stripe adapter would over HTTP. It uses only the public API of
// package provider.
package stripesim
