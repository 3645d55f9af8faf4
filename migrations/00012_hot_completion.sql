-- +goose Up
-- Rows that cost less (issue 16): the completion becomes a HOT update.
--
-- PostgreSQL 15 makes an UPDATE heap-only (no new entry in any index, the
-- new version on the same page) only when no column that any index uses
-- (as a key, in an expression or in a partial index's predicate, BRIN
-- included) changes, and the new version fits on the page. Until now
-- `status` sat in the predicates of idempotency_keys_pending_lease and
-- idempotency_keys_finished_expiry and `locked_until`/`expires_at` were
-- their keys, so every completion (and every heartbeat and re-acquire)
-- wrote a new version elsewhere plus new entries in every index.
--
-- After this migration the only indexes of idempotency_keys are on columns
-- that never change after the claim:
--   * the primary key (merchant_id, idempotency_key);
--   * idempotency_keys_created (created_at), the purge's scan: a row's
--     expires_at is never earlier than created_at + the retention it was
--     written with (claim, re-acquire and completion all set it to at least
--     now + retention), so the purge walks created_at up to now - retention
--     and filters on status and expires_at.
-- The reconciler's scan of pending rows, which needs the rows whose status
-- is pending, is served by pending_keys: one small row per key that is
-- pending, inserted by the statements that make a key pending (claim,
-- re-acquire, parking a failed key for a lookup) and deleted by those that
-- finish it (completion, fail, a lookup that proves nothing was charged), in
-- the same statement, under the key row's lock. Only rows in flight or
-- stuck are in it, so it stays small however large the key table grows; it
-- is a set of names, not a second copy of the state: every reader joins it
-- to idempotency_keys and tests the key row's own status.
CREATE TABLE pending_keys (
    merchant_id     text NOT NULL,
    idempotency_key text NOT NULL,
    PRIMARY KEY (merchant_id, idempotency_key)
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000,
        autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 5000);

INSERT INTO pending_keys (merchant_id, idempotency_key)
    SELECT merchant_id, idempotency_key FROM idempotency_keys WHERE status = 'pending';

DROP INDEX idempotency_keys_pending_lease;
DROP INDEX idempotency_keys_finished_expiry;
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);

-- The completion adds the response, the charge id and completed_at to a
-- row whose neighbours on the page were claimed (and are completed) in the
-- same batches: the page must hold the old and the new versions of a whole
-- group commit's rows until it commits. A pending row is about 300 bytes, a
-- completed one with a PaymentIntent-sized response (700 bytes) about 1 kB:
-- measured with dedup's TestCompletionIsHeapOnlyUpdate (group commits of
-- 200), fillfactor 50 made 36 % of the completions HOT, 30 made 74 %, 20
-- made all of them. At rest a page then holds its completed rows about 75 %
-- full.
ALTER TABLE idempotency_keys SET (fillfactor = 20);

-- Regex CHECKs the store enforces before every write (dedup's
-- ClaimRequest.Validate: payment.ValidateMerchant, the trace id format)
-- cost 3.7 % of the claim; cheap length checks keep a bound on what raw SQL
-- could write. Every CHECK that carries the state machine stays.
ALTER TABLE idempotency_keys
    DROP CONSTRAINT merchant_id_format,
    ADD CONSTRAINT merchant_id_length CHECK (length(merchant_id) BETWEEN 1 AND 64),
    DROP CONSTRAINT trace_id_format,
    ADD CONSTRAINT trace_id_length CHECK (length(trace_id) = 32);

-- The stored response is only ever replayed as bytes: bytea, not jsonb
-- (parsing it cost 4 % of the completion). The store checks that it is
-- JSON before writing it.
ALTER TABLE idempotency_keys ALTER COLUMN response TYPE bytea USING convert_to(response::text, 'UTF8');

-- The ledger's surrogate key is never looked up: its index goes (the id
-- column stays, drawn from its identity sequence, as the tie-breaker of the
-- audit's and the reconciler's keyset pages). payments_created_at stays:
-- the audit pages and the stats windows read by it.
ALTER TABLE payments DROP CONSTRAINT payments_pkey;

-- settle_payment (00011) writes the key row's response: now bytea.
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %I.settle_payment(p_merchant text, p_key text, p_charge_id text, p_status text,
        p_response_status integer, p_response jsonb, p_now timestamptz)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = %I, pg_temp -- this schema's tables only, never a caller's temporary ones
AS $body$
DECLARE
    n bigint;
BEGIN
    IF p_status IS NULL OR p_status NOT IN ('succeeded', 'failed') THEN
        RAISE EXCEPTION 'paydedup: settle_payment: status %% is neither succeeded nor failed', p_status
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_charge_id IS NULL OR p_response IS NULL OR p_response_status IS NULL OR p_response_status NOT BETWEEN 100 AND 599 THEN
        RAISE EXCEPTION 'paydedup: settle_payment needs the charge id, a response and its HTTP status'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH settled AS (
        UPDATE payments SET status = p_status, settled_at = coalesce(p_now, now())
        WHERE merchant_id = p_merchant AND idempotency_key = p_key AND charge_id = p_charge_id AND status = 'processing'
        RETURNING merchant_id, idempotency_key, charge_id
    ), key_row AS (
        UPDATE idempotency_keys k SET response_status = p_response_status, response = convert_to(p_response::text, 'UTF8'),
            updated_at = coalesce(p_now, now())
        FROM settled s
        WHERE k.merchant_id = s.merchant_id AND k.idempotency_key = s.idempotency_key
          AND k.status = 'completed' AND k.charge_id = s.charge_id
        RETURNING 1
    )
    SELECT count(*) INTO n FROM settled;
    RETURN n > 0;
END
$body$
$f$, s, s);
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('GRANT SELECT, INSERT, DELETE ON TABLE %I.pending_keys TO paydedup_worker', s);
    END IF;
    -- The gateway reads the store's figures (Stats), as it reads the keys.
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_gateway') THEN
        EXECUTE format('GRANT SELECT ON TABLE %I.pending_keys TO paydedup_gateway', s);
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Destroys no rows: pending_keys only names rows that idempotency_keys
-- holds, and the responses go back to jsonb (they were JSON when written).
-- +goose StatementBegin
DO $$
DECLARE
    s text := current_schema();
BEGIN
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %I.settle_payment(p_merchant text, p_key text, p_charge_id text, p_status text,
        p_response_status integer, p_response jsonb, p_now timestamptz)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = %I, pg_temp
AS $body$
DECLARE
    n bigint;
BEGIN
    IF p_status IS NULL OR p_status NOT IN ('succeeded', 'failed') THEN
        RAISE EXCEPTION 'paydedup: settle_payment: status %% is neither succeeded nor failed', p_status
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_charge_id IS NULL OR p_response IS NULL OR p_response_status IS NULL OR p_response_status NOT BETWEEN 100 AND 599 THEN
        RAISE EXCEPTION 'paydedup: settle_payment needs the charge id, a response and its HTTP status'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH settled AS (
        UPDATE payments SET status = p_status, settled_at = coalesce(p_now, now())
        WHERE merchant_id = p_merchant AND idempotency_key = p_key AND charge_id = p_charge_id AND status = 'processing'
        RETURNING merchant_id, idempotency_key, charge_id
    ), key_row AS (
        UPDATE idempotency_keys k SET response_status = p_response_status, response = p_response, updated_at = coalesce(p_now, now())
        FROM settled s
        WHERE k.merchant_id = s.merchant_id AND k.idempotency_key = s.idempotency_key
          AND k.status = 'completed' AND k.charge_id = s.charge_id
        RETURNING 1
    )
    SELECT count(*) INTO n FROM settled;
    RETURN n > 0;
END
$body$
$f$, s, s);
END
$$;
-- +goose StatementEnd
ALTER TABLE payments ADD CONSTRAINT payments_pkey PRIMARY KEY (id);
ALTER TABLE idempotency_keys ALTER COLUMN response TYPE jsonb USING convert_from(response, 'UTF8')::jsonb;
ALTER TABLE idempotency_keys
    DROP CONSTRAINT trace_id_length,
    ADD CONSTRAINT trace_id_format CHECK (trace_id ~ '^[0-9a-f]{32}$'),
    DROP CONSTRAINT merchant_id_length,
    ADD CONSTRAINT merchant_id_format CHECK (merchant_id ~ '^[A-Za-z0-9_-]{1,64}$');
ALTER TABLE idempotency_keys RESET (fillfactor);
DROP INDEX idempotency_keys_created;
CREATE INDEX idempotency_keys_finished_expiry ON idempotency_keys (expires_at)
    WHERE status <> 'pending';
CREATE INDEX idempotency_keys_pending_lease ON idempotency_keys (locked_until)
    WHERE status = 'pending';
DROP TABLE pending_keys;
