// Package dedup owns the Postgres idempotency store: one row per
// (merchant_id, idempotency_key) that records who may call the provider for
// it (a fenced lease), under which provider key, and what the outcome was.
// It is written in the words of package ledger (Record, Lease, ClaimRequest,
// ClaimResult, Completion, Payment, the sentinel errors), which holds them
// and the pure rules (ledger.Evaluate, ledger.CompletionOf) with no driver;
// dedup holds only the PostgreSQL.
//
// The store is the source of truth for "has this payment been charged". Its
// rules:
//
//   - A claim is committed in its own transaction before the provider is
//     called, so a crash after the call always leaves a row to find.
//   - Only the holder of the current lease (holder id and attempt number)
//     may heartbeat, complete, fail or release a row. A worker whose lease
//     expired and was re-acquired by another changes nothing: fencing.
//   - Completing writes the key's outcome and the ledger row in one
//     transaction.
//   - A row on which a provider call may have charged without us learning
//     the answer is marked maybe_charged; it never becomes `failed` until a
//     provider lookup proves nothing was charged.
//   - `failed` means provably nothing charged under the provider key: only
//     a provider answer that proves it, or a lookup, sets it (Fail keeps a
//     maybe_charged row pending; the schema refuses a failed maybe_charged
//     row).
//   - A row, pending or failed, whose key window (the provider's own
//     idempotency-key retention, counted from the first call under the key)
//     has passed is never handed out for a blind re-call: only a lookup may
//     resolve it, and only a lookup that proves nothing was charged starts
//     a fresh window.
//
// dedup knows nothing of HTTP, API keys or the gateway's intake: those are
// the gateway's store (gateway/pgstore) and httpidem's (httpidem/pgstore),
// on tables the same migrations create. One seam remains, a documented
// contract: when a key that has a gateway_intake row becomes completed,
// dedup announces it on CompletedChannel (see there), and the gateway's
// listener, which wakes the requests waiting on the key, consumes it.
//
// pgx is used only in the stores (here, gateway/pgstore, httpidem/pgstore,
// budget/pgstore) and internal/pg, which they share; its errors never leave
// the package: they wrap ledger's sentinels. cmd opens the pool
// (pg.Connect) and hands it to the stores it builds; the packages above
// (consumer, reconciler, gateway, audit, console) declare the interfaces
// they use in ledger's words and link no pgx (lab/layout's
// TestDriverStaysInItsStores).
package dedup

// CompletedChannel is the LISTEN/NOTIFY channel on which dedup announces,
// at commit, every idempotency_keys row that became completed and has a
// gateway_intake row (only the gateway's keys can have waiters). It is a
// contract with its listener (gateway/pgstore's Listener): the payload is
// JSON, {"s": schema, "m": merchant_id, "k": idempotency_key}, where schema
// is the one the tables live in, so that stores on other schemas of the
// same database ignore it. A row is announced at most once, by whichever
// path completes it: the group commit (CompleteBatch) sends its rows'
// notifications from its own statement (one probe of gateway_intake per
// row) and tells the row trigger of migrations 00003 and 00005 to skip them
// (the transaction-local setting paydedup.completions_notified); every
// other completion (Complete, the reconciler) is announced by that trigger.
// A listener must treat a notification as a hint to re-read the row, never
// as the outcome: notifications sent while it is not listening are lost.
const CompletedChannel = "paydedup_key_completed"
