package bench

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/paydedup/paydedup/lab/workload"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// DefaultPreloadKeysCap caps the key rows a preload writes by default:
// two days of keys at the bench's rate (billions) cannot be loaded here.
const DefaultPreloadKeysCap = 10_000_000

// preloadChunk is how many rows one preload statement writes: small
// enough to report progress and keep each transaction short.
const preloadChunk = 500_000

// KeyRetention is the key retention the preload lays its keys out over:
// the store's default, so every preloaded key is live and unexpired.
const KeyRetention = ledger.DefaultRetention

// Preload describes the finished payments written into a fresh schema
// before a run: Rows ledger rows, the newest Keys of them with their
// idempotency-key rows (created over the last KeyRetention), the older
// ones ledger only (their keys purged, as in production).
type Preload struct {
	Rows, Keys int
	Vacuum     bool // VACUUM (ANALYZE) afterwards, as a long-lived table is; else ANALYZE only
	Now        time.Time
	Progress   io.Writer // one line per chunk; nil for none
}

// PreloadStats is what a preload did and how long it took.
type PreloadStats struct {
	Rows, Keys       int
	LoadSeconds      float64 // the inserts
	VacuumSeconds    float64 // VACUUM (ANALYZE) or ANALYZE
	LedgerMB, KeysMB float64 // table and index sizes afterwards
	Partitions       int     // day partitions of idempotency_keys
}

// PreloadKey is the idempotency key of preloaded payment j: 32 hex digits
// after "p-", so the preloaded keys fall between the bench's own p-0 …
// p-(n-1) in the indexes' order rather than beside them, as new UUID keys
// fall among old ones.
func PreloadKey(j int) string {
	sum := md5.Sum([]byte("preload/" + strconv.Itoa(j)))
	return "p-" + hex.EncodeToString(sum[:])
}

// PreloadCommand is the command preloaded payment j was, as a client sent
// it: the fingerprint of its key row is this command's.
func PreloadCommand(j int) payment.Command {
	return payment.Command{MerchantID: workload.NumberedMerchant, IdempotencyKey: PreloadKey(j),
		Amount: int64(100 + j%1000), Currency: "usd", PaymentMethod: "pm_card_visa", Description: "bench"}
}

// preloadRows is payment j's columns, from j, the run's anchor ($4), the
// spacing in µs ($5) and the total ($6): payment j was created (N-j)
// spacings before the anchor, so the newest is the latest. The key, its
// provider key (ledger.ProviderKey) and its fingerprint (ledger.Fingerprint
// over payment.Command.AppendCanonical) are computed as the Go code does;
// TestPreloadedRowsAreReal checks they agree.
const preloadRows = `
WITH g AS (
    SELECT j, k, 100 + j % 1000 AS amount,
        'pi_' || substr(md5('charge/' || j), 1, 24) AS charge_id,
        $4::timestamptz - ($6::bigint - j) * $5::bigint * interval '1 microsecond' AS at,
        'pdk_' || encode(sha256(convert_to('paydedup/provider-key/v1', 'UTF8') || '\x00'::bytea || convert_to($1::text, 'UTF8')
            || '\x00'::bytea || convert_to(k, 'UTF8')), 'hex') AS provider_key
    FROM generate_series($2::bigint, $3::bigint - 1) AS j, LATERAL (SELECT 'p-' || md5('preload/' || j) AS k) AS key
)`

// preloadLedgerSQL writes ledger rows [$2, $3), oldest first, as the
// completion writes them (dedup's completeBatchSQL).
const preloadLedgerSQL = preloadRows + `
INSERT INTO payments (merchant_id, idempotency_key, provider_key, charge_id, status, amount, currency, created_at)
SELECT $1, k, provider_key, charge_id, 'succeeded', amount, 'usd', at + interval '40 milliseconds' FROM g ORDER BY j`

// preloadKeysSQL writes the completed key rows of payments [$2, $3): a
// claim's row (dedup's claimSQL) after a completion (completeBatchSQL)
// with a response shaped like the simulator's PaymentIntent, 40 ms after
// the claim; $7 is the retention.
const preloadKeysSQL = preloadRows + `
INSERT INTO idempotency_keys (merchant_id, idempotency_key, request_hash, status, provider_key, amount, currency, attempts,
    locked_by, locked_until, maybe_charged, key_window_start, charge_id, response_status, response, last_error,
    created_at, updated_at, completed_at, expires_at, trace_id, pending_since, lookup_failures, next_lookup_at)
SELECT $1, k,
    sha256(convert_to('paydedup.command.v1', 'UTF8')
        || int4send(octet_length($1::text)) || convert_to($1::text, 'UTF8')
        || int4send(octet_length(k)) || convert_to(k, 'UTF8')
        || int8send(amount::bigint)
        || int4send(3) || convert_to('usd', 'UTF8')
        || int4send(12) || convert_to('pm_card_visa', 'UTF8')
        || int4send(5) || convert_to('bench', 'UTF8')
        || int4send(0)),
    'completed', provider_key, amount, 'usd', 1,
    'bench-preload', NULL, false, at, charge_id, 200,
    convert_to(format('{"id":"%s","object":"payment_intent","amount":%s,"amount_received":%s,"capture_method":"automatic",'
        || '"confirmation_method":"automatic","created":%s,"currency":"usd","description":"bench","last_payment_error":null,'
        || '"latest_charge":"ch_%s","livemode":false,"metadata":{},"payment_method":"pm_card_visa",'
        || '"payment_method_types":["card"],"status":"succeeded"}',
        charge_id, amount, amount, extract(epoch FROM at)::bigint, substr(md5('ch/' || j), 1, 24)), 'UTF8'),
    NULL, at, at + interval '40 milliseconds', at + interval '40 milliseconds',
    at + interval '40 milliseconds' + $7::interval, NULL, at, 0, NULL
FROM g ORDER BY j`

// preloadPartitionsSQL lays the key table out as a deployment two days
// old has it: the old table (empty on a fresh schema, migration 00016)
// ends where the first preloaded day begins, and a day partition covers
// each day from there (maintain_key_partitions, migration 00013), so the
// claim probes as many partitions as in production. The day partitions
// take fillfactor 75 while loading: a completed row written at once is
// about three times the pending row that the claim writes at fillfactor
// 20 and the completion then grows in place (migration 00012), so 75 %
// is how full production leaves those pages; it goes back to 20 after.
const preloadPartitionsSQL = `
DO $$
DECLARE
    first timestamptz := date_trunc('day', (%[1]s::timestamptz - %[2]s::interval) AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    upper timestamptz;
    part  text;
BEGIN
    LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE;
    IF EXISTS (SELECT 1 FROM idempotency_keys) OR EXISTS (SELECT 1 FROM payments) THEN
        RAISE EXCEPTION 'bench preload: the schema already holds payments or keys';
    END IF;
    SELECT (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz INTO upper
    FROM pg_class c WHERE c.oid = 'idempotency_keys_unpartitioned'::regclass;
    IF upper IS NULL OR upper > first THEN
        ALTER TABLE idempotency_keys DETACH PARTITION idempotency_keys_unpartitioned;
        EXECUTE format('ALTER TABLE idempotency_keys ATTACH PARTITION idempotency_keys_unpartitioned FOR VALUES FROM (MINVALUE) TO (%%L)', first);
    END IF;
    PERFORM maintain_key_partitions(first, interval '100 years', 4);
    FOR part IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'idempotency_keys'::regclass AND c.relname ~ '^idempotency_keys_p[0-9]{8}$'
    LOOP
        EXECUTE format('ALTER TABLE %%I SET (fillfactor = %[3]d)', part);
    END LOOP;
END
$$`

// DB is the few calls a preload makes, as closures over a pool: pgx stays
// in the packages that own it (lab/layout).
type DB struct {
	Exec func(ctx context.Context, sql string, args ...any) error
	Scan func(ctx context.Context, sql string, dest []any, args ...any) error
}

// PreloadFill loads p into the migrated, empty schema db's search_path
// selects, with set-based INSERT … SELECT generate_series statements (the
// ledger's and the keys' in parallel, a chunk at a time), then ANALYZE,
// or VACUUM (ANALYZE) with p.Vacuum.
func PreloadFill(ctx context.Context, db DB, p Preload) (PreloadStats, error) {
	st := PreloadStats{Rows: p.Rows, Keys: min(p.Keys, p.Rows)}
	if p.Rows <= 0 {
		return st, nil
	}
	if p.Now.IsZero() {
		p.Now = time.Now()
	}
	say := func(format string, args ...any) {
		if p.Progress != nil {
			fmt.Fprintf(p.Progress, "bench: preload: "+format+"\n", args...)
		}
	}
	now := "'" + p.Now.UTC().Format(time.RFC3339Nano) + "'"
	retention := "'" + KeyRetention.String() + "'"
	if err := db.Exec(ctx, fmt.Sprintf(preloadPartitionsSQL, now, retention, 75)); err != nil {
		return st, fmt.Errorf("bench: preload: lay out the key partitions: %w", err)
	}
	// The newest st.Keys payments span the retention; older ones go back
	// at the same spacing.
	spread := max(st.Keys, 1)
	if st.Keys == 0 {
		spread = p.Rows
	}
	stepUS := max(KeyRetention.Microseconds()/int64(spread), 1)
	start := time.Now()
	errs := make(chan error, 2)
	load := func(what, sql string, lo, hi int, extra ...any) {
		for c := lo; c < hi; c += preloadChunk {
			e := min(c+preloadChunk, hi)
			args := append([]any{workload.NumberedMerchant, c, e, p.Now, stepUS, p.Rows}, extra...)
			if err := db.Exec(ctx, sql, args...); err != nil {
				errs <- fmt.Errorf("bench: preload %s rows %d..%d: %w", what, c, e, err)
				return
			}
			say("%s: %d of %d rows (%.0f s)", what, e-lo, hi-lo, time.Since(start).Seconds())
		}
		errs <- nil
	}
	// The preloaded payments are history: their outcome events were
	// relayed and purged long ago, so the ledger's outbox trigger
	// (migration 00022) stays off while they are written.
	if err := db.Exec(ctx, `ALTER TABLE payments DISABLE TRIGGER outcome_events_recorded`); err != nil {
		return st, fmt.Errorf("bench: preload: %w", err)
	}
	go load("ledger", preloadLedgerSQL, 0, p.Rows)
	go load("keys", preloadKeysSQL, p.Rows-st.Keys, p.Rows, KeyRetention)
	err1, err2 := <-errs, <-errs
	if err := db.Exec(ctx, `ALTER TABLE payments ENABLE TRIGGER outcome_events_recorded`); err != nil {
		return st, fmt.Errorf("bench: preload: %w", err)
	}
	if err := cmpErr(err1, err2); err != nil {
		return st, err
	}
	st.LoadSeconds = time.Since(start).Seconds()
	if err := db.Exec(ctx, fmt.Sprintf(`DO $$
DECLARE part text;
BEGIN
    FOR part IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'idempotency_keys'::regclass AND c.relname ~ '^idempotency_keys_p[0-9]{8}$'
    LOOP
        EXECUTE format('ALTER TABLE %%I SET (fillfactor = %d)', part);
    END LOOP;
END
$$`, 20)); err != nil {
		return st, fmt.Errorf("bench: preload: reset fillfactor: %w", err)
	}
	start = time.Now()
	maint := "ANALYZE payments, idempotency_keys"
	if p.Vacuum {
		maint = "VACUUM (ANALYZE) payments, idempotency_keys"
	}
	say("%s", maint)
	if err := db.Exec(ctx, maint); err != nil {
		return st, fmt.Errorf("bench: preload: %s: %w", maint, err)
	}
	st.VacuumSeconds = time.Since(start).Seconds()
	var ledgerBytes, keyBytes int64
	err := db.Scan(ctx, `SELECT pg_total_relation_size('payments'),
        (SELECT coalesce(sum(pg_total_relation_size(i.inhrelid)), 0) FROM pg_inherits i WHERE i.inhparent = 'idempotency_keys'::regclass),
        (SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'idempotency_keys'::regclass AND c.relname ~ '^idempotency_keys_p[0-9]{8}$')`, []any{&ledgerBytes, &keyBytes, &st.Partitions})
	if err != nil {
		return st, fmt.Errorf("bench: preload: table sizes: %w", err)
	}
	st.LedgerMB, st.KeysMB = float64(ledgerBytes)/(1<<20), float64(keyBytes)/(1<<20)
	say("%d ledger rows, %d key rows in %.0f s (+%.0f s %s); ledger %.0f MB, keys %.0f MB",
		st.Rows, st.Keys, st.LoadSeconds, st.VacuumSeconds, maint, st.LedgerMB, st.KeysMB)
	return st, nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
