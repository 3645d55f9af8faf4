// Package workload is the lab's one workload generator and one ledger
// verifier: the payments, duplicates, key reuses and malformed messages that
// demo, bench, publish --generate, the chaos harness and the end-to-end
// tests publish, deterministic by seed, and the judgement of a run against
// the provider's ledger and the store (double charges, lost payments, stuck
// rows). Every lab tool counts a double charge the same way, here.
package workload
